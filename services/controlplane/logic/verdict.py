"""A version's gate verdict, for release tools that ask over HTTP: pass, fail or inconclusive.

Argo Rollouts' ``web`` metric provider and Flagger's webhooks poll one URL during their
own analysis; Graylane's policy engine has already judged the version on every gate
(latency, errors, TTFT/TPOT, liveness, agreement). The verdict folds the rollout's phase
and its newest decision into the one word those tools test:

- ``fail``: the rollout was rolled back or aborted, or its newest decision failed a gate;
- ``pass``: promoted, advanced, or held only for more samples or dwell time with every
  gate passing;
- ``inconclusive``: no decision yet, a hold for missing or incomparable data, a pause,
  an unresponsive baseline, or a newest decision older than ``max_age_ms`` (the policy
  engine may be down: silence is never a pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase

__all__ = ["LastDecision", "RolloutVerdict", "VerdictFacts", "VersionVerdict", "verdict_of"]


class RolloutVerdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


PASSING_HOLDS = frozenset(
    {DecisionRule.ALL_GATES_PASSED, DecisionRule.MIN_SAMPLES, DecisionRule.MIN_DWELL}
)
"""Holds that wait for more evidence or time while every gate passes."""


@dataclass(frozen=True)
class LastDecision:
    """The newest rollout decision on record (the audit)."""

    kind: DecisionKind
    rule: str
    reason: str
    decided_at_ms: int
    epoch: int


@dataclass(frozen=True)
class VerdictFacts:
    """What the verdict of ``version`` rests on: its rollout, and that rollout's newest
    decision (None before the first)."""

    model: str
    version: str
    rollout_id: str
    phase: Phase
    step_index: int
    candidate_weight_percent: float
    last: LastDecision | None


@dataclass(frozen=True)
class VersionVerdict:
    facts: VerdictFacts
    verdict: RolloutVerdict
    why: str
    age_ms: int | None
    """How old the newest decision is (None without one)."""


def verdict_of(facts: VerdictFacts, now_ms: int, max_age_ms: int) -> VersionVerdict:
    last = facts.last
    age = None if last is None else max(0, now_ms - last.decided_at_ms)

    def answer(verdict: RolloutVerdict, why: str) -> VersionVerdict:
        return VersionVerdict(facts, verdict, why, age)

    if facts.phase is Phase.ROLLED_BACK:
        return answer(RolloutVerdict.FAIL, "rolled back")
    if facts.phase is Phase.ABORTED:
        return answer(RolloutVerdict.FAIL, "aborted")
    if facts.phase is Phase.PROMOTED:
        return answer(RolloutVerdict.PASS, "promoted")
    if last is None or age is None:
        return answer(RolloutVerdict.INCONCLUSIVE, "no decision yet")
    if age > max_age_ms:
        return answer(
            RolloutVerdict.INCONCLUSIVE,
            f"the newest decision is {age / 1000:.0f} s old (more than "
            f"{max_age_ms / 1000:.0f} s): is the policy engine running?",
        )
    if facts.phase is Phase.PAUSED:
        return answer(RolloutVerdict.INCONCLUSIVE, "paused")
    if last.kind in (DecisionKind.GATE_FAILED, DecisionKind.ROLLBACK):
        return answer(RolloutVerdict.FAIL, f"{last.rule}: {last.reason}")
    if last.kind in (DecisionKind.ADVANCE, DecisionKind.PROMOTE):
        return answer(RolloutVerdict.PASS, f"{last.kind.value}: {last.reason}")
    if last.kind is DecisionKind.HOLD and last.rule in PASSING_HOLDS:
        return answer(RolloutVerdict.PASS, f"gates pass ({last.rule})")
    return answer(RolloutVerdict.INCONCLUSIVE, f"{last.kind.value} ({last.rule}): {last.reason}")
