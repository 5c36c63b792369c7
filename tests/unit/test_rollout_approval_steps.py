"""Approval steps (``pause: {}`` / ``pause: {duration}``) and spec revision in the
rollout controller: a paused step waits for RESUME or its duration, the approval is
recorded once, and an applied spec changes only what may change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.policy_engine.logic.revision import revise
from graylane.rollouts.errors import InvalidTransition
from graylane.rollouts.revision import refused, spec_changes
from graylane.rollouts.spec import Gates, Step, StepPause
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, ManualCommand, Phase
from tests.support.rollout_run import SPEC, Run

PAUSED_STEPS = (
    Step(10.0, 10, 0.0, StepPause()),
    Step(50.0, 10, 0.0, StepPause(25.0)),
    Step(100.0),
)


def test_an_approval_step_waits_for_resume_then_advances() -> None:
    run = Run(replace(SPEC, steps=PAUSED_STEPS))
    paused = run.window()
    assert paused.rule == DecisionRule.APPROVAL_PAUSE
    assert paused.after.phase is Phase.PAUSED and paused.after.approval_step == 0
    # However long it waits and however good the windows, it does not move on.
    for _ in range(5):
        held = run.window()
        assert held.after.phase is Phase.PAUSED
        assert held.after.candidate_weight_percent == 10.0
    resumed = run.command(ManualCommand.RESUME)
    assert "approved step 1/3" in resumed.reason and "(ops)" in resumed.reason
    assert resumed.after.phase is Phase.PROGRESSING and resumed.after.approved_step == 0
    advanced = run.window()
    assert advanced.kind is DecisionKind.ADVANCE
    assert advanced.after.candidate_weight_percent == 50.0


def test_a_timed_pause_ends_by_itself_and_the_next_pass_advances() -> None:
    run = Run(replace(SPEC, steps=PAUSED_STEPS))
    run.window()
    run.command(ManualCommand.RESUME)
    run.window()  # to 50 %
    paused = run.window()
    assert paused.rule == DecisionRule.APPROVAL_PAUSE
    assert paused.after.pause_until_ms == paused.at_ms + 25_000
    rules = [run.window().rule for _ in range(4)]
    # 10 s windows: two holds inside the 25 s, then the pause ends, then the promotion.
    assert rules == [
        DecisionRule.PAUSED,
        DecisionRule.PAUSED,
        DecisionRule.APPROVAL_ELAPSED,
        DecisionRule.ALL_GATES_PASSED,
    ]
    assert run.state.phase is Phase.PROMOTED


def test_a_manual_pause_and_resume_does_not_approve_a_step() -> None:
    run = Run(replace(SPEC, steps=(Step(10.0, 300, 0.0, StepPause()), Step(100.0))))
    run.command(ManualCommand.PAUSE)
    run.command(ManualCommand.RESUME)
    assert run.state.approved_step == -1
    assert run.window().rule == DecisionRule.MIN_SAMPLES
    assert run.window().rule == DecisionRule.APPROVAL_PAUSE


def test_a_new_weight_schedule_moves_the_current_step_to_its_new_weight() -> None:
    run = Run()
    applied = replace(SPEC, steps=(Step(2.0, 50, 10.0), Step(20.0), Step(100.0)))
    decision = revise(run.state, SPEC, applied, run.t + 1)
    assert decision.rule == DecisionRule.SPEC_UPDATED
    assert decision.after.candidate_weight_percent == 2.0
    assert decision.routing is not None
    assert "steps" in decision.reason


def test_gates_alone_change_without_a_routing_change() -> None:
    run = Run()
    applied = replace(SPEC, gates=replace(SPEC.gates, max_p99_ratio=2.0))
    decision = revise(run.state, SPEC, applied, run.t + 1)
    assert decision.routing is None and decision.after.candidate_weight_percent == 1.0
    assert [c.field for c in spec_changes(SPEC, applied)] == ["gates.max_p99_ratio"]


@pytest.mark.parametrize("field", ["candidate", "baseline", "model"])
def test_what_identifies_a_rollout_may_not_change(field: str) -> None:
    applied = replace(SPEC, **{field: "other"})
    changes = spec_changes(SPEC, applied)
    assert refused(changes) is not None
    with pytest.raises(InvalidTransition):
        revise(Run().state, SPEC, applied, 2_000_000)


def test_the_same_spec_changes_nothing() -> None:
    assert spec_changes(SPEC, replace(SPEC, document_digest="sha256:x")) == ()
    assert spec_changes(SPEC, replace(SPEC, gates=Gates(**vars(SPEC.gates)))) == ()


def test_the_policy_engine_updates_a_running_spec_and_the_audit_replays() -> None:
    """An UPDATE_SPEC command: the audit keeps the spec before and after, replays the
    same, and a change of what identifies the rollout is refused on record."""
    from graylane.policy_engine.audit_replay import verify
    from graylane.policy_engine.core import PolicyCore
    from graylane.policy_engine.messages import (
        Command,
        CommandKind,
        CommandRejected,
        RolloutAudit,
    )
    from graylane.policy_engine.wire import audit_record_of

    core = PolicyCore()
    core.on_command(Command(kind=CommandKind.START, model="m", spec=SPEC), 1_000)
    applied = replace(SPEC, steps=(Step(3.0, 10, 0.0), Step(100.0)), document_digest="sha256:ab")
    update = Command(kind=CommandKind.UPDATE_SPEC, model="m", rollout_id="r1", spec=applied)
    outputs = core.on_command(update, 2_000)
    (audit,) = [o for o in outputs if isinstance(o, RolloutAudit)]
    record = audit_record_of(audit)
    assert record.rule == "spec_updated" and "sha256:ab" in record.reason
    assert record.rollout_before.spec.steps[0].weight_percent == 1.0
    assert record.rollout_after.spec.steps[0].weight_percent == 3.0
    assert record.rollout_after.candidate_weight_percent == 3.0
    assert verify([record]) == []
    assert core.rollouts.get("m").spec.steps == applied.steps  # type: ignore[union-attr]
    other = replace(update, spec=replace(applied, candidate="v3"))
    (refused_cmd,) = core.on_command(other, 3_000)
    assert isinstance(refused_cmd, CommandRejected) and "candidate" in refused_cmd.reason
