"""The bake period after a promotion: the gates keep watching the promoted version.

A rollout whose spec sets ``bake_s`` is not finished when its candidate reaches
100 %: the promotion moves it to BAKING (routing 100 % to the candidate, the
candidate the stable version) and the gates keep judging the promoted version
until ``bake_s`` has passed. A regression rolls it back to the previous stable
version; a clean bake ends it PROMOTED (rule ``baked``).

**The reference: the previous stable version's last window, frozen.** At the
promotion the controller keeps the baseline window it has just judged (the
baseline's traffic over the last window before it left the routing table) in
the rollout's state, and every bake window of the promoted version is judged
against that window. The other choice, keeping the previous stable version warm
with a small weight, was left aside: it would hold back traffic the promotion
gave to the candidate, keep two versions serving (and their replicas) through
the bake, and a "promoted" table would still split; the frozen window costs
nothing, is in the state (so a restarted engine resumes the bake from the
compacted rollouts topic with the same reference), and is what the candidate
was found equal to when it was promoted. What it cannot see is a change of the
traffic itself during the bake (a busier hour); the gates' ratio tests and the
severe thresholds are set for regressions of the version, and an operator can
always roll back by hand.

Which gates: the fixed-horizon latency and error gates on each window (a
sequential test would count the same frozen reference over and over, so
``GateMode.SEQUENTIAL`` rollouts bake on the fixed gates), the length-drift gate
for generations, and the spec's metric gates. A failure counts as during the
rollout (``failures_to_rollback`` windows that do not overlap, a severe one at
once). The candidate's liveness is still checked (an unresponsive promoted
version rolls back); the previous stable version, out of the table, is not.

Everything here is pure: the controller (:mod:`~graylane.policy_engine.logic.rollout`)
turns a :class:`BakeJudgement` into its decision.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from graylane.policy_engine.logic.gates import GateResult, Verdict
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.spec import GateMode, Gates

__all__ = [
    "BakeAction",
    "BakeJudgement",
    "bake_gates",
    "bake_left_ms",
    "bake_over",
    "bake_reference",
    "judge_bake",
]


class BakeAction(Enum):
    """What one bake evaluation leads to."""

    WATCH = "watch"
    """Keep baking: nothing failed (or nothing could be judged yet) and time is left."""
    FAILED = "failed"
    """A gate failed on a window with enough samples: counted, and rolled back when it
    is severe or the failures reach ``failures_to_rollback``."""
    BAKED = "baked"
    """The bake period is over and its last window did not fail: the promotion is final."""


@dataclass(frozen=True, kw_only=True)
class BakeJudgement:
    """One bake evaluation: its action, the gate results behind it, and why."""

    action: BakeAction
    reason: str
    failed: tuple[GateResult, ...] = ()
    results: tuple[GateResult, ...] = ()


def bake_gates(gates: Gates) -> Gates:
    """The rollout's gates as they judge a bake window (fixed-horizon, see the module)."""
    return gates if gates.mode is GateMode.FIXED else replace(gates, mode=GateMode.FIXED)


def bake_reference(inputs: tuple[WindowStats, ...], baseline: str) -> WindowStats | None:
    """The previous stable's window among a promotion's inputs (None without one).

    Its topic lag and worker count are left out: they are of that moment, no gate reads
    them, and the state on the wire has no room for them, so the reference a restarted
    engine reads back is the one kept here.
    """
    for stats in inputs:
        if stats.version == baseline and stats.requests > 0:
            return replace(stats, lag=0, workers=0)
    return None


def bake_left_ms(bake_until_ms: int, now_ms: int) -> int:
    """How long the bake has to go (0 once over)."""
    return max(0, bake_until_ms - now_ms)


def bake_over(bake_until_ms: int, now_ms: int) -> bool:
    return now_ms >= bake_until_ms


def judge_bake(
    results: list[GateResult],
    *,
    bake_until_ms: int,
    now_ms: int,
    judged: str,
) -> BakeJudgement:
    """Decide on one bake window from its gate results.

    ``results`` is empty when the window could not be judged (``judged`` says why):
    the bake holds until its end, and ends baked then, as no window failed. A failure
    wins over the end of the period: a regression seen in the last window rolls back.
    """
    left_s = bake_left_ms(bake_until_ms, now_ms) / 1000
    failed = tuple(r for r in results if r.verdict is Verdict.FAIL)
    summary = " | ".join(f"{r.rule} {r.verdict.value}: {r.detail}" for r in results) or judged
    if failed:
        return BakeJudgement(
            action=BakeAction.FAILED, reason=summary, failed=failed, results=tuple(results)
        )
    if bake_over(bake_until_ms, now_ms):
        return BakeJudgement(
            action=BakeAction.BAKED, reason=f"bake period over: {summary}", results=tuple(results)
        )
    return BakeJudgement(
        action=BakeAction.WATCH,
        reason=f"baking, {left_s:g} s left: {summary}",
        results=tuple(results),
    )
