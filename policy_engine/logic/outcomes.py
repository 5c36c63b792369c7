"""The A/B test on user outcomes: an anytime-valid test of the difference in outcome rates.

Each rated answer gives an outcome in ``[0, 1]`` (thumbs up 1, down 0, or a score).
Per arm the tally keeps the count, the sum and the sum of squares, so a thumbs-up
rate and a mean score are tested alike. The test is the mixture sequential
probability ratio test of Johari, Pekelis and Walsh ("Always valid inference",
2017), the one behind always-valid A/B p-values: with ``theta`` the candidate's
mean minus the baseline's and ``V`` the plug-in variance of that difference,

    log L = 1/2 log(V / (V + tau^2)) + tau^2 theta^2 / (2 V (V + tau^2))

is a likelihood ratio mixed over a normal prior N(0, tau^2) on the true
difference; ``L >= 1/alpha`` rejects "no difference" with a false-winner rate at
most ``alpha`` however often it is looked at (asymptotically: the normal
approximation wants a few dozen ratings per arm, hence :data:`MIN_RATED_PER_ARM`).
Its dual is a confidence sequence for the difference, reported with each verdict.
``tau`` (:data:`MIXTURE_TAU`, 0.05) is the scale of differences the test is tuned
to find fastest: a few points of thumbs-up rate.

The verdict names a winner when the test rejects; at the rollout's horizon without
a rejection it is :attr:`OutcomeVerdict.NO_DIFFERENCE`. Everything is a function of
the tallies, so a recorded tally replays to the same verdict.

:class:`OutcomeLedger` is the join: each :class:`RatedOutcome` (from the outcomes
topic) goes to the arm of the version that served it; an outcome of another version
is passed over as unjoined, a second rating of the same answer as a duplicate (the
first one counts, whichever gateway replica took it). The rated ids it remembers are
bounded (:data:`MAX_REMEMBERED`); past the bound, outcomes are passed over too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "MAX_REMEMBERED",
    "MIN_RATED_PER_ARM",
    "MIXTURE_TAU",
    "ArmTally",
    "OutcomeLedger",
    "OutcomeTally",
    "OutcomeTest",
    "OutcomeVerdict",
    "RatedOutcome",
    "judge_outcomes",
]

MIXTURE_TAU = 0.05
"""Standard deviation of the mixing prior on the difference of rates."""

MIN_RATED_PER_ARM = 50
"""Ratings each arm needs before the test may reject (the normal approximation)."""

MAX_REMEMBERED = 1_000_000
"""Rated request ids one rollout remembers (about 100 MB at most): far past any horizon."""

_VARIANCE_FLOOR = 1e-4
"""Per-rating variance floor: an arm rated all up (or all down) is not certain."""


class OutcomeVerdict(Enum):
    """Where the outcome test stands."""

    UNDECIDED = "undecided"
    CANDIDATE_BETTER = "candidate_better"
    CANDIDATE_WORSE = "candidate_worse"
    NO_DIFFERENCE = "no_difference"
    """The horizon came without a rejection."""


@dataclass(frozen=True)
class ArmTally:
    """The outcomes of one arm: how many, their sum and their sum of squares."""

    rated: int = 0
    total: float = 0.0
    squares: float = 0.0

    def add(self, value: float) -> ArmTally:
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"an outcome is within [0, 1], not {value!r}")
        return ArmTally(self.rated + 1, self.total + value, self.squares + value * value)

    @property
    def mean(self) -> float:
        return self.total / self.rated if self.rated else 0.0

    @property
    def variance(self) -> float:
        """The per-rating variance (floored)."""
        if self.rated == 0:
            return 0.25
        return max(_VARIANCE_FLOOR, self.squares / self.rated - self.mean**2)


@dataclass(frozen=True)
class OutcomeTally:
    """Both arms of one A/B rollout, and the outcomes passed over (not in the test)."""

    baseline: ArmTally = ArmTally()
    candidate: ArmTally = ArmTally()
    unjoined: int = 0
    """Outcomes of a version that is neither arm (or past the remembered bound)."""
    duplicates: int = 0
    """Second ratings of an answer already counted."""

    @property
    def rated(self) -> int:
        return self.baseline.rated + self.candidate.rated


@dataclass(frozen=True)
class OutcomeTest:
    """The test's verdict and its evidence (what the audit records)."""

    verdict: OutcomeVerdict
    tally: OutcomeTally
    difference: float
    """Candidate mean minus baseline mean."""
    log_likelihood_ratio: float
    threshold: float
    """``log(1 / alpha)``: the ratio's bar."""
    low: float
    high: float
    """The confidence sequence for the difference at ``1 - alpha`` (+-1 before any data)."""

    @property
    def decided(self) -> bool:
        return self.verdict is not OutcomeVerdict.UNDECIDED

    def describe(self) -> str:
        b, c = self.tally.baseline, self.tally.candidate
        return (
            f"outcomes {self.verdict.value}: candidate {c.mean:.3f} ({c.rated} rated) vs "
            f"baseline {b.mean:.3f} ({b.rated} rated), difference {self.difference:+.3f} "
            f"in [{self.low:+.3f}, {self.high:+.3f}], log LR {self.log_likelihood_ratio:.2f} "
            f"of {self.threshold:.2f}"
        )


def judge_outcomes(
    tally: OutcomeTally, alpha: float, *, at_horizon: bool = False, tau: float = MIXTURE_TAU
) -> OutcomeTest:
    """The mixture SPRT on ``tally``; ``at_horizon``: no rejection ends as no difference."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha {alpha} must be within (0, 1)")
    b, c = tally.baseline, tally.candidate
    threshold = math.log(1.0 / alpha)
    no_rejection = OutcomeVerdict.NO_DIFFERENCE if at_horizon else OutcomeVerdict.UNDECIDED
    if b.rated == 0 or c.rated == 0:
        return OutcomeTest(no_rejection, tally, 0.0, 0.0, threshold, -1.0, 1.0)
    theta = c.mean - b.mean
    v = b.variance / b.rated + c.variance / c.rated
    t2 = tau * tau
    log_lr = 0.5 * math.log(v / (v + t2)) + t2 * theta * theta / (2.0 * v * (v + t2))
    half = math.sqrt(v * (v + t2) / t2 * (2.0 * threshold + math.log((v + t2) / v)))
    low, high = max(-1.0, theta - half), min(1.0, theta + half)
    enough = min(b.rated, c.rated) >= MIN_RATED_PER_ARM
    if enough and log_lr >= threshold:
        verdict = OutcomeVerdict.CANDIDATE_BETTER if theta > 0 else OutcomeVerdict.CANDIDATE_WORSE
    else:
        verdict = no_rejection
    return OutcomeTest(verdict, tally, theta, log_lr, threshold, low, high)


@dataclass(frozen=True, kw_only=True)
class RatedOutcome:
    """One rated answer: who served it, who rated it, and how (within [0, 1])."""

    request_id: str
    model: str
    version: str
    tenant: str
    value: float
    rated_at_ms: int = 0


class OutcomeLedger:
    """The outcomes of one A/B rollout, joined to its arms by the version that served."""

    def __init__(
        self,
        baseline: str,
        candidate: str,
        *,
        remember: int = MAX_REMEMBERED,
        tally: OutcomeTally | None = None,
    ) -> None:
        """``tally``: where a restarted engine's rollout stood (the ids it had are gone)."""
        self.baseline = baseline
        self.candidate = candidate
        self.tally = tally or OutcomeTally()
        self._remember = remember
        self._rated: set[str] = set()

    def add(self, outcome: RatedOutcome) -> bool:
        """Count ``outcome`` in its arm; False when it was passed over (see the tally)."""
        t = self.tally
        if outcome.request_id in self._rated:
            self.tally = replace(t, duplicates=t.duplicates + 1)
            return False
        arm = {self.baseline: "baseline", self.candidate: "candidate"}.get(outcome.version)
        if arm is None or len(self._rated) >= self._remember:
            self.tally = replace(t, unjoined=t.unjoined + 1)
            return False
        if arm == "baseline":  # ArmTally.add refuses a value outside [0, 1] first
            counted = replace(t, baseline=t.baseline.add(outcome.value))
        else:
            counted = replace(t, candidate=t.candidate.add(outcome.value))
        self._rated.add(outcome.request_id)
        self.tally = counted
        return True
