"""The A/B scenarios of ``graylane bench decisions``: the outcome test on rated answers.

One simulated A/B rollout: ratings arrive as a Poisson stream of ``rated_per_s``,
split 50/50 between baseline and candidate (the AB_SPLIT weight); each is a thumbs
up with its arm's rate (baseline :data:`BASE_UP_RATE`). The policy engine looks every
2 s step: each look runs the controller's test (:func:`judge_outcomes`, at the
rollout's alpha) on the tallies so far, until a verdict or the horizon (the spec's
default ``ab_duration_s``, 1 h), where "no difference" ends it.

Scenarios: the candidate's thumbs-up rate 2 and 5 points lower (figure: time to the
baseline's win, and the share of runs decided within the horizon) and the same rate
(figure: the share of runs naming a winner, false winners, against alpha).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from graylane.policy_engine.logic.outcomes import (
    ArmTally,
    OutcomeTally,
    OutcomeVerdict,
    judge_outcomes,
)
from graylane.rollouts.spec import Gates, RolloutSpec

__all__ = [
    "BASE_UP_RATE",
    "OutcomeRun",
    "OutcomeScenario",
    "outcome_row",
    "simulate_outcomes",
]

BASE_UP_RATE = 0.70
LOOK_MS = 2_000
_DEFAULTS = RolloutSpec(rollout_id="bench", model="m", baseline="v1", candidate="v2")
HORIZON_S = _DEFAULTS.ab_duration_s
ALPHA = Gates().alpha


class OutcomeScenario(Enum):
    """The candidate's thumbs-up rate against the baseline's."""

    OUTCOME_MINUS_2PP = "outcome_-2pp"
    OUTCOME_MINUS_5PP = "outcome_-5pp"
    OUTCOME_EQUAL = "outcome_equal"

    @property
    def candidate_rate(self) -> float:
        shift = {"outcome_-2pp": 0.02, "outcome_-5pp": 0.05, "outcome_equal": 0.0}[self.value]
        return BASE_UP_RATE - shift


@dataclass(frozen=True)
class OutcomeRun:
    verdict: OutcomeVerdict
    decided_s: float
    """Seconds from the start to the verdict (the horizon for no difference)."""
    rated: int


def simulate_outcomes(
    scenario: OutcomeScenario, rated_per_s: float, seed: int, *, horizon_s: float = HORIZON_S
) -> OutcomeRun:
    rng = np.random.default_rng(seed)
    looks = int(horizon_s * 1000 // LOOK_MS)
    per_look = rng.poisson(rated_per_s * LOOK_MS / 1000, looks)
    n = int(per_look.sum())
    candidate = rng.random(n) < 0.5
    up = rng.random(n) < np.where(candidate, scenario.candidate_rate, BASE_UP_RATE)
    ends = np.cumsum(per_look) - 1
    cand_n, cand_up = np.cumsum(candidate), np.cumsum(candidate & up)
    base_up = np.cumsum(~candidate & up)
    for look, end in enumerate(ends):
        if end < 0:
            continue
        last = look == looks - 1
        rated, c_n, c_up, b_up = (
            int(end) + 1,
            int(cand_n[end]),
            int(cand_up[end]),
            int(base_up[end]),
        )
        tally = OutcomeTally(
            baseline=ArmTally(rated - c_n, float(b_up), float(b_up)),
            candidate=ArmTally(c_n, float(c_up), float(c_up)),
        )
        test = judge_outcomes(tally, ALPHA, at_horizon=last)
        if test.decided:
            return OutcomeRun(test.verdict, (look + 1) * LOOK_MS / 1000, rated)
    return OutcomeRun(OutcomeVerdict.NO_DIFFERENCE, horizon_s, n)


def outcome_row(scenario: OutcomeScenario, runs: list[OutcomeRun]) -> dict[str, object]:
    """``runs``; ``baseline_won`` / ``candidate_won`` / ``no_difference``;
    ``decide_s_p50`` / ``decide_s_p95`` and ``rated_p50`` over the runs with a winner;
    ``false_winner_rate`` (equal rates: the share naming any winner)."""
    won = [r for r in runs if r.verdict is not OutcomeVerdict.NO_DIFFERENCE]
    times = [r.decided_s for r in won]
    row: dict[str, object] = {
        "runs": len(runs),
        "baseline_won": sum(r.verdict is OutcomeVerdict.CANDIDATE_WORSE for r in runs),
        "candidate_won": sum(r.verdict is OutcomeVerdict.CANDIDATE_BETTER for r in runs),
        "no_difference": len(runs) - len(won),
        "decide_s_p50": float(np.percentile(times, 50)) if times else None,
        "decide_s_p95": float(np.percentile(times, 95)) if times else None,
        "rated_p50": float(np.percentile([r.rated for r in won], 50)) if won else None,
    }
    if scenario is OutcomeScenario.OUTCOME_EQUAL:
        row["false_winner_rate"] = len(won) / len(runs) if runs else 0.0
    return row
