"""Which rollout decisions are transitions worth a notification (pure).

One rollout decision is at most one transition. HOLDs are transitions only when a
gate holds the rollout (an inconclusive or failing gate, a drift, an unresponsive
baseline, a backlog), when an approval step pauses or its pause ends, or when an
applied document updates the spec; a hold for samples, dwell or data is not. The
engine records a HOLD only when its rule changes, so a hold notifies once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from graylane.rollouts.spec import WebhookTarget
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, ManualCommand, Phase

__all__ = ["Transition", "TransitionKind", "transition_kind"]


class TransitionKind(Enum):
    """What happened to a rollout, as a notification names it (CloudEvents ``type`` suffix)."""

    STARTED = "started"
    STEP_ADVANCED = "step_advanced"
    PAUSED = "paused"
    RESUMED = "resumed"
    HELD = "held"
    GATE_FAILED = "gate_failed"
    ROLLED_BACK = "rolled_back"
    PROMOTED = "promoted"
    BAKED = "baked"
    """The bake period after the promotion ended without a regression."""
    ROLLED_BACK_IN_BAKE = "rolled_back_in_bake"
    """A regression during the bake period: back to the previous stable version."""
    ABORTED = "aborted"
    UPDATED = "updated"


_NOT_A_TRANSITION = frozenset(
    {
        DecisionRule.NO_DATA,
        DecisionRule.MIN_SAMPLES,
        DecisionRule.MIN_DWELL,
        DecisionRule.PAUSED,
        DecisionRule.ALL_GATES_PASSED,
        DecisionRule.BAKING,
    }
)

_BY_COMMAND = {
    ManualCommand.PAUSE: TransitionKind.PAUSED,
    ManualCommand.RESUME: TransitionKind.RESUMED,
    ManualCommand.PROMOTE: TransitionKind.PROMOTED,
    ManualCommand.ROLLBACK: TransitionKind.ROLLED_BACK,
    ManualCommand.ABORT: TransitionKind.ABORTED,
}


def transition_kind(
    kind: DecisionKind,
    rule: DecisionRule | None,
    after: Phase | None,
    before: Phase | None = None,
) -> TransitionKind | None:
    """The transition a rollout decision is, or None when it is none.

    A promotion that starts a bake is PROMOTED, its clean end (rule ``baked``) BAKED;
    a rollback from BAKING (by a gate or by command) is ROLLED_BACK_IN_BAKE.
    """
    if kind is DecisionKind.STARTED:
        return TransitionKind.STARTED
    if kind is DecisionKind.ADVANCE:
        return TransitionKind.STEP_ADVANCED
    if kind is DecisionKind.PROMOTE:
        return TransitionKind.BAKED if rule is DecisionRule.BAKED else TransitionKind.PROMOTED
    if before is Phase.BAKING and after is Phase.ROLLED_BACK:
        return TransitionKind.ROLLED_BACK_IN_BAKE
    if kind is DecisionKind.ROLLBACK:
        return TransitionKind.ROLLED_BACK
    if kind is DecisionKind.GATE_FAILED:
        return TransitionKind.ABORTED if after is Phase.ABORTED else TransitionKind.GATE_FAILED
    if kind is DecisionKind.MANUAL:
        command = rule.command if rule is not None else None
        return _BY_COMMAND.get(command) if command is not None else None
    if kind is DecisionKind.HOLD and rule is not None:
        if rule is DecisionRule.APPROVAL_PAUSE:
            return TransitionKind.PAUSED
        if rule is DecisionRule.METRIC_INCONCLUSIVE and after is Phase.PAUSED:
            return TransitionKind.PAUSED  # a metric gate held inconclusive past its time
        if rule is DecisionRule.APPROVAL_ELAPSED:
            return TransitionKind.RESUMED
        if rule is DecisionRule.SPEC_UPDATED:
            return TransitionKind.UPDATED
        if rule not in _NOT_A_TRANSITION:
            return TransitionKind.HELD
    return None


@dataclass(frozen=True, kw_only=True)
class Transition:
    """One transition of one rollout, with what a receiver needs to act on it."""

    kind: TransitionKind
    decision_id: str
    rollout_id: str
    model: str
    baseline: str
    candidate: str
    phase: Phase
    step: int
    steps: int
    candidate_weight_percent: float
    rule: str
    reason: str
    actor: str
    at_ms: int
    document_digest: str = ""
    webhooks: tuple[WebhookTarget, ...] = ()
