"""One bad record or one failing decision never stops the policy engine's other decisions
(issue 10, item 2): bad control records are skipped per key at restore, bad telemetry,
commands and shadow results per record, and a rollout or QoS key whose evaluation
raises is skipped at that tick while every other model is decided. Each skip is
counted and audited (throttled)."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry

from graylane import serde
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.metrics.controlside import PolicyMetrics
from graylane.policy_engine import wire
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.isolation import RecordGuard
from graylane.policy_engine.logic.window import TelemetrySample, invalid_sample
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    RecordSkipped,
    RecordSource,
    RolloutAudit,
    RoutingPublication,
    SkipReason,
)
from graylane.policy_engine.service import PolicyObserver, telemetry_into
from graylane.policy_engine.state import VersionKey
from graylane.policy_engine.wire import command_of, records_of, restore_values, shadow_of
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule
from graylane.routing.convert import table_to_pb
from graylane.routing.table import table_for_weights
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2, control_pb2, telemetry_pb2

GARBAGE = b"\xff\xfe\x00 not a protobuf message \x0a\xff"


def spec(model: str, rollout_id: str) -> RolloutSpec:
    return RolloutSpec(
        rollout_id=rollout_id,
        model=model,
        baseline="v1",
        candidate="v2",
        steps=(Step(10.0, 5, 1.0), Step(50.0, 5, 1.0), Step(100.0, 0, 0.0)),
    )


def sample(model: str, version: str, at_ms: int, **fields: object) -> TelemetrySample:
    h = LatencyHistogram()
    for _ in range(10):
        h.record(5.0)
    base = TelemetrySample(
        model=model,
        version=version,
        variant="fp32",
        worker_id=f"w-{version}",
        completed_at_ms=at_ms,
        request_count=10,
        error_count=0,
        latency=h,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def start(core: PolicyCore, s: RolloutSpec, at_ms: int) -> None:
    command = Command(
        kind=CommandKind.START, model=s.model, rollout_id=s.rollout_id, spec=s, command_id="c"
    )
    core.on_command(command, at_ms)


def skips(outputs: list[object]) -> list[RecordSkipped]:
    return [o for o in outputs if isinstance(o, RecordSkipped)]


# --- restore ----------------------------------------------------------------------------


def test_restore_skips_bad_records_per_key_and_keeps_every_good_one() -> None:
    good = spec("gpt", "r-good")
    core = PolicyCore()
    start(core, good, 1_000)
    state = core.rollouts["gpt"].state
    other = spec("other", "r-other")
    broken_step = replace(state, rollout_id="r-other", model="other", step_index=7)
    rollouts = {
        b"r-good": serde.encode(wire.rollout_state_to_pb(state, good)),
        b"r-garbage": GARBAGE,
        b"r-other": serde.encode(wire.rollout_state_to_pb(broken_step, other)),
        b"r-deleted": None,
    }
    weights = (("v2", 10.0),)
    table = table_to_pb(
        table_for_weights(model="gpt", stable_version="v1", weights=weights, epoch=4)
    )
    routing = {b"gpt": serde.encode(table), b"bad": GARBAGE}
    precision = {
        b"gpt/v1": serde.encode(
            control_pb2.PrecisionCommand(model="gpt", version="v1", variant="int8", epoch=3)
        ),
        b"x/v1": serde.encode(control_pb2.PrecisionCommand(model="x", version="v1")),
        b"y/v1": GARBAGE,
    }
    restored = restore_values(routing, precision, rollouts, RecordGuard(), 5_000)
    assert [s.rollout_id for s, _ in restored.states] == ["r-good"]
    assert restored.epochs == {"gpt": 4} and set(restored.tables) == {"gpt"}
    assert restored.precision == {VersionKey("gpt", "v1"): ("int8", 3)}
    got = {(s.source, s.key, s.reason) for s in restored.skipped}
    assert got == {
        (RecordSource.ROLLOUTS, "r-garbage", SkipReason.UNDECODABLE),
        (RecordSource.ROLLOUTS, "r-other", SkipReason.INVALID),
        (RecordSource.ROUTING, "bad", SkipReason.UNDECODABLE),
        (RecordSource.PRECISION, "x/v1", SkipReason.INVALID),
        (RecordSource.PRECISION, "y/v1", SkipReason.UNDECODABLE),
    }
    fresh = PolicyCore()
    restored.apply(fresh)
    assert set(fresh.rollouts) == {"gpt"} and fresh.routing.epochs["gpt"] >= 4


# --- records at run time -----------------------------------------------------------------


def test_bad_telemetry_is_skipped_and_good_telemetry_still_counts() -> None:
    core, isolation = PolicyCore(), RecordGuard()
    no_scheme = telemetry_pb2.BatchTelemetry(
        model="gpt", version="v1", variant="fp32", completed_at_unix_ms=1_000, request_count=1
    )
    no_scheme.latency.buckets[3] = 1  # buckets without min_ms/growth
    too_many_errors = telemetry_pb2.BatchTelemetry(
        model="gpt",
        version="v1",
        variant="fp32",
        completed_at_unix_ms=1_000,
        request_count=1,
        error_count=5,
    )
    results = [
        telemetry_into(core, value, isolation, 1_000)
        for value in (GARBAGE, serde.encode(no_scheme), serde.encode(too_many_errors))
    ]
    assert [(r.source, r.reason) for r in results if r is not None] == [
        (RecordSource.TELEMETRY, SkipReason.UNDECODABLE),
        (RecordSource.TELEMETRY, SkipReason.INVALID),
        (RecordSource.TELEMETRY, SkipReason.INVALID),
    ]
    ok = telemetry_pb2.BatchTelemetry(
        model="gpt",
        version="v1",
        variant="fp32",
        completed_at_unix_ms=1_000,
        request_count=2,
        latency=histogram_to_pb(sample("gpt", "v1", 1_000).latency),
    )
    assert telemetry_into(core, serde.encode(ok), isolation, 1_000) is None
    assert core.acks.served_at[VersionKey("gpt", "v1")] == {"fp32": 1_000}


def test_a_histogram_of_another_scheme_is_skipped_before_it_reaches_the_window() -> None:
    core, isolation = PolicyCore(), RecordGuard()
    odd = LatencyHistogram(0.5, 1.3)
    odd.record(5.0)
    pb = telemetry_pb2.BatchTelemetry(
        model="gpt",
        version="v1",
        variant="fp32",
        completed_at_unix_ms=1_000,
        request_count=1,
        latency=histogram_to_pb(odd),
    )
    skipped = telemetry_into(core, serde.encode(pb), isolation, 1_000)
    assert skipped is not None and "scheme" in skipped.detail
    assert core.tick(2_000) == [] and core.window.add(sample("gpt", "v1", 1_000))


def test_invalid_sample_names_what_is_wrong() -> None:
    assert invalid_sample(sample("gpt", "v1", 1)) is None
    assert invalid_sample(sample("", "v1", 1)) is not None
    assert invalid_sample(sample("gpt", "v1", 0)) is not None
    assert invalid_sample(sample("gpt", "v1", 1, compute_ms=float("nan"))) is not None
    assert invalid_sample(sample("gpt", "v1", 1, device_load=-1.0)) is not None


def test_bad_commands_and_shadow_results_are_skipped() -> None:
    isolation = RecordGuard()
    skipped = command_of(GARBAGE, isolation, 1)
    assert isinstance(skipped, RecordSkipped) and skipped.source is RecordSource.COMMANDS
    shadow = shadow_of(GARBAGE, isolation, 1)
    assert isinstance(shadow, RecordSkipped) and shadow.source is RecordSource.SHADOW


# --- decisions at every tick ---------------------------------------------------------------


def test_a_rollout_whose_decision_fails_never_stops_another_models_rollout() -> None:
    core = PolicyCore(window_ms=4_000, step_ms=1_000)
    start(core, spec("broken", "r-broken"), 0)
    start(core, spec("gpt", "r-gpt"), 0)
    # the state of "broken" points past its spec's steps (as a corrupted record would)
    active = core.rollouts["broken"]
    active.state = replace(active.state, step_index=9)
    policy = QosPolicy(model="qos", version="v1", ladder=("fp32", "int8"), slo_p99_ms=50.0)
    core.on_command(Command(kind=CommandKind.SET_QOS_POLICY, model="qos", qos_policy=policy), 0)
    del core.qos.states[VersionKey("qos", "v1")]  # an inconsistent key: its evaluation raises
    outputs: list[object] = []
    for t in range(250, 6_001, 250):
        for model in ("broken", "gpt"):
            for version in ("v1", "v2"):
                core.on_telemetry(sample(model, version, t))
        if t % 1_000 == 0:
            outputs += core.tick(t)
    advanced = [
        o
        for o in outputs
        if isinstance(o, RolloutAudit)
        and o.spec.model == "gpt"
        and o.decision.kind is DecisionKind.ADVANCE
    ]
    assert advanced, "the healthy model's rollout was not decided"
    assert any(isinstance(o, RoutingPublication) and o.plan.model == "gpt" for o in outputs)
    failed = skips(outputs)
    broken = [s for s in failed if s.source is RecordSource.ROLLOUT_DECISION]
    assert broken and {s.model for s in broken} == {"broken"}
    assert all(s.reason is SkipReason.FAILED and s.rollout_id == "r-broken" for s in broken)
    assert [s.audited for s in broken] == [True] + [False] * (len(broken) - 1)  # throttled
    qos = [s for s in failed if s.source is RecordSource.QOS_DECISION]
    assert qos and {(s.model, s.version) for s in qos} == {("qos", "v1")}
    assert core.rollouts["broken"].state.step_index == 9  # kept its state, tried again

    # counted every time, audited once (per source and key, per interval)
    metrics = PolicyMetrics.create(CollectorRegistry())
    PolicyObserver(metrics).observe(failed)  # type: ignore[arg-type]
    counted = metrics.skipped_records.labels("rollout_decision", "failed")._value.get()
    assert counted == len(broken)
    assert metrics.decision_errors.labels("broken", "rollout_decision")._value.get() == len(broken)
    records = records_of(failed, TopicLayout(prefix="t"))  # type: ignore[arg-type]
    audits = [serde.decode(audit_pb2.AuditRecord, r.value) for r in records]
    assert {(a.model, a.rule) for a in audits} == {
        ("broken", DecisionRule.DECISION_FAILED),
        ("qos", DecisionRule.DECISION_FAILED),
    }
    assert all(r.topic == "t.audit" for r in records)
    assert "IndexError" in next(a.reason for a in audits if a.model == "broken")
