"""A version's gate verdict, from the newest rollout decision about it (pure).

What Argo Rollouts' ``web`` metric provider and Flagger's webhook gates ask: may this
version go on? ``pass``: the gates passed (it advanced, was promoted, or holds only
for its dwell time or an approval). ``fail``: a gate failed or it was rolled back or
aborted. ``inconclusive``: no rollout decision about it yet, too little data, a gate
that cannot tell, a hold for samples or a pause. Inconclusive is never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase

__all__ = ["GateVerdict", "VersionVerdict", "verdict_of"]


class GateVerdict(Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, kw_only=True)
class VersionVerdict:
    verdict: GateVerdict
    reason: str
    rollout_id: str = ""
    rule: str = ""
    decided_at_ms: int = 0


_PASSING_HOLDS = frozenset(
    {DecisionRule.MIN_DWELL, DecisionRule.APPROVAL_PAUSE, DecisionRule.APPROVAL_ELAPSED}
)


def verdict_of(
    kind: DecisionKind | None,
    rule: DecisionRule | None,
    phase: Phase | None,
    *,
    rollout_id: str = "",
    reason: str = "",
    decided_at_ms: int = 0,
) -> VersionVerdict:
    """The verdict of the newest rollout decision (``kind`` None: there is none)."""

    def said(verdict: GateVerdict, why: str = "") -> VersionVerdict:
        return VersionVerdict(
            verdict=verdict,
            reason=why or reason,
            rollout_id=rollout_id,
            rule=str(rule) if rule is not None else "",
            decided_at_ms=decided_at_ms,
        )

    if kind is None:
        return said(GateVerdict.INCONCLUSIVE, "no rollout decision about this version on record")
    if phase in (Phase.ROLLED_BACK, Phase.ABORTED) or kind in (
        DecisionKind.ROLLBACK,
        DecisionKind.GATE_FAILED,
    ):
        return said(GateVerdict.FAIL)
    if kind in (DecisionKind.ADVANCE, DecisionKind.PROMOTE) or phase is Phase.PROMOTED:
        return said(GateVerdict.PASS)
    if kind is DecisionKind.HOLD and rule in _PASSING_HOLDS:
        return said(GateVerdict.PASS)
    return said(GateVerdict.INCONCLUSIVE)
