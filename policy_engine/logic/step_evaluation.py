"""The evaluation gate of a rollout step: the candidate's answers judged before traffic moves.

A step may require an evaluation (:class:`~graylane.rollouts.spec.StepEvaluation`): before
the rollout moves onto it, both versions answer the same evaluation set and the candidate
may score lower than the baseline by at most ``max_drop_vs_stable``. Running the set is
I/O (the engine's adapter sends it over the version topics); what comes back is an
:class:`EvaluationOutcome`, plain data, and everything decided from it is here:

- :func:`evaluation_due`: which step's evaluation a rollout needs now. It is due from the
  moment the rollout stands on the step before (or shadows, for the first step), so it
  runs while the step dwells and gathers samples, not after;
- :func:`judge_evaluation`: the verdict. The gate compares the mean of the paired
  per-item differences (candidate minus baseline, on the items both answered) with the
  allowance: the point estimate, as the operator wrote the allowance. Its 95 % interval
  and permutation p-value are on record beside it, so an auditor sees how sure the
  verdict was; a gate on the interval would pass every candidate of a small set, and a
  gate on the p-value would fail a candidate for a drop within the allowance;
- :func:`evaluation_hold`: what an advance onto a step with an evaluation meets: no
  outcome yet (``evaluation_pending``), an outcome that cannot judge
  (``evaluation_unusable``), a drop beyond the allowance (``evaluation_drop``), each a
  HOLD, never a rollback: a score on a set is evidence for a human, and the candidate
  keeps serving at its current weight. None: the evaluation passed, traffic may move.

An evaluation is unusable when its set could not be read or changed since the rollout
started, or when either version answered fewer than :data:`MIN_ANSWERED_SHARE` of the
items (a version that fails calls is not judged on what it would have answered).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from graylane.evaluation.summary import Comparison, Summary
from graylane.rollouts.spec import RolloutSpec, StepEvaluation
from graylane.rollouts.vocabulary import DecisionRule, Phase

__all__ = [
    "MIN_ANSWERED_SHARE",
    "EvaluationHold",
    "EvaluationOutcome",
    "EvaluationRequest",
    "EvaluationVerdict",
    "evaluation_due",
    "evaluation_hold",
    "judge_evaluation",
    "target_step",
]

MIN_ANSWERED_SHARE = 0.9
"""Each version must answer this share of the set's items for the evaluation to judge."""


class EvaluationVerdict(Enum):
    PASSED = "passed"
    DROPPED = "dropped"
    UNUSABLE = "unusable"


@dataclass(frozen=True, kw_only=True)
class EvaluationRequest:
    """One evaluation a rollout needs: its set answered by both versions."""

    rollout_id: str
    model: str
    baseline: str
    candidate: str
    step_index: int
    gate: StepEvaluation


@dataclass(frozen=True, kw_only=True)
class EvaluationOutcome:
    """What running an :class:`EvaluationRequest` found (plain data, from the adapter).

    ``problem`` is set (and the scores may be absent) when the set could not be used.
    """

    rollout_id: str
    step_index: int
    gate: StepEvaluation
    set_sha256: str = ""
    """The digest of the set as it was read."""
    baseline: Summary | None = None
    candidate: Summary | None = None
    comparison: Comparison | None = None
    problem: str = ""
    finished_at_ms: int = 0

    @property
    def verdict(self) -> EvaluationVerdict:
        return judge_evaluation(self)[0]


def target_step(spec: RolloutSpec, phase: Phase, step_index: int) -> int | None:
    """The step an advance from here moves onto (None: a promotion or nothing)."""
    if phase is Phase.SHADOWING:
        return 0
    if phase is Phase.PROGRESSING and step_index + 1 < len(spec.steps):
        return step_index + 1
    return None


def evaluation_due(
    spec: RolloutSpec, phase: Phase, step_index: int, paused_from: Phase | None = None
) -> EvaluationRequest | None:
    """The evaluation the rollout needs before its next advance, if its next step has one."""
    if phase is Phase.PAUSED and paused_from is not None:
        phase = paused_from
    target = target_step(spec, phase, step_index)
    if target is None:
        return None
    gate = spec.steps[target].evaluation
    if gate is None:
        return None
    return EvaluationRequest(
        rollout_id=spec.rollout_id,
        model=spec.model,
        baseline=spec.baseline,
        candidate=spec.candidate,
        step_index=target,
        gate=gate,
    )


def _answered(summary: Summary) -> float:
    return (summary.items - summary.errors) / summary.items if summary.items else 0.0


def judge_evaluation(outcome: EvaluationOutcome) -> tuple[EvaluationVerdict, str]:
    """The verdict on an evaluation and its reason in words."""
    gate = outcome.gate
    if outcome.problem:
        return EvaluationVerdict.UNUSABLE, outcome.problem
    if gate.set_sha256 and outcome.set_sha256 != gate.set_sha256:
        return EvaluationVerdict.UNUSABLE, (
            f"set {gate.set_path} changed since the rollout started "
            f"(sha256 {outcome.set_sha256[:12]}, expected {gate.set_sha256[:12]})"
        )
    base, cand, diff = outcome.baseline, outcome.candidate, outcome.comparison
    if base is None or cand is None or diff is None or diff.items == 0:
        return EvaluationVerdict.UNUSABLE, "no item was scored on both versions"
    for side in (base, cand):
        if _answered(side) < MIN_ANSWERED_SHARE:
            return EvaluationVerdict.UNUSABLE, (
                f"{side.target} answered {side.items - side.errors} of {side.items} items "
                f"(needs {MIN_ANSWERED_SHARE:.0%})"
            )
    scores = (
        f"baseline {base.mean:.3f} [{base.ci_low:.3f}, {base.ci_high:.3f}], "
        f"candidate {cand.mean:.3f} [{cand.ci_low:.3f}, {cand.ci_high:.3f}], "
        f"difference {diff.difference:+.3f} [{diff.ci_low:+.3f}, {diff.ci_high:+.3f}] "
        f"p={diff.p_value:.3g} over {diff.items} items"
    )
    if diff.drops_more_than(gate.max_drop_vs_stable):
        return EvaluationVerdict.DROPPED, (
            f"candidate scores {-diff.difference:.3f} below the baseline, more than the "
            f"allowed {gate.max_drop_vs_stable:g}: {scores}"
        )
    return EvaluationVerdict.PASSED, (
        f"within the allowed drop {gate.max_drop_vs_stable:g}: {scores}"
    )


@dataclass(frozen=True)
class EvaluationHold:
    """Why an advance waits on its step's evaluation."""

    rule: DecisionRule
    reason: str


def evaluation_hold(
    spec: RolloutSpec, target: int | None, outcome: EvaluationOutcome | None, rollout_id: str
) -> EvaluationHold | None:
    """What stops an advance onto step ``target`` (None: nothing, it may move)."""
    if target is None:
        return None
    gate = spec.steps[target].evaluation
    if gate is None:
        return None
    where = f"step {target + 1} ({spec.steps[target].weight_percent:g}%)"
    if outcome is None or outcome.rollout_id != rollout_id or outcome.step_index != target:
        return EvaluationHold(
            DecisionRule.EVALUATION_PENDING,
            f"{where} needs an evaluation on {gate.set_path}; waiting for its scores",
        )
    verdict, reason = judge_evaluation(outcome)
    if verdict is EvaluationVerdict.DROPPED:
        return EvaluationHold(
            DecisionRule.EVALUATION_DROP, f"{spec.candidate} held before {where}: {reason}"
        )
    if verdict is EvaluationVerdict.UNUSABLE:
        return EvaluationHold(
            DecisionRule.EVALUATION_UNUSABLE,
            f"{where}: the evaluation on {gate.set_path} cannot judge: {reason}",
        )
    return None
