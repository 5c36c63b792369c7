"""The bake period after a promotion: the promoted version judged against the previous
stable's last window, rolled back on a regression, baked when the period ends clean."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.notifications.transitions import TransitionKind, transition_kind
from graylane.policy_engine.logic.bake import BakeAction, bake_gates, judge_bake
from graylane.policy_engine.logic.gates import GateResult, Verdict
from graylane.policy_engine.logic.liveness import VersionLiveness
from graylane.policy_engine.logic.revision import revise
from graylane.policy_engine.logic.rollout import Decision, RolloutSignals, apply_command, evaluate
from graylane.policy_engine.wire import rollout_state_from_pb, rollout_state_to_pb
from graylane.rollouts.errors import InvalidSpec, InvalidTransition
from graylane.rollouts.pb import rollout_spec_from_pb, rollout_spec_to_pb
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, ManualCommand, Phase
from tests.support.rollout_run import SPEC, WINDOW, Run, ws

BAKE_S = 60.0
BAKED_SPEC = replace(SPEC, steps=(Step(50.0, 10, 0.0), Step(100.0, 0, 0.0)), bake_s=BAKE_S)


def promoted(spec: RolloutSpec = BAKED_SPEC) -> Run:
    """A rollout driven to its promotion (one passing window at 50 %)."""
    run = Run(spec)
    d = run.window()
    assert d.kind is DecisionKind.PROMOTE
    return run


def bake_window(run: Run, requests: int = 200, errors: int = 0, p99: float = 20.0) -> Decision:
    """One window of the promoted version alone: the previous stable serves nothing."""
    candidate = ws("v2", run.t, requests, errors, p99=p99)
    run.t += WINDOW
    d = evaluate(run.state, run.spec, None, candidate, None, run.t)
    run.decisions.append(d)
    return d


def test_a_promotion_with_a_bake_period_bakes_on_the_baseline_window() -> None:
    run = promoted()
    d = run.decisions[-1]
    assert d.after.phase is Phase.BAKING and not d.after.terminal
    assert d.routing is not None
    assert (d.routing.stable_version, d.routing.candidate_weight_percent) == ("v2", 100.0)
    assert d.after.bake_until_ms == run.t + BAKE_S * 1000
    reference = d.after.bake_reference
    assert reference is not None and reference.version == "v1" and reference.requests == 1000
    assert "baking 60 s against v1's last window" in d.reason
    assert d.after.bake_left_ms(run.t) == 60_000


def test_without_a_bake_period_the_promotion_is_final() -> None:
    run = promoted(replace(BAKED_SPEC, bake_s=0.0))
    d = run.decisions[-1]
    assert d.after.phase is Phase.PROMOTED and d.after.bake_reference is None


def test_a_clean_bake_ends_baked_without_a_routing_change() -> None:
    run = promoted()
    until = run.state.bake_until_ms
    holds = []
    while not run.state.terminal:
        d = bake_window(run)
        if d.kind is DecisionKind.HOLD:
            holds.append(d)
    assert {d.rule for d in holds} == {DecisionRule.BAKING}
    assert "50 s left" in holds[0].reason
    # Each bake window was judged against the frozen reference: both are in the inputs.
    assert [s.version for s in holds[0].inputs] == ["v1", "v2"]
    final = run.decisions[-1]
    assert (final.kind, final.rule) == (DecisionKind.PROMOTE, DecisionRule.BAKED)
    assert final.after.phase is Phase.PROMOTED and final.routing is None
    assert final.at_ms >= until and final.reason.startswith("baked: v2 stays stable")
    assert final.after.epoch == final.before.epoch


def test_a_severe_regression_during_bake_rolls_back_at_once() -> None:
    run = promoted()
    bake_window(run)
    d = bake_window(run, p99=100.0)
    assert d.kind is DecisionKind.ROLLBACK and d.rule is DecisionRule.P99_SEVERE
    assert d.before.phase is Phase.BAKING and d.after.phase is Phase.ROLLED_BACK
    assert d.routing is not None
    assert (d.routing.stable_version, d.routing.candidate_weight_percent) == ("v1", 0.0)
    assert d.routing.epoch == d.before.epoch + 1
    assert d.reason.startswith("rolled back v2 during bake, v1 at 100% and stable again")
    assert "candidate p99 100.00 ms / baseline p99 20.00 ms" in d.reason
    assert [s.version for s in d.inputs] == ["v1", "v2"]


def test_a_moderate_regression_needs_failures_to_rollback_windows() -> None:
    run = promoted()
    first = bake_window(run, p99=40.0)
    assert first.kind is DecisionKind.GATE_FAILED and first.rule is DecisionRule.P99_RATIO
    assert first.after.phase is Phase.BAKING and first.after.consecutive_failures == 1
    second = bake_window(run, p99=40.0)
    assert second.kind is DecisionKind.ROLLBACK and second.after.phase is Phase.ROLLED_BACK
    assert "2 consecutive gate failures" in second.reason


def test_a_passing_window_resets_the_failure_count() -> None:
    run = promoted()
    assert bake_window(run, p99=40.0).after.consecutive_failures == 1
    assert bake_window(run).after.consecutive_failures == 0
    assert bake_window(run, p99=40.0).kind is DecisionKind.GATE_FAILED


def test_errors_during_bake_roll_back() -> None:
    run = promoted()
    d = bake_window(run, requests=1000, errors=300)
    assert d.kind is DecisionKind.ROLLBACK and d.after.phase is Phase.ROLLED_BACK
    assert d.rule in (DecisionRule.ERROR_RATE_SEVERE, DecisionRule.ERROR_RATE_DECISIVE)


def test_too_few_requests_hold_and_the_period_still_ends_baked() -> None:
    run = promoted()
    d = bake_window(run, requests=3)
    assert d.kind is DecisionKind.HOLD and d.rule is DecisionRule.BAKING
    assert "3 requests of v2" in d.reason
    run.t = run.state.bake_until_ms
    d = bake_window(run, requests=0)
    assert d.rule is DecisionRule.BAKED and d.after.phase is Phase.PROMOTED


def test_a_regression_in_the_last_window_still_rolls_back() -> None:
    run = promoted()
    run.t = run.state.bake_until_ms
    d = bake_window(run, p99=100.0)
    assert d.kind is DecisionKind.ROLLBACK


def test_an_unresponsive_promoted_version_rolls_back() -> None:
    run = promoted()
    dead = VersionLiveness(
        version="v2", routed_since_telemetry=500, first_routed_since_telemetry_ms=run.t - 120_000
    )
    d = evaluate(
        run.state, run.spec, None, None, None, run.t, RolloutSignals(candidate_liveness=dead)
    )
    assert d.kind is DecisionKind.ROLLBACK and d.rule is DecisionRule.CANDIDATE_UNRESPONSIVE
    assert "during bake" in d.reason


def test_sequential_gates_bake_on_the_fixed_gates() -> None:
    gates = Gates(mode=GateMode.SEQUENTIAL)
    assert bake_gates(gates).mode is GateMode.FIXED
    assert bake_gates(Gates(mode=GateMode.FIXED)) == Gates(mode=GateMode.FIXED)


def test_judge_bake_orders_failure_over_the_end() -> None:
    fail = GateResult(DecisionRule.P99_RATIO, Verdict.FAIL, "slow")
    ok = GateResult(DecisionRule.P99_RATIO, Verdict.PASS, "fine")
    assert judge_bake([fail], bake_until_ms=10, now_ms=20, judged="").action is BakeAction.FAILED
    assert judge_bake([ok], bake_until_ms=10, now_ms=20, judged="").action is BakeAction.BAKED
    watch = judge_bake([ok], bake_until_ms=30_000, now_ms=20_000, judged="")
    assert watch.action is BakeAction.WATCH and "10 s left" in watch.reason
    empty = judge_bake([], bake_until_ms=30_000, now_ms=0, judged="no requests")
    assert empty.action is BakeAction.WATCH and "no requests" in empty.reason


def test_manual_commands_during_bake() -> None:
    run = promoted()
    for refused in (ManualCommand.PAUSE, ManualCommand.ABORT, ManualCommand.RESUME):
        with pytest.raises(InvalidTransition):
            apply_command(run.state, run.spec, refused, run.t)
    back = apply_command(run.state, run.spec, ManualCommand.ROLLBACK, run.t, note="ops")
    assert back.after.phase is Phase.ROLLED_BACK
    assert back.routing is not None and back.routing.stable_version == "v1"
    done = apply_command(run.state, run.spec, ManualCommand.PROMOTE, run.t)
    assert done.after.phase is Phase.PROMOTED
    assert done.routing is not None and done.routing.stable_version == "v2"


def test_bake_transitions_notify() -> None:
    assert transition_kind(DecisionKind.PROMOTE, DecisionRule.ALL_GATES_PASSED, Phase.BAKING) is (
        TransitionKind.PROMOTED
    )
    assert transition_kind(DecisionKind.PROMOTE, DecisionRule.BAKED, Phase.PROMOTED) is (
        TransitionKind.BAKED
    )
    assert transition_kind(DecisionKind.HOLD, DecisionRule.BAKING, Phase.BAKING) is None
    in_bake = transition_kind(
        DecisionKind.ROLLBACK, DecisionRule.P99_SEVERE, Phase.ROLLED_BACK, Phase.BAKING
    )
    assert in_bake is TransitionKind.ROLLED_BACK_IN_BAKE
    by_hand = transition_kind(
        DecisionKind.MANUAL, DecisionRule.MANUAL_ROLLBACK, Phase.ROLLED_BACK, Phase.BAKING
    )
    assert by_hand is TransitionKind.ROLLED_BACK_IN_BAKE
    assert transition_kind(
        DecisionKind.ROLLBACK, DecisionRule.P99_SEVERE, Phase.ROLLED_BACK, Phase.PROGRESSING
    ) is (TransitionKind.ROLLED_BACK)


def test_a_baking_state_survives_the_wire() -> None:
    run = promoted()
    bake_window(run, p99=40.0)
    state = run.state
    back, spec = rollout_state_from_pb(rollout_state_to_pb(state, run.spec))
    assert spec.bake_s == BAKE_S
    assert back == state
    # ... so a restarted engine goes on baking from it, to the same decision.
    candidate = ws("v2", run.t, 200, p99=40.0)
    assert evaluate(back, spec, None, candidate, None, run.t + WINDOW) == evaluate(
        state, run.spec, None, candidate, None, run.t + WINDOW
    )


def test_bake_spec_on_the_wire_and_validated() -> None:
    assert rollout_spec_from_pb(rollout_spec_to_pb(BAKED_SPEC)).bake_s == BAKE_S
    with pytest.raises(InvalidSpec):
        replace(BAKED_SPEC, bake_s=-1.0)


def test_an_applied_bake_period_counts_from_the_promotion() -> None:
    run = promoted()
    bake_window(run)
    promoted_at = run.state.phase_started_ms
    longer = revise(run.state, run.spec, replace(run.spec, bake_s=120.0), run.t)
    assert longer.rule is DecisionRule.SPEC_UPDATED and "bake_s" in longer.reason
    assert longer.after.phase is Phase.BAKING and longer.routing is None
    assert longer.after.bake_until_ms == promoted_at + 120_000
    ended = revise(run.state, run.spec, replace(run.spec, bake_s=0.0), run.t)
    d = evaluate(ended.after, replace(run.spec, bake_s=0.0), None, None, None, run.t)
    assert d.rule is DecisionRule.BAKED and d.after.phase is Phase.PROMOTED
