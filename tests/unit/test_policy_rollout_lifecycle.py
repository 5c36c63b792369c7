"""Rollout controller lifecycle: spec validation, the transition table, start, holds,
advance and promotion, manual commands."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest

from graylane.policy_engine.logic.rollout import (
    TRANSITIONS,
    apply_command,
    check_transition,
    evaluate,
    pending_state,
    start,
)
from graylane.rollouts.errors import (
    InputMismatch,
    InvalidSpec,
    InvalidTransition,
    RolloutFinished,
)
from graylane.rollouts.spec import Gates, RolloutSpec, Step, Strategy
from graylane.rollouts.vocabulary import DecisionKind, ManualCommand, Phase
from tests.support.rollout_run import SPEC, Run, window_pair, ws

# -- spec validation ------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"steps": ()},
        {"steps": (Step(5.0), Step(5.0), Step(100.0))},
        {"steps": (Step(10.0), Step(5.0), Step(100.0))},
        {"steps": (Step(0.0), Step(100.0))},
        {"steps": (Step(50.0), Step(150.0))},
        {"steps": (Step(5.0), Step(50.0))},
        {"steps": (Step(100.0),)},
        {"steps": (Step(5.0, -1), Step(100.0))},
        {"candidate": "v1"},
        {"rollout_id": ""},
        {"gates": Gates(max_p99_ratio=0.5)},
        {"gates": Gates(alpha=0.0)},
        {"gates": Gates(max_error_rate_delta=1.5)},
        {"gates": Gates(min_output_agreement=1.2)},
        {"failures_to_rollback": 0},
        {"strategy": Strategy.SHADOW_THEN_CANARY, "shadow_share": 0.0},
        {"strategy": Strategy.SHADOW_THEN_CANARY, "shadow_duration_s": 0.0},
        {"strategy": Strategy.AB_SPLIT, "ab_weight_percent": 100.0},
        {"strategy": Strategy.AB_SPLIT, "ab_duration_s": -1.0},
    ],
)
def test_invalid_specs_are_refused(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "rollout_id": "r",
        "model": "m",
        "baseline": "v1",
        "candidate": "v2",
        **changes,
    }
    with pytest.raises(InvalidSpec):
        RolloutSpec(**fields)  # type: ignore[arg-type]


def test_default_spec_is_valid() -> None:
    spec = RolloutSpec(rollout_id="r", model="m", baseline="v1", candidate="v2")
    assert [s.weight_percent for s in spec.steps] == [1.0, 5.0, 25.0, 50.0, 100.0]
    assert spec.gates == Gates(1.5, 0.02, 0.01, 0.98)
    assert spec.failures_to_rollback == 2


# -- the transition table ---------------------------------------------------------


def test_transition_table_is_enforced_for_every_pair() -> None:
    for source, target in product(Phase, Phase):
        if source in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.ABORTED):
            with pytest.raises(RolloutFinished):
                check_transition(source, target)
        elif target in TRANSITIONS[source]:
            check_transition(source, target)
        else:
            with pytest.raises(InvalidTransition):
                check_transition(source, target)


def test_terminal_phases_have_no_way_out() -> None:
    for phase in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.ABORTED):
        assert TRANSITIONS[phase] == frozenset()
    assert Phase.PAUSED not in TRANSITIONS[Phase.PENDING]


# -- start ------------------------------------------------------------------------


def test_start_canary() -> None:
    d = start(SPEC, 5_000, epoch=41)
    assert d.kind is DecisionKind.STARTED and d.rule == "started"
    assert d.before.phase is Phase.PENDING
    assert d.after.phase is Phase.PROGRESSING and d.after.step_index == 0
    assert d.routing is not None
    assert d.routing.candidate_weight_percent == 1.0
    assert d.routing.stable_version == "v1" and d.routing.shadow_version is None
    assert d.routing.epoch == d.after.epoch == 42


def test_start_shadow_then_canary_and_ab() -> None:
    shadow = replace(SPEC, strategy=Strategy.SHADOW_THEN_CANARY, shadow_share=0.2)
    d = start(shadow, 0)
    assert d.after.phase is Phase.SHADOWING
    assert d.routing is not None
    assert (d.routing.candidate_weight_percent, d.routing.shadow_version) == (0.0, "v2")
    assert d.routing.shadow_share == 0.2
    ab = replace(SPEC, strategy=Strategy.AB_SPLIT, ab_weight_percent=30.0)
    d = start(ab, 0)
    assert d.after.phase is Phase.AB_HOLDING
    assert d.routing is not None and d.routing.candidate_weight_percent == 30.0


# -- holds ------------------------------------------------------------------------


def test_no_data_holds_and_leaves_the_failure_count() -> None:
    run = Run()
    run.window(p99=35.0)  # one counted failure
    assert run.state.consecutive_failures == 1
    s = run.state
    for baseline, candidate in [
        (None, ws("v2", run.t, 100)),
        (ws("v1", run.t, 100), None),
        (ws("v1", run.t, 100), ws("v2", run.t, 0)),
        (None, None),
    ]:
        d = evaluate(s, SPEC, baseline, candidate, None, run.t + 1)
        assert (d.kind, d.rule) == (DecisionKind.HOLD, "no_data")
        assert d.after.consecutive_failures == 1
        assert d.after.step_index == 0 and d.routing is None


def test_too_few_samples_in_the_window_hold() -> None:
    run = Run()
    d = run.window(cand_n=4)
    assert (d.kind, d.rule) == (DecisionKind.HOLD, "min_samples")
    assert "at least 5" in d.reason


def test_too_few_samples_in_the_step_hold_even_when_dwell_is_met() -> None:
    spec = replace(SPEC, steps=(Step(1.0, 500, 0.0), Step(100.0)))
    run = Run(spec)
    for _ in range(2):
        d = run.window(cand_n=200)
        assert (d.kind, d.rule) == (DecisionKind.HOLD, "min_samples")
        assert "candidate" in d.reason
    d = run.window(cand_n=200)  # 600 >= 500
    assert d.kind is DecisionKind.PROMOTE


def test_baseline_samples_count_too() -> None:
    spec = replace(SPEC, steps=(Step(50.0, 500, 0.0), Step(100.0)))
    run = Run(spec)
    d = run.window(base_n=100, cand_n=1000)
    assert d.rule == "min_samples" and "baseline 100/500" in d.reason


def test_min_dwell_holds() -> None:
    spec = replace(SPEC, steps=(Step(1.0, 10, 35.0), Step(100.0)))
    run = Run(spec)
    for _ in range(3):
        d = run.window()
        assert (d.kind, d.rule) == (DecisionKind.HOLD, "min_dwell")
    d = run.window()  # 40 s since the step began
    assert d.kind is DecisionKind.PROMOTE


def test_a_window_reaching_back_before_the_step_is_not_evidence() -> None:
    run = Run()
    begun = run.state.step_started_ms
    baseline, candidate = window_pair(begun - 4_000)
    d = evaluate(run.state, SPEC, baseline, candidate, None, begun + 6_000)
    assert d.after.evidence.windows == 0
    assert d.rule == "min_samples"


# -- advance and promote ------------------------------------------------------------


def test_advances_through_every_step_to_promotion() -> None:
    run = Run()
    weights = [run.state.candidate_weight_percent]
    for _ in range(60):
        d = run.window()
        if d.routing is not None:
            weights.append(d.routing.candidate_weight_percent)
        if d.after.terminal:
            break
    assert weights == [1.0, 5.0, 25.0, 50.0, 100.0]
    final = run.decisions[-1]
    assert (final.kind, final.rule) == (DecisionKind.PROMOTE, "all_gates_passed")
    assert final.after.phase is Phase.PROMOTED
    assert final.routing is not None and final.routing.stable_version == "v2"
    advances = [d for d in run.decisions if d.kind is DecisionKind.ADVANCE]
    assert [d.after.step_index for d in advances] == [1, 2, 3]
    # Every routing change carries the next epoch.
    epochs = [d.routing.epoch for d in run.decisions if d.routing is not None]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)
    # Each step held until its dwell (30 s = 3 windows) was met.
    holds = [d for d in run.decisions if d.kind is DecisionKind.HOLD]
    assert {d.rule for d in holds} == {"min_dwell"}


def test_advance_resets_the_step_evidence_and_timers() -> None:
    run = Run(replace(SPEC, steps=(Step(1.0, 10, 0.0), Step(5.0, 10, 0.0), Step(100.0))))
    d = run.window()
    assert d.kind is DecisionKind.ADVANCE
    assert d.after.evidence.windows == 0 and d.after.step_started_ms == run.t


# -- manual commands ------------------------------------------------------------------


def test_pause_freezes_and_resume_returns() -> None:
    run = Run()
    run.window()
    d = run.command(ManualCommand.PAUSE)
    assert (d.kind, d.rule) == (DecisionKind.MANUAL, "manual_pause")
    assert d.after.phase is Phase.PAUSED and d.after.paused_from is Phase.PROGRESSING
    assert d.routing is None and "(ops)" in d.reason
    for _ in range(5):
        d = run.window(p99=500.0, errors=150)  # even a disaster only holds while paused
        assert (d.kind, d.rule) == (DecisionKind.HOLD, "paused")
    with pytest.raises(InvalidTransition):
        run.command(ManualCommand.PAUSE)
    d = run.command(ManualCommand.RESUME)
    assert d.after.phase is Phase.PROGRESSING and d.after.paused_from is None
    assert d.after.step_index == 0 and d.routing is None
    with pytest.raises(InvalidTransition):
        run.command(ManualCommand.RESUME)


def test_manual_promote_and_rollback() -> None:
    run = Run()
    d = run.command(ManualCommand.PROMOTE)
    assert d.after.phase is Phase.PROMOTED
    assert d.routing is not None and d.routing.candidate_weight_percent == 100.0
    assert d.routing.stable_version == "v2"
    run = Run()
    run.command(ManualCommand.PAUSE)
    d = run.command(ManualCommand.ROLLBACK)
    assert d.after.phase is Phase.ROLLED_BACK
    assert d.routing is not None and d.routing.candidate_weight_percent == 0.0


def test_abort_from_pending_and_from_a_running_rollout() -> None:
    pending = pending_state(SPEC, 0)
    d = apply_command(pending, SPEC, ManualCommand.ABORT, 10)
    assert d.after.phase is Phase.ABORTED and d.routing is None
    with pytest.raises(InvalidTransition):
        apply_command(pending, SPEC, ManualCommand.PROMOTE, 10)
    with pytest.raises(InvalidTransition):
        evaluate(pending, SPEC, None, None, None, 10)
    run = Run()
    d = run.command(ManualCommand.ABORT)
    assert d.after.phase is Phase.ABORTED
    assert d.routing is not None and d.routing.candidate_weight_percent == 0.0


@pytest.mark.parametrize(
    "ending", [ManualCommand.PROMOTE, ManualCommand.ROLLBACK, ManualCommand.ABORT]
)
def test_terminal_rollouts_refuse_everything(ending: ManualCommand) -> None:
    run = Run()
    run.command(ending)
    for command in ManualCommand:
        with pytest.raises(RolloutFinished):
            run.command(command)
    with pytest.raises(RolloutFinished):
        run.window()


def test_inputs_must_match_the_spec_and_one_window() -> None:
    run = Run()
    b, c = window_pair(run.t)
    with pytest.raises(InputMismatch):
        evaluate(run.state, SPEC, c, b, None, run.t)
    with pytest.raises(InputMismatch):
        evaluate(run.state, SPEC, b, replace(c, window_start_ms=c.window_start_ms + 2_000), None, 0)
    with pytest.raises(InputMismatch):
        evaluate(run.state, replace(SPEC, rollout_id="other"), b, c, None, run.t)


def test_decisions_are_deterministic_values() -> None:
    a, b = Run(), Run()
    for run in (a, b):
        run.window(p99=35.0)
        run.window(cand_n=25, errors=2, base_errors=10)
        run.command(ManualCommand.PAUSE)
    assert a.decisions == b.decisions
