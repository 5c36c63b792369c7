"""The evaluation gate of a rollout step: a candidate that answers worse than the baseline
on the step's evaluation set by more than the allowance is held, one within it moves on,
and the scores travel in the audit record and replay to the same decision."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.evaluation.scoring import ItemScore
from graylane.evaluation.summary import compare, summarize
from graylane.policy_engine.core import EVALUATION_RETRY_MS, PolicyCore
from graylane.policy_engine.logic.rollout import Decision, RolloutSignals, evaluate, start
from graylane.policy_engine.logic.step_evaluation import (
    EvaluationOutcome,
    EvaluationVerdict,
    evaluation_due,
    judge_evaluation,
)
from graylane.policy_engine.messages import Command, CommandKind
from graylane.policy_engine.wire import decision_to_audit, signals_from_audit
from graylane.rollouts.errors import InvalidSpec
from graylane.rollouts.pb import rollout_spec_from_pb, rollout_spec_to_pb
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step, StepEvaluation, Strategy
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase
from graylane.v1 import audit_pb2
from tests.support.rollout_run import WINDOW, window_pair

GATE = StepEvaluation("sets/gate.jsonl", 0.02, "ab" * 32)
SPEC = RolloutSpec(
    rollout_id="r-eval",
    model="m",
    baseline="v1",
    candidate="v2",
    steps=(Step(10.0, 100, 30.0), Step(50.0, 100, 30.0, evaluation=GATE), Step(100.0, 0, 0.0)),
    gates=Gates(mode=GateMode.FIXED),
)


def outcome(base: list[float], cand: list[float], **changes: object) -> EvaluationOutcome:
    """An evaluation of step 2 whose items scored ``base`` and ``cand``."""
    b = [ItemScore(f"i{i}", s, s >= 0.5) for i, s in enumerate(base)]
    c = [ItemScore(f"i{i}", s, s >= 0.5) for i, s in enumerate(cand)]
    found = EvaluationOutcome(
        rollout_id=SPEC.rollout_id,
        step_index=1,
        gate=GATE,
        set_sha256=GATE.set_sha256,
        baseline=summarize("v1", b),
        candidate=summarize("v2", c),
        comparison=compare("v1", b, "v2", c),
        finished_at_ms=5,
    )
    return replace(found, **changes)  # type: ignore[arg-type]


SAME = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0] * 3
WORSE = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0] * 3  # two of seven passes lost


def drive(evaluation: EvaluationOutcome | None, windows: int = 6) -> list[Decision]:
    """Healthy windows at step 1 until its samples and dwell are met."""
    decisions = [start(SPEC, 0)]
    t = 0
    for _ in range(windows):
        baseline, candidate = window_pair(t, 1000, 200)
        t += WINDOW
        decisions.append(
            evaluate(
                decisions[-1].after,
                SPEC,
                baseline,
                candidate,
                None,
                t,
                RolloutSignals(evaluation=evaluation),
            )
        )
        if decisions[-1].kind is not DecisionKind.HOLD:
            break
    return decisions


def test_an_advance_onto_a_step_with_an_evaluation_waits_for_its_scores() -> None:
    last = drive(None)[-1]
    assert last.kind is DecisionKind.HOLD
    assert last.rule is DecisionRule.EVALUATION_PENDING
    assert last.after.candidate_weight_percent == 10.0
    assert "sets/gate.jsonl" in last.reason


def test_a_candidate_scoring_lower_by_more_than_allowed_is_held_not_rolled_back() -> None:
    dropped = outcome(SAME, WORSE)
    assert judge_evaluation(dropped)[0] is EvaluationVerdict.DROPPED
    decisions = drive(dropped)
    last = decisions[-1]
    assert last.kind is DecisionKind.HOLD and last.rule is DecisionRule.EVALUATION_DROP
    assert last.after.candidate_weight_percent == 10.0 and last.after.phase is Phase.PROGRESSING
    assert "-0.200" in last.reason and "p=" in last.reason  # the difference and its p-value
    assert not [d for d in decisions if d.kind is DecisionKind.ROLLBACK]


def test_a_candidate_within_the_allowance_moves_on_and_the_audit_carries_its_scores() -> None:
    within = outcome(SAME, SAME)
    last = drive(within)[-1]
    assert last.kind is DecisionKind.ADVANCE and last.after.candidate_weight_percent == 50.0
    record = decision_to_audit(last, SPEC)
    assert record.evaluation.verdict == audit_pb2.EVALUATION_PASSED
    assert record.evaluation.baseline.mean == pytest.approx(0.7)
    assert record.evaluation.candidate.ci_low < 0.7 < record.evaluation.candidate.ci_high
    assert record.evaluation.set_sha256 == GATE.set_sha256
    signals = signals_from_audit(record, "v1", "v2")
    assert signals is not None and signals.evaluation is not None
    assert judge_evaluation(signals.evaluation) == judge_evaluation(within)


def test_the_audit_of_a_held_candidate_replays_to_the_same_hold() -> None:
    held = drive(outcome(SAME, WORSE))[-1]
    record = decision_to_audit(held, SPEC)
    assert record.rule == DecisionRule.EVALUATION_DROP
    assert record.evaluation.verdict == audit_pb2.EVALUATION_DROPPED
    assert record.evaluation.difference == pytest.approx(-0.2)
    assert record.evaluation.difference_ci_low < record.evaluation.difference
    signals = signals_from_audit(record, "v1", "v2")
    assert signals is not None and signals.evaluation is not None
    assert judge_evaluation(signals.evaluation)[0] is EvaluationVerdict.DROPPED


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"problem": "gate.jsonl: cannot be read"}, "cannot be read"),
        ({"set_sha256": "cd" * 32}, "changed since"),
    ],
)
def test_an_evaluation_that_cannot_judge_holds(changes: dict[str, object], why: str) -> None:
    last = drive(outcome(SAME, SAME, **changes))[-1]
    assert last.rule is DecisionRule.EVALUATION_UNUSABLE and why in last.reason


def test_a_version_that_answers_too_few_items_is_not_judged() -> None:
    from graylane.evaluation.scoring import ItemScore as Score

    b = [Score(f"i{i}", 1.0, True) for i in range(10)]
    c = [Score(f"i{i}", 0.0, False, error=i < 3) for i in range(10)]
    found = outcome(SAME, SAME, candidate=summarize("v2", c), comparison=compare("v1", b, "v2", c))
    verdict, reason = judge_evaluation(found)
    assert verdict is EvaluationVerdict.UNUSABLE and "answered 7 of 10" in reason


def test_the_evaluation_is_due_from_the_step_before() -> None:
    assert evaluation_due(SPEC, Phase.PROGRESSING, 0) is not None
    due = evaluation_due(SPEC, Phase.PAUSED, 0, Phase.PROGRESSING)
    assert due is not None and due.step_index == 1 and due.gate == GATE
    assert evaluation_due(SPEC, Phase.PROGRESSING, 1) is None  # the promotion needs none


def test_the_core_asks_once_and_again_only_after_an_unusable_outcome() -> None:
    core = PolicyCore()
    core.on_command(Command(command_id="c1", kind=CommandKind.START, model="m", spec=SPEC), 0)
    assert [r.step_index for r in core.evaluations_due(1)] == [1]
    assert core.on_evaluation(outcome(SAME, WORSE))
    assert core.evaluations_due(2) == []
    assert core.on_evaluation(outcome(SAME, SAME, problem="broker gone", finished_at_ms=10))
    assert core.evaluations_due(11) == []
    assert [r.step_index for r in core.evaluations_due(10 + EVALUATION_RETRY_MS)] == [1]
    other = replace(outcome(SAME, SAME), rollout_id="r-other")
    assert not core.on_evaluation(other)


def test_specs_carry_their_evaluations_over_the_wire_and_refuse_misplaced_ones() -> None:
    assert rollout_spec_from_pb(rollout_spec_to_pb(SPEC)) == SPEC
    shadow_first = replace(
        SPEC,
        strategy=Strategy.SHADOW_THEN_CANARY,
        steps=(
            Step(10.0, evaluation=GATE),
            Step(100.0),
        ),
    )
    assert evaluation_due(shadow_first, Phase.SHADOWING, 0) is not None
    with pytest.raises(InvalidSpec, match="starts at its first step"):
        replace(SPEC, steps=(Step(10.0, evaluation=GATE), Step(100.0)))
    with pytest.raises(InvalidSpec, match="max_drop_vs_stable"):
        replace(SPEC, steps=(Step(10.0), Step(100.0, evaluation=StepEvaluation("s", 1.5))))
