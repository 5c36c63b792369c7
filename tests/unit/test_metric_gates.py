"""Gates on any Prometheus metric: readings, the gate's verdicts, the pause when Prometheus
stays silent, and the readings on record for replay (the pure core, a simulated clock)."""

from __future__ import annotations

import pytest

from graylane import serde
from graylane.app.bench.policy_scale import PolicyScaleConfig, TelemetryWriter
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.gates import Verdict
from graylane.policy_engine.logic.metric_gates import (
    MetricReading,
    metric_results,
    next_reading,
    overdue,
    render,
)
from graylane.policy_engine.messages import RolloutAudit
from graylane.policy_engine.metric_probe import value_of
from graylane.policy_engine.service import telemetry_into
from graylane.policy_engine.wire import command_of, records_of, signals_from_audit
from graylane.rollouts.spec import MetricComparison, MetricGate
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2, rollout_pb2

GATE = MetricGate("quality", 'q{m="{{model}}",v="{{candidate}}"}', MetricComparison.LESS, 0.5, 5.0)


def test_a_query_is_rendered_for_the_rollout() -> None:
    assert render(GATE.query, model="m", baseline="v1", candidate="v2") == 'q{m="m",v="v2"}'


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ({"status": "success", "data": {"resultType": "scalar", "result": [1, "0.25"]}}, 0.25),
        (
            {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "3"]}]},
            },
            3.0,
        ),
        ({"status": "success", "data": {"resultType": "vector", "result": []}}, None),
        (
            {
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [{"value": [1, "1"]}, {"value": [1, "2"]}],
                },
            },
            None,
        ),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1, "NaN"]}}, None),
        ({"status": "error", "error": "parse error"}, None),
        ("garbage", None),
    ],
)
def test_only_one_finite_number_is_a_reading(answer: object, value: float | None) -> None:
    got, why = value_of(answer)
    assert got == value
    assert (why == "") == (value is not None)


def test_results_and_the_inconclusive_streak() -> None:
    ok = next_reading(None, "quality", 0.1, "", 1_000)
    bad = next_reading(ok, "quality", 0.9, "", 2_000)
    assert [r.verdict for r in metric_results([GATE], [ok])] == [Verdict.PASS]
    assert [r.verdict for r in metric_results([GATE], [bad])] == [Verdict.FAIL]
    assert [r.verdict for r in metric_results([GATE], [])] == [Verdict.INCONCLUSIVE]
    first = next_reading(bad, "quality", None, "Prometheus unreachable", 3_000)
    second = next_reading(first, "quality", None, "Prometheus unreachable", 7_000)
    assert (first.inconclusive_since_ms, second.inconclusive_since_ms) == (3_000, 3_000)
    assert overdue([GATE], [second], 7_000) is None  # 4 s of 5
    assert overdue([GATE], [second], 8_001) == (GATE, second)
    assert next_reading(second, "quality", 0.2, "", 9_000).inconclusive_since_ms == 0


START = 1_700_000_000_000


def _core(gate: MetricGate) -> tuple[PolicyCore, TelemetryWriter]:
    core = PolicyCore(4_000, 500)
    spec = rollout_pb2.RolloutSpec(
        rollout_id="r1",
        model="m",
        baseline_version="v1",
        candidate_version="v2",
        strategy=rollout_pb2.CANARY,
        steps=[
            rollout_pb2.RolloutStep(weight_percent=10, min_samples=10_000, min_dwell_s=3600),
            rollout_pb2.RolloutStep(weight_percent=100),
        ],
        gates=rollout_pb2.GateSpec(
            metrics=[
                rollout_pb2.MetricGate(
                    name=gate.name,
                    query=gate.query,
                    comparison=rollout_pb2.METRIC_LESS,
                    threshold=gate.threshold,
                    pause_after_inconclusive_s=gate.pause_after_inconclusive_s,
                )
            ]
        ),
        failures_to_rollback=2,
    )
    cmd = rollout_pb2.RolloutCommand(
        command_id="c1", rollout_id="r1", model="m", kind=rollout_pb2.COMMAND_START, spec=spec
    )
    decoded = command_of(serde.encode(cmd), core.guard, START)
    core.on_command(decoded, START)  # type: ignore[arg-type]
    return core, TelemetryWriter("t", ["m"], PolicyScaleConfig(requests_per_batch=20))


def _run(
    core: PolicyCore, writer: TelemetryWriter, value: float | None, seconds: int
) -> list[RolloutAudit]:
    audits: list[RolloutAudit] = []
    for tick in range(1, seconds * 2 + 1):
        now = START + tick * 500
        for v in ("v1", "v2"):
            telemetry_into(core, writer.record("m", v, done_ms=now - 1), core.guard, now)
        for target in core.metric_targets():
            assert target.query == 'q{m="m",v="v2"}'
            core.on_metric(
                target, value, "" if value is not None else "Prometheus unreachable", now
            )
        audits += [o for o in core.tick(now) if isinstance(o, RolloutAudit)]
    return audits


def test_a_candidate_whose_metric_breaks_its_condition_is_held_and_rolled_back() -> None:
    core, writer = _core(GATE)
    healthy = _run(core, writer, 0.1, 4)
    assert healthy and all(a.decision.rule is not DecisionRule.METRIC_GATE for a in healthy)
    bad = _run(core, writer, 0.9, 6)  # a second failure counts once the windows no longer overlap
    kinds = [(a.decision.kind, a.decision.rule) for a in bad]
    assert (DecisionKind.GATE_FAILED, DecisionRule.METRIC_GATE) in kinds
    assert kinds[-1][0] is DecisionKind.ROLLBACK
    assert core.rollouts.get("m") is None or core.rollouts["m"].state.terminal


def test_an_unreadable_metric_holds_and_then_pauses_with_the_readings_on_record() -> None:
    core, writer = _core(GATE)
    audits = _run(core, writer, None, 8)
    rules = [a.decision.rule for a in audits]
    assert DecisionRule.METRIC_INCONCLUSIVE in rules
    paused = [
        a
        for a in audits
        if a.decision.after.phase is Phase.PAUSED and a.decision.before.phase is not Phase.PAUSED
    ]
    assert len(paused) == 1 and paused[0].decision.rule is DecisionRule.METRIC_INCONCLUSIVE
    after = audits[audits.index(paused[0]) + 1 :]
    assert after and all(a.decision.rule is DecisionRule.PAUSED for a in after)  # until resumed
    assert "inconclusive for" in paused[0].decision.reason
    assert all(a.decision.kind is not DecisionKind.ADVANCE for a in audits)
    record = next(
        r
        for r in records_of([paused[0]], TopicLayout(prefix="g"))
        if r.topic == TopicLayout(prefix="g").audit()
    )
    audit = serde.decode(audit_pb2.AuditRecord, record.value)
    signals = signals_from_audit(audit, "v1", "v2")
    assert signals is not None
    (reading,) = signals.metrics
    assert isinstance(reading, MetricReading) and reading.value is None
    assert reading.inconclusive == "Prometheus unreachable"
