"""The liveness signals the policy engine builds from topic offsets and telemetry (pure),
and the core rolling back an unresponsive candidate / holding on a dead baseline."""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.audit_replay import verify
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.liveness import (
    LivenessAction,
    LivenessTracker,
    OffsetSample,
    check_rollout_liveness,
)
from graylane.policy_engine.messages import RolloutAudit, RoutingPublication
from graylane.policy_engine.state import VersionKey
from graylane.policy_engine.wire import records_of
from graylane.rollouts.spec import Gates, RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionRule, Phase
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2
from tests.unit.test_policy_core import MODEL, batch, start_cmd

T_MS = 3000
SPEC = RolloutSpec(
    rollout_id="r1",
    model=MODEL,
    baseline="v1",
    candidate="v2",
    steps=(Step(10.0, 10, 2.0), Step(50.0, 10, 2.0), Step(100.0, 0, 0.0)),
    gates=Gates(unresponsive_s=T_MS / 1000),
)


def test_records_before_the_first_probe_never_count() -> None:
    tracker = LivenessTracker()
    tracker.on_offsets("m", "v2", OffsetSample(0, end=500, committed=None, lag=500))
    tracker.on_offsets("m", "v2", OffsetSample(1000, end=500, committed=None, lag=500))
    live = tracker.version_liveness("m", "v2")
    assert live is not None and live.routed_since_telemetry == 0
    assert live.first_routed_since_telemetry_ms is None
    assert tracker.version_liveness("m", "v3") is None


def test_traffic_without_telemetry_is_unresponsive_after_t() -> None:
    tracker = LivenessTracker()
    for i, t in enumerate(range(0, 6000, 1000)):
        tracker.on_offsets("m", "v2", OffsetSample(t, end=10 * i, committed=None, lag=10 * i))
    live = tracker.version_liveness("m", "v2")
    assert live is not None
    assert live.routed_since_telemetry == 50 and live.first_routed_since_telemetry_ms == 1000
    assert [s.lag for s in live.lag] == [0, 10, 20, 30, 40, 50]
    no_lag = replace(live, lag=())  # the telemetry rule alone
    assert check_rollout_liveness(None, no_lag, 3999, T_MS).action is LivenessAction.CONTINUE
    check = check_rollout_liveness(None, no_lag, 4000, T_MS)
    assert check.action is LivenessAction.ROLLBACK and "no telemetry yet" in check.reason


def test_telemetry_answers_what_was_routed() -> None:
    tracker = LivenessTracker()
    for i, t in enumerate(range(0, 20_000, 1000)):
        tracker.on_offsets("m", "v2", OffsetSample(t, end=10 * i, committed=10 * i - 3, lag=3))
        tracker.on_telemetry("m", "v2", t + 300)
        live = tracker.version_liveness("m", "v2")
        assert live is not None
        assert check_rollout_liveness(None, live, t + 500, T_MS).action is LivenessAction.CONTINUE


def test_a_worker_that_dies_is_unresponsive_t_after_its_last_telemetry() -> None:
    tracker = LivenessTracker()
    tracker.on_offsets("m", "v2", OffsetSample(0, end=0, committed=0, lag=0))
    tracker.on_telemetry("m", "v2", 500)
    tracker.on_offsets("m", "v2", OffsetSample(1000, end=10, committed=10, lag=0))
    tracker.on_telemetry("m", "v2", 1500)  # the last answer
    for i, t in enumerate(range(2000, 8000, 1000)):
        sample = OffsetSample(t, end=20 + 10 * i, committed=10, lag=10 + 10 * i)
        tracker.on_offsets("m", "v2", sample)
    live = tracker.version_liveness("m", "v2")
    assert live is not None and live.first_routed_since_telemetry_ms == 2000
    assert live.last_telemetry_ms == 1500 and live.lag[-1].lag == 60
    assert check_rollout_liveness(None, live, 5000, T_MS).action is LivenessAction.ROLLBACK


def test_lag_samples_stay_within_the_horizon() -> None:
    tracker = LivenessTracker(horizon_ms=5000)
    for t in range(0, 20_000, 1000):
        tracker.on_offsets("m", "v2", OffsetSample(t, end=t, committed=t, lag=0))
    live = tracker.version_liveness("m", "v2")
    assert live is not None and live.lag[0].at_ms == 14_000
    tracker.forget("m")
    assert tracker.version_liveness("m", "v2") is None


def _drive(core: PolicyCore, t0: int, t1: int, *, alive: set[str]) -> list[object]:
    """Both versions get traffic (their topics' end offsets grow); only ``alive`` answer."""
    out: list[object] = []
    for t in range(t0, t1, 250):
        for v in sorted(alive):
            core.on_telemetry(batch(v, t), received_ms=t)
        if t % 1000 == 0:
            targets = [(k.model, k.version) for k in core.liveness_targets()]
            assert targets in ([(MODEL, "v1"), (MODEL, "v2")], [])
            for v in ("v1", "v2"):
                consumed = t - t0 if v in alive else 0
                sample = OffsetSample(t, end=t - t0, committed=consumed, lag=t - t0 - consumed)
                core.on_offsets(VersionKey(MODEL, v), sample)
            out.extend(core.tick(t))
    return out


def test_core_rolls_back_a_candidate_nobody_serves_and_the_audit_replays() -> None:
    core = PolicyCore(window_ms=4000, step_ms=1000)
    out: list[object] = list(core.on_command(start_cmd(SPEC), 100_000))
    out += _drive(core, 100_000, 110_000, alive={"v1"})
    assert core.rollouts.finished["r1"].phase is Phase.ROLLED_BACK
    last = [o for o in out if isinstance(o, RolloutAudit)][-1]
    assert last.decision.rule is DecisionRule.CANDIDATE_UNRESPONSIVE
    assert T_MS <= last.decision.at_ms - 100_000 <= T_MS + 2000
    tables = [o for o in out if isinstance(o, RoutingPublication)]
    assert tables[-1].plan.weight_of("v2") == 0.0
    # The decision replays from its audit record alone: the signals travel with it.
    layout = TopicLayout(prefix="p")
    recs = [
        audit_pb2.AuditRecord.FromString(r.value)
        for r in records_of(out, layout)  # type: ignore[arg-type]
        if r.topic == layout.audit()
    ]
    assert recs[-1].liveness and verify(recs) == []
    assert core.liveness_targets() == []


def test_core_holds_and_never_promotes_over_a_dead_baseline() -> None:
    core = PolicyCore(window_ms=4000, step_ms=1000)
    out: list[object] = list(core.on_command(start_cmd(SPEC), 100_000))
    out += _drive(core, 100_000, 140_000, alive={"v2"})
    assert core.rollouts[MODEL].state.phase is not Phase.PROMOTED
    rules = [o.decision.rule for o in out if isinstance(o, RolloutAudit)]
    assert DecisionRule.BASELINE_UNRESPONSIVE in rules
    assert rules[-1] is DecisionRule.BASELINE_UNRESPONSIVE
    assert core.rollouts[MODEL].state.step_index == 0
