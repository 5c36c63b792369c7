"""A running rollout takes an applied document's new spec (pure).

Only what :mod:`graylane.rollouts.revision` allows changes. The rollout keeps its
phase and step; a canary whose current step's weight is different in the new
schedule moves to that weight at once (one routing intent, the step's timers and
evidence start over). A step index beyond the new schedule's canary steps comes
down to its last step below 100 %. A paused rollout keeps its frozen weight: the
new weight applies when it moves on. A baking rollout's bake period, changed, counts
from its promotion.
"""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.logic.rollout import (
    Decision,
    RolloutState,
    check_rollout,
    transition,
)
from graylane.rollouts.errors import InvalidTransition
from graylane.rollouts.revision import refused, spec_changes
from graylane.rollouts.spec import RolloutSpec, Strategy
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase

__all__ = ["revise"]


def revise(
    state: RolloutState, live: RolloutSpec, applied: RolloutSpec, now_ms: int, *, note: str = ""
) -> Decision:
    """The decision that puts ``applied`` in place of ``live``; raises when it may not."""
    check_rollout(state, live)
    changes = spec_changes(live, applied)
    problem = refused(changes)
    if problem is not None:
        raise InvalidTransition(problem)
    spec = replace(applied, created_at_ms=live.created_at_ms, created_by=live.created_by)
    what = ", ".join(c.field for c in changes) or "nothing"
    digest = f" (document {applied.document_digest[:19]})" if applied.document_digest else ""
    reason = f"spec updated: {what}{digest}" + (f"; {note}" if note else "")
    step_index = state.step_index
    if spec.strategy is not Strategy.AB_SPLIT:
        step_index = min(step_index, max(len(spec.steps) - 2, 0))
    weight = spec.steps[step_index].weight_percent
    moves = (
        state.phase is Phase.PROGRESSING
        and spec.strategy is not Strategy.AB_SPLIT
        and (step_index != state.step_index or weight != state.candidate_weight_percent)
    )
    if moves:
        return transition(
            state,
            spec,
            now_ms,
            DecisionKind.HOLD,
            DecisionRule.SPEC_UPDATED,
            f"{reason}; step {step_index + 1}/{len(spec.steps)} now at {weight:g}%",
            phase=Phase.PROGRESSING,
            step_index=step_index,
            weight=weight,
            shadow_share=state.shadow_share,
            note=note,
        )
    after = replace(state, step_index=step_index, last_reason=reason, updated_ms=now_ms)
    if state.phase is Phase.BAKING:
        # A new bake period counts from the promotion (0: the bake ends at the next tick).
        after = replace(after, bake_until_ms=state.phase_started_ms + round(spec.bake_s * 1000))
    return Decision(
        kind=DecisionKind.HOLD,
        rule=DecisionRule.SPEC_UPDATED,
        reason=reason,
        at_ms=now_ms,
        before=state,
        after=after,
        note=note,
    )
