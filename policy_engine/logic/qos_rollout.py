"""QoS during a rollout: the candidate runs the baseline's variant (pure).

Both sides of every gate then run the same precision, so a precision change is
never mistaken for a regression (or hides one); see :mod:`.qos`.
"""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.logic.qos_state import QosDecision, QosDecisionKind, QosState
from graylane.rollouts.errors import InputMismatch
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule

__all__ = ["qos_during_rollout"]


def qos_during_rollout(
    candidate: QosState,
    baseline: QosState,
    now_ms: int,
    candidate_policy: QosPolicy | None = None,
) -> QosDecision:
    """The candidate's variant while a rollout of its model runs: the baseline's.

    ``candidate_policy`` (when known) says which variants the candidate has;
    the baseline's own controller keeps running with :func:`evaluate_qos`.
    """
    if candidate.model != baseline.model:
        raise InputMismatch(f"candidate of {candidate.model} with baseline of {baseline.model}")
    target = baseline.active_variant
    cleared = replace(candidate, breach_since_ms=None, calm_since_ms=None)

    def decide(
        kind: QosDecisionKind, rule: DecisionRule, reason: str, after: QosState
    ) -> QosDecision:
        return QosDecision(
            kind=kind, rule=rule, reason=reason, at_ms=now_ms, before=candidate, after=after
        )

    if candidate.active_variant == target:
        return decide(
            QosDecisionKind.HOLD,
            DecisionRule.LIKE_FOR_LIKE,
            f"candidate runs {target} like the baseline",
            cleared,
        )
    if candidate_policy is not None:
        ladder = candidate_policy.ladder
        if target not in ladder or ladder.index(target) > candidate_policy.floor_index:
            return decide(
                QosDecisionKind.HOLD,
                DecisionRule.LIKE_FOR_LIKE_UNAVAILABLE,
                f"baseline runs {target}, which the candidate cannot run; candidate stays on "
                f"{candidate.active_variant}: the comparison is not like-for-like",
                cleared,
            )
    after = replace(cleared, active_variant=target, last_change_ms=now_ms)
    return decide(
        QosDecisionKind.SET,
        DecisionRule.FOLLOW_BASELINE,
        f"{candidate.active_variant} -> {target}: the candidate follows the baseline's variant",
        after,
    )
