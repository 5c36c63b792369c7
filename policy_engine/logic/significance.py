"""Exact small-count tests for the rollout gates (no scipy: ``math.lgamma`` only).

Error rates: a candidate fails only on evidence that is both *practical* and
*statistical*:

- the observed difference ``candidate_rate - baseline_rate`` exceeds the
  tolerated ``max_delta``, and
- Fisher's exact test, one-sided ("the candidate errs more often than the
  baseline"), rejects at ``alpha``.

Fisher's test conditions on the total number of errors, so it stays exact for
the tiny counts of a 1 % or 5 % canary (25 candidate requests with 1 or 2
errors) where a z-test is badly calibrated, and it needs no assumption about
the baseline rate. A difference above the tolerance that is not yet
significant is *inconclusive*: the controller holds (does not advance) and
waits for more data instead of rolling back on noise.

Output agreement: the observed agreement rate fails when it is below the
minimum *and* an exact one-sided binomial test says the true rate is below the
minimum at ``alpha``; below the minimum without significance is inconclusive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "AgreementTest",
    "ErrorRateTest",
    "Verdict",
    "agreement_test",
    "binomial_cdf",
    "error_rate_test",
    "fisher_greater",
    "hypergeom_sf",
]

_TAIL_EPS = 1e-17


class Verdict(Enum):
    """Outcome of one gate."""

    PASS = "pass"
    INCONCLUSIVE = "inconclusive"
    FAIL = "fail"


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def hypergeom_sf(k: int, population: int, successes: int, draws: int) -> float:
    """P(X >= k) for X ~ Hypergeometric(population, successes, draws)."""
    if not 0 <= successes <= population or not 0 <= draws <= population:
        raise ValueError("hypergeometric parameters out of range")
    lo = max(0, draws - (population - successes))
    hi = min(successes, draws)
    if k <= lo:
        return 1.0
    if k > hi:
        return 0.0
    log_denominator = _log_comb(population, draws)

    def log_pmf(x: int) -> float:
        return (
            _log_comb(successes, x) + _log_comb(population - successes, draws - x) - log_denominator
        )

    mode = (draws + 1) * (successes + 1) // (population + 2)
    # Sum the tail that lies away from the mode: its terms shrink monotonically,
    # so the loop can stop once they no longer change the sum.
    if k > mode:
        total = 0.0
        for x in range(k, hi + 1):
            term = math.exp(log_pmf(x))
            total += term
            if term <= total * _TAIL_EPS:
                break
        return min(1.0, total)
    below = 0.0
    for x in range(k - 1, lo - 1, -1):
        term = math.exp(log_pmf(x))
        below += term
        if term <= below * _TAIL_EPS:
            break
    return min(1.0, max(0.0, 1.0 - below))


def fisher_greater(
    candidate_errors: int, candidate_requests: int, baseline_errors: int, baseline_requests: int
) -> float:
    """One-sided Fisher exact p-value for "the candidate's error rate is higher"."""
    _check_counts(candidate_errors, candidate_requests)
    _check_counts(baseline_errors, baseline_requests)
    if candidate_requests == 0 or baseline_requests == 0:
        return 1.0
    return hypergeom_sf(
        candidate_errors,
        candidate_requests + baseline_requests,
        candidate_errors + baseline_errors,
        candidate_requests,
    )


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if n < 0 or not 0.0 <= p <= 1.0:
        raise ValueError("binomial parameters out of range")
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p == 0.0:
        return 1.0
    if p == 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)

    def log_pmf(x: int) -> float:
        return _log_comb(n, x) + x * log_p + (n - x) * log_q

    mode = int((n + 1) * p)
    if k < mode:
        total = 0.0
        for x in range(k, -1, -1):
            term = math.exp(log_pmf(x))
            total += term
            if term <= total * _TAIL_EPS:
                break
        return min(1.0, total)
    above = 0.0
    for x in range(k + 1, n + 1):
        term = math.exp(log_pmf(x))
        above += term
        if term <= above * _TAIL_EPS:
            break
    return min(1.0, max(0.0, 1.0 - above))


def _check_counts(errors: int, requests: int) -> None:
    if requests < 0 or errors < 0 or errors > requests:
        raise ValueError(f"{errors} errors out of {requests} requests is impossible")


@dataclass(frozen=True, kw_only=True)
class ErrorRateTest:
    """Candidate vs baseline error counts, judged against a tolerance."""

    candidate_errors: int
    candidate_requests: int
    baseline_errors: int
    baseline_requests: int
    candidate_rate: float
    baseline_rate: float
    delta: float
    p_value: float
    alpha: float
    max_delta: float

    @property
    def significant(self) -> bool:
        """The candidate errs more often than the baseline, at ``alpha``."""
        return self.p_value < self.alpha

    @property
    def exceeds_margin(self) -> bool:
        return self.delta > self.max_delta

    @property
    def verdict(self) -> Verdict:
        if not self.exceeds_margin:
            return Verdict.PASS
        return Verdict.FAIL if self.significant else Verdict.INCONCLUSIVE

    def describe(self) -> str:
        return (
            f"candidate {self.candidate_errors}/{self.candidate_requests} "
            f"({self.candidate_rate:.2%}) vs baseline {self.baseline_errors}/"
            f"{self.baseline_requests} ({self.baseline_rate:.2%}): delta "
            f"{self.delta * 100:+.2f}pp (max {self.max_delta * 100:.2f}pp), "
            f"p={self.p_value:.3g} (alpha {self.alpha:g})"
        )


def error_rate_test(
    candidate_errors: int,
    candidate_requests: int,
    baseline_errors: int,
    baseline_requests: int,
    *,
    max_delta: float,
    alpha: float,
) -> ErrorRateTest:
    """Test "the candidate is worse than the baseline by more than ``max_delta``"."""
    c_rate = candidate_errors / candidate_requests if candidate_requests else 0.0
    b_rate = baseline_errors / baseline_requests if baseline_requests else 0.0
    return ErrorRateTest(
        candidate_errors=candidate_errors,
        candidate_requests=candidate_requests,
        baseline_errors=baseline_errors,
        baseline_requests=baseline_requests,
        candidate_rate=c_rate,
        baseline_rate=b_rate,
        delta=c_rate - b_rate,
        p_value=fisher_greater(
            candidate_errors, candidate_requests, baseline_errors, baseline_requests
        ),
        alpha=alpha,
        max_delta=max_delta,
    )


@dataclass(frozen=True, kw_only=True)
class AgreementTest:
    """Shadow output agreement judged against a minimum rate."""

    agreeing: int
    pairs: int
    rate: float
    min_rate: float
    p_value: float
    alpha: float

    @property
    def verdict(self) -> Verdict:
        if self.rate >= self.min_rate:
            return Verdict.PASS
        return Verdict.FAIL if self.p_value < self.alpha else Verdict.INCONCLUSIVE

    def describe(self) -> str:
        return (
            f"agreement {self.agreeing}/{self.pairs} ({self.rate:.2%}) vs min "
            f"{self.min_rate:.2%}, p={self.p_value:.3g} (alpha {self.alpha:g})"
        )


def agreement_test(agreeing: int, pairs: int, *, min_rate: float, alpha: float) -> AgreementTest:
    """Test "the true agreement rate is below ``min_rate``" (exact binomial, one-sided)."""
    _check_counts(agreeing, pairs)
    rate = agreeing / pairs if pairs else 0.0
    return AgreementTest(
        agreeing=agreeing,
        pairs=pairs,
        rate=rate,
        min_rate=min_rate,
        p_value=binomial_cdf(agreeing, pairs, min_rate) if pairs else 1.0,
        alpha=alpha,
    )
