"""PolicyCore's replica decisions (issue 12, item 3): a simulated spike through QoS and scaling,
the ScaleRequest on <p>.control.scale, its audit record and the desired-replicas gauge."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry

from graylane.histogram import LatencyHistogram
from graylane.metrics.controlside import PolicyMetrics
from graylane.policy_engine.audit_replay import verify
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.scale import ScalePolicy, ScaleReason
from graylane.policy_engine.logic.window import TelemetrySample
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    PrecisionPublication,
    QosAudit,
    ScaleAudit,
    ScalePublication,
)
from graylane.policy_engine.service import PolicyObserver
from graylane.policy_engine.state import VersionKey
from graylane.policy_engine.wire import records_of
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2, control_pb2

MODEL, VERSION = "gpt", "v1"
LAYOUT = TopicLayout(prefix="p")
CAPACITY = {"fp32": 8.0, "int8": 16.0}  # requests/s of one replica
QOS = QosPolicy(
    model=MODEL,
    version=VERSION,
    slo_p99_ms=20.0,
    ladder=("fp32", "int8"),
    sustain_s=2.0,
    min_dwell_s=3.0,
)
SCALE = ScalePolicy(max_replicas=3, out_dwell_s=5.0, cooldown_s=10.0, settle_s=2.0)


class Sim:
    """Workers that follow precision and scale requests; latency from load vs capacity."""

    def __init__(self, core: PolicyCore, warmup_ms: int = 3000) -> None:
        self.core = core
        self.warmup_ms = warmup_ms
        self.variant = "fp32"
        self.replicas = 1
        self.starting: list[int] = []  # when the asked-for replicas will serve
        self.outputs: list[object] = []
        self.owed = 0.0
        self.next_worker = 0

    def step(self, t: int, load_rps: float) -> None:
        while self.starting and self.starting[0] <= t:
            self.starting.pop(0)
            self.replicas += 1
        capacity = self.replicas * CAPACITY[self.variant]
        served = min(load_rps, capacity)
        slow = load_rps > 0.9 * capacity
        self.owed += served * 0.25
        for _ in range(int(self.owed)):  # one request per batch, round robin over the workers
            self.owed -= 1
            self.next_worker = (self.next_worker + 1) % self.replicas
            w, n = self.next_worker, 1
            h = LatencyHistogram()
            for _ in range(n):
                h.record(60.0 if slow else 3.0)
            self.core.on_telemetry(
                TelemetrySample(
                    model=MODEL,
                    version=VERSION,
                    variant=self.variant,
                    worker_id=f"w{w}",
                    completed_at_ms=t,
                    request_count=n,
                    error_count=0,
                    latency=h,
                )
            )
        if t % 1000:
            return
        for o in self.core.tick(t):
            self.outputs.append(o)
            if isinstance(o, PrecisionPublication):
                self.variant = o.decision.variant
            elif isinstance(o, ScalePublication):
                desired = o.decision.desired
                if desired > self.replicas + len(self.starting):
                    self.starting.append(t + self.warmup_ms)  # a new worker warms up
                elif desired < self.replicas:
                    self.replicas = desired


def elastic_run(
    spike_end_ms: int = 40_000, warmup_ms: int = 3000, qos: QosPolicy = QOS
) -> tuple[PolicyCore, Sim]:
    core = PolicyCore(window_ms=2000, step_ms=1000)
    core.set_scale_policy(SCALE)
    core.note_partitions({VersionKey(MODEL, VERSION): 2})
    core.on_command(Command(kind=CommandKind.SET_QOS_POLICY, model=MODEL, qos_policy=qos), 0)
    sim = Sim(core, warmup_ms)
    for t in range(0, 120_000, 250):
        spike = 10_000 <= t < spike_end_ms
        sim.step(t, 24.0 if spike else 3.0)
    return core, sim


def test_a_spike_steps_down_scales_out_then_scales_in_and_steps_back_up() -> None:
    core, sim = elastic_run()
    events = []
    for o in sim.outputs:
        if isinstance(o, PrecisionPublication):
            events.append(("variant", o.decision.variant))
        elif isinstance(o, ScalePublication):
            events.append(("replicas", o.decision.desired))
    # one rung down, then (still breaching at the floor) one more replica; the topic's
    # 2 partitions cap it at 2 although max_replicas is 3; after the spike both come back
    assert events[:2] == [("variant", "int8"), ("replicas", 2)]
    assert sorted(events[2:]) == [("replicas", 1), ("variant", "fp32")]
    assert sim.variant == "fp32" and sim.replicas == 1
    outs = [o for o in sim.outputs if isinstance(o, ScalePublication)]
    assert outs[0].decision.reason is ScaleReason.FLOOR_BREACH
    assert outs[1].decision.reason is ScaleReason.LOW_LOAD
    assert [o.epoch for o in outs] == [1, 2]
    assert core.scaling.states[VersionKey(MODEL, VERSION)].desired == 1
    # fp32 came back 2 s after the spike (calm sustained), one replica after the cooldown
    up = next(o for o in sim.outputs if isinstance(o, PrecisionPublication) and o.epoch == 2)
    assert up.decision.variant == "fp32" and up.decision.at_ms == 42_000
    assert outs[1].decision.at_ms == up.decision.at_ms + SCALE.cooldown_s * 1000


def test_with_calibrated_rungs_an_overload_scales_out_with_the_step_down() -> None:
    """24 rps on fp32's 8: even int8 (16) cannot carry it, so the replica is asked for
    at the step down, not after the floor's breach has been sustained."""
    calibrated = replace(QOS, rung_capacity_rps=tuple(CAPACITY.items()))
    _, sim = elastic_run(qos=calibrated)
    down = next(o for o in sim.outputs if isinstance(o, PrecisionPublication))
    out = next(o for o in sim.outputs if isinstance(o, ScalePublication))
    assert down.decision.variant == "int8"
    assert out.decision.reason is ScaleReason.OVERLOAD and out.decision.desired == 2
    assert out.decision.at_ms <= down.decision.at_ms + 1000
    assert "at the floor" in out.decision.detail
    _, late = elastic_run()  # no calibration: the floor's breach decides, later
    later = next(o for o in late.outputs if isinstance(o, ScalePublication))
    assert later.decision.reason is ScaleReason.FLOOR_BREACH
    assert later.decision.at_ms > out.decision.at_ms


def test_qos_waits_for_the_new_replica_before_stepping_up() -> None:
    # The spike ends right after the scale-out; the new worker takes 10 s to serve.
    _, sim = elastic_run(spike_end_ms=17_000, warmup_ms=10_000)
    out = next(o for o in sim.outputs if isinstance(o, ScalePublication))
    audits = [o.decision for o in sim.outputs if isinstance(o, QosAudit)]
    unsettled = [d for d in audits if d.rule is DecisionRule.SCALE_UNSETTLED]
    assert unsettled and "2 replicas asked for, 1 serving" in unsettled[0].reason
    up = next(d for d in audits if d.changed and d.variant == "fp32")
    assert up.at_ms >= out.decision.at_ms + 10_000  # not before the second worker serves

    # The hold replays from the audit record alone (the scale input is recorded with it).
    qos = [o for o in sim.outputs if isinstance(o, QosAudit)]
    records = [audit_pb2.AuditRecord.FromString(r.value) for r in records_of(qos, LAYOUT)]
    held = [r for r in records if r.rule == DecisionRule.SCALE_UNSETTLED]
    assert held and held[0].qos_scale_hold
    assert verify(records) == []
    held[0].qos_scale_hold = ""
    assert [m.field for m in verify(records)][:1] == ["decision_id"]  # replays as a step up


def test_scale_request_record_audit_and_gauge() -> None:
    _, sim = elastic_run()
    outputs = [o for o in sim.outputs if isinstance(o, ScalePublication | ScaleAudit)]
    layout = TopicLayout(prefix="p")
    records = records_of(outputs[:2], layout)  # type: ignore[arg-type]
    scale, audit = records
    assert (scale.topic, scale.key) == ("p.control.scale", b"gpt/v1")
    req = control_pb2.ScaleRequest.FromString(scale.value)
    assert (req.model, req.version, req.desired_replicas, req.epoch) == (MODEL, VERSION, 2, 1)
    assert req.current_replicas == 1 and req.reason == control_pb2.SCALE_REASON_FLOOR_BREACH
    assert req.decision_id and req.decided_at_unix_ms > 0 and "1 -> 2 replicas" in req.detail
    assert audit.topic == "p.audit" and audit.key == b"gpt"
    rec = audit_pb2.AuditRecord.FromString(audit.value)
    assert rec.kind == audit_pb2.DECISION_SCALE_CHANGE
    assert rec.rule == DecisionRule.SCALE_FLOOR_BREACH and rec.scale == req
    assert rec.decision_id == req.decision_id

    registry = CollectorRegistry()
    observer = PolicyObserver(PolicyMetrics.create(registry))
    observer.observe(outputs[:2])  # type: ignore[arg-type]
    labels = {"model": MODEL, "version": VERSION}
    assert registry.get_sample_value("graylane_desired_replicas", labels) == 2.0
    observer.observe(outputs[2:])  # type: ignore[arg-type]
    assert registry.get_sample_value("graylane_desired_replicas", labels) == 1.0


def test_scaling_is_off_by_default_and_a_restored_request_is_kept() -> None:
    core = PolicyCore(window_ms=2000, step_ms=1000)
    core.on_command(Command(kind=CommandKind.SET_QOS_POLICY, model=MODEL, qos_policy=QOS), 0)
    sim = Sim(core)
    for t in range(0, 30_000, 250):
        sim.step(t, 40.0)
    assert not [o for o in sim.outputs if isinstance(o, ScalePublication)]
    assert core.scaling.states == {}

    core = PolicyCore(window_ms=2000, step_ms=1000)
    core.set_scale_policy(SCALE)
    core.scaling.restore(VersionKey(MODEL, VERSION), 2, 5, 1_000)
    core.scaling.restore(
        VersionKey(MODEL, VERSION), 3, 4, 2_000
    )  # an older epoch read later: ignored
    assert core.scaling.states[VersionKey(MODEL, VERSION)].desired == 2
    out = [o for o in core.tick(60_000) if isinstance(o, ScalePublication)]
    assert out == []  # idle, capacity unknown: the restored request stands
    assert core.scaling.epochs[VersionKey(MODEL, VERSION)] == 5
