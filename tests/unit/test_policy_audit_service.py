"""Audit verify replays decisions taken on service time: the audit windows carry it.

The fixed gates judge latency on service time where both windows have it. A
candidate whose requests wait 20 ms in its queue while its model serves as
fast as the baseline is healthy on service time and 5x slower end to end: a
replay from windows without service times would roll it back.
"""

from __future__ import annotations

from graylane.histogram import LatencyHistogram
from graylane.policy_engine import wire
from graylane.policy_engine.audit_replay import verify
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.rollout import evaluate
from graylane.policy_engine.logic.window import TelemetrySample
from graylane.policy_engine.messages import Command, CommandKind
from graylane.policy_engine.wire import records_of
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionKind
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2

MODEL = "gpt"
# The fixed-horizon gates (rules p99_ratio / p99_severe); SEQUENTIAL below.
SPEC = RolloutSpec(
    rollout_id="r1",
    model=MODEL,
    baseline="v1",
    candidate="v2",
    steps=(Step(10.0, 10, 2.0), Step(50.0, 10, 2.0), Step(100.0, 0, 0.0)),
    gates=Gates(mode=GateMode.FIXED),
)


def batch(version: str, at_ms: int, *, service_ms: float, queue_ms: float) -> TelemetrySample:
    n = 10
    latency, queue = LatencyHistogram(), LatencyHistogram()
    latency.record(service_ms + queue_ms, n)
    queue.record(queue_ms, n)
    return TelemetrySample(
        model=MODEL,
        version=version,
        variant="fp32",
        worker_id=f"w-{version}",
        completed_at_ms=at_ms,
        started_at_ms=at_ms - round(service_ms),
        compute_ms=service_ms,
        request_count=n,
        error_count=0,
        latency=latency,
        queue_wait=queue,
    )


def run(spec: RolloutSpec, candidate_service_ms: float) -> list[audit_pb2.AuditRecord]:
    """Baseline: 5 ms service, no queue; candidate: 20 ms queue wait."""
    core = PolicyCore(window_ms=4000, step_ms=1000)
    out: list[object] = core.on_command(
        Command(
            kind=CommandKind.START,
            model=MODEL,
            rollout_id=spec.rollout_id,
            spec=spec,
            command_id="c-start",
        ),
        100_000,
    )
    for t in range(100_000, 130_000, 250):
        core.on_telemetry(batch("v1", t, service_ms=5.0, queue_ms=0.0))
        core.on_telemetry(batch("v2", t, service_ms=candidate_service_ms, queue_ms=20.0))
        if t % 1000 == 0:
            out.extend(core.tick(t))
    layout = TopicLayout(prefix="p")
    # Through the wire form, as `graylane audit verify` reads them.
    return [
        audit_pb2.AuditRecord.FromString(r.value)
        for r in records_of(out, layout)
        if r.topic == layout.audit()
    ]


def without_service(rec: audit_pb2.AuditRecord) -> audit_pb2.AuditRecord:
    stripped = audit_pb2.AuditRecord()
    stripped.CopyFrom(rec)
    for w in stripped.inputs:
        w.ClearField("service")
        w.service_p50_ms = w.service_p95_ms = w.service_p99_ms = 0.0
    return stripped


def test_the_sequential_mode_is_the_default() -> None:
    assert Gates().mode is GateMode.SEQUENTIAL


def test_queue_wait_alone_promotes_and_its_records_verify() -> None:
    recs = run(SPEC, candidate_service_ms=5.0)
    kinds = [r.kind for r in recs]
    assert kinds[-1] == audit_pb2.DECISION_PROMOTE
    assert audit_pb2.DECISION_ROLLBACK not in kinds
    windows = [w for r in recs for w in r.inputs]
    assert windows and all(w.HasField("service") for w in windows)
    assert all(w.service_p99_ms > 0.0 for w in windows)
    assert verify(recs) == []
    # The service times on the wire are what makes the replay agree: without them
    # the gates judge the end-to-end latency (5x) and decide otherwise.
    assert verify([without_service(r) for r in recs]) != []


def test_a_service_time_regression_rolls_back_and_verifies() -> None:
    recs = run(SPEC, candidate_service_ms=15.0)
    assert recs[-1].kind == audit_pb2.DECISION_ROLLBACK
    assert recs[-1].rule in ("p99_ratio", "p99_severe")
    assert "service time" in recs[-1].reason
    assert verify(recs) == []


def test_window_stats_round_trip_keeps_service_times() -> None:
    recs = run(SPEC, candidate_service_ms=5.0)
    pb = next(w for r in recs for w in r.inputs if w.version == "v2")
    stats = wire.window_stats_from_pb(pb)
    assert stats.service is not None and stats.service.count == stats.requests
    again = wire.window_stats_from_pb(wire.window_stats_to_pb(stats))
    assert again == stats and again.service == stats.service
    assert again.service_p99_ms == stats.service_p99_ms > 0.0


def test_a_decision_on_service_times_replays_identically_after_the_wire() -> None:
    recs = run(SPEC, candidate_service_ms=5.0)
    rec = next(r for r in recs if r.kind == audit_pb2.DECISION_ADVANCE)
    before, spec = wire.rollout_state_from_pb(rec.rollout_before)
    stats = {w.version: wire.window_stats_from_pb(w) for w in rec.inputs}
    d = evaluate(before, spec, stats["v1"], stats["v2"], None, rec.decided_at_unix_ms)
    assert d.kind is DecisionKind.ADVANCE and d.reason == rec.reason
    assert "service time" in d.reason
    # Round trip the decision's own inputs once more: the same decision.
    again = [wire.window_stats_from_pb(wire.window_stats_to_pb(s)) for s in d.inputs]
    assert evaluate(before, spec, again[0], again[1], None, rec.decided_at_unix_ms) == d


SEQUENTIAL = RolloutSpec(
    rollout_id="r1",
    model=MODEL,
    baseline="v1",
    candidate="v2",
    # Without step increments the engine feeds the tests whole 4 s windows: dwell long
    # enough for the three increments a rejection needs.
    steps=(Step(10.0, 10, 20.0), Step(100.0, 0, 0.0)),
    gates=Gates(mode=GateMode.SEQUENTIAL),
)


def test_sequential_decisions_carry_their_evidence_and_verify() -> None:
    for service_ms in (5.0, 15.0):
        recs = run(SEQUENTIAL, candidate_service_ms=service_ms)
        assert any(r.rollout_after.HasField("sequential") for r in recs)
        assert verify(recs) == []
        # The evidence on the wire is what the replay continues from.
        stripped = []
        for r in recs:
            c = audit_pb2.AuditRecord()
            c.CopyFrom(r)
            c.rollout_before.ClearField("sequential")
            stripped.append(c)
        assert verify(stripped) != []
    assert recs[-1].kind == audit_pb2.DECISION_ROLLBACK
    assert recs[-1].rule == "service_time_sequential"
