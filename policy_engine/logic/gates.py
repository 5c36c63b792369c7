"""The fixed-horizon rollout gates, candidate vs baseline, and their exact tests.

Each gate answers PASS, INCONCLUSIVE (hold, do not advance, do not count a
failure) or FAIL, and may mark a failure *severe* (roll back at once).

Latency (rule ``p99_ratio``, severe ``p99_severe``)
    ratio = candidate quantile / max(baseline quantile, ``p99_floor_ms``).
    The quantile follows the smaller side's sample count, because the p99 of
    fewer than 100 requests is the slowest single request: p99 from 100
    requests, p95 from 20, else p50. FAIL when ratio > ``max_p99_ratio``;
    from p50 (under 20 requests) a ratio up to 2 x ``max_p99_ratio`` is only
    INCONCLUSIVE, as the median of five requests swings that far by chance.
    Severe when ratio > 2 x ``max_p99_ratio`` *and* the next lower quantile
    (p95 for p99, p50 for p95) is also over ``max_p99_ratio``, so a single
    slow request cannot roll a candidate back on its own. No severe verdict
    with fewer than ``SEVERE_MIN_SAMPLES`` requests on the smaller side.

Errors (rule ``error_rate``, severe ``error_rate_severe``)
    :func:`error_rate_test` on the window, for acute regressions,
    at ``alpha / 10`` (every window is a new look; at ``alpha`` per window,
    chance pairs of failures would add up to false rollbacks over a long
    step: about 2 % of healthy runs in simulations of 200 windows); and on the step's
    accumulated evidence, for a small regression at a small weight (25
    requests a window carry too few errors to judge, a few disjoint windows
    do), at :func:`step_alpha` (its level is spent over the looks). FAIL if
    either fails, INCONCLUSIVE if either is. Severe when the window shows
    delta > 5 x ``max_error_rate_delta`` at p < ``alpha`` / 100.

Agreement (rule ``output_agreement``, shadow phase only)
    :func:`agreement_test` on the shadow pairs.

**Load-aware** (service time; queueing apart).
End-to-end latency mixes the model's service time with queueing. A candidate
whose worker carries a queue (left from an earlier run, or too few replicas)
is slow end to end while its model is not: that is a capacity problem.

- **Service time.** When both sides' windows carry service times (see
  :mod:`.window`), the latency gates compare those instead of end-to-end
  latency; older telemetry without them falls back to end-to-end latency.
- **Backlog** (rule ``candidate_backlog``). A candidate whose queue wait p99
  exceeds ``max(backlog_queue_ms, max_p99_ratio x max(baseline queue wait p99,
  p99_floor_ms))``, or whose consumer lag grows while it consumes, is held
  (no advance, no failure counted) and the hold is audited: it needs
  capacity, not a rollback. A failing *service-time* gate still rolls it back;
  a failing end-to-end gate (no service times to tell them apart) does not.

**Statistics**: exact small-count tests (no scipy: ``math.lgamma`` only).
Error rates: a candidate fails only on evidence that is both *practical*
and *statistical*:

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
from dataclasses import dataclass, replace
from enum import Enum

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.spec import Gates
from graylane.rollouts.vocabulary import (
    DecisionRule,
)

__all__ = [
    "DECISIVE_ERROR_ALPHA_FACTOR",
    "P95_MIN_SAMPLES",
    "P99_MIN_SAMPLES",
    "SEVERE_ERROR_ALPHA_FACTOR",
    "SEVERE_ERROR_FACTOR",
    "SEVERE_MIN_SAMPLES",
    "SEVERE_P99_FACTOR",
    "AgreementTest",
    "ErrorRateTest",
    "GateResult",
    "StepEvidence",
    "Verdict",
    "agreement_gate",
    "agreement_test",
    "backlog_gate",
    "binomial_cdf",
    "error_gate",
    "error_rate_test",
    "fisher_greater",
    "hypergeom_sf",
    "latency_gate",
    "on_service_time",
    "service_latency_gate",
    "service_view",
    "step_alpha",
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


@dataclass(frozen=True)
class StepEvidence:
    """Counts gathered during the current step (or phase) over disjoint windows.

    A window is counted once: only when it starts at or after both the step's
    start and the end of the last counted window (``through_ms``).
    """

    candidate_requests: int = 0
    candidate_errors: int = 0
    baseline_requests: int = 0
    baseline_errors: int = 0
    windows: int = 0
    through_ms: int = 0


P99_MIN_SAMPLES = 100
P95_MIN_SAMPLES = 20
SEVERE_P99_FACTOR = 2.0
SEVERE_MIN_SAMPLES = 50
"""A severe latency verdict needs this many requests on each side: a handful of
slow requests (a warm-up, a queue left from before) must not roll back at once."""
SEVERE_ERROR_FACTOR = 5.0
SEVERE_ERROR_ALPHA_FACTOR = 0.01
DECISIVE_ERROR_ALPHA_FACTOR = 0.001
"""A failing error test this far below alpha rolls back at once, whatever the delta:
waiting for a second disjoint window would only serve more errors."""
WINDOW_ALPHA_FACTOR = 0.1


@dataclass(frozen=True)
class GateResult:
    rule: DecisionRule
    verdict: Verdict
    detail: str
    severe: bool = False


def _quantiles(n: int) -> tuple[str, str | None]:
    if n >= P99_MIN_SAMPLES:
        return "p99", "p95"
    if n >= P95_MIN_SAMPLES:
        return "p95", "p50"
    return "p50", None


def _value(stats: WindowStats, q: str) -> float:
    return {"p99": stats.p99_ms, "p95": stats.p95_ms, "p50": stats.p50_ms}[q]


def latency_gate(baseline: WindowStats, candidate: WindowStats, gates: Gates) -> GateResult:
    n = min(baseline.requests, candidate.requests)
    q, lower_q = _quantiles(n)

    def ratio(quantile: str) -> tuple[float, float, float]:
        c, b = _value(candidate, quantile), _value(baseline, quantile)
        floored = max(b, gates.p99_floor_ms)
        return (c / floored if floored > 0 else 0.0), c, b

    r, c, b = ratio(q)
    detail = (
        f"candidate {q} {c:.2f} ms / baseline {q} {b:.2f} ms "
        f"(floor {gates.p99_floor_ms:g} ms) = {r:.2f}x, max {gates.max_p99_ratio:g}x"
    )
    if q != "p99":
        detail += f" ({q}: {n} requests on the smaller side, p99 needs {P99_MIN_SAMPLES})"
    if r <= gates.max_p99_ratio:
        return GateResult(DecisionRule.P99_RATIO, Verdict.PASS, detail)
    if lower_q is None and r <= SEVERE_P99_FACTOR * gates.max_p99_ratio:
        # The median of a handful of requests swings widely; only a gross
        # slowdown is a failure, a moderate one waits for more requests.
        return GateResult(DecisionRule.P99_RATIO, Verdict.INCONCLUSIVE, detail)
    severe = False
    if (
        lower_q is not None
        and n >= SEVERE_MIN_SAMPLES
        and r > SEVERE_P99_FACTOR * gates.max_p99_ratio
    ):
        lower_r, _, _ = ratio(lower_q)
        severe = lower_r > gates.max_p99_ratio
        if severe:
            detail += f"; severe: {lower_q} ratio {lower_r:.2f}x too"
    return GateResult(
        DecisionRule.P99_SEVERE if severe else DecisionRule.P99_RATIO, Verdict.FAIL, detail, severe
    )


def step_alpha(alpha: float, windows: int) -> float:
    """Significance level of the step test after ``windows`` disjoint windows.

    ``alpha / (k * (k + 1))`` sums to ``alpha`` over all k, so looking again
    after every window does not add up to more than one test's false alarms;
    a real regression's p-value falls exponentially with the evidence, much
    faster than this level does.
    """
    return alpha / (windows * (windows + 1))


def error_gate(
    baseline: WindowStats, candidate: WindowStats, evidence: StepEvidence, gates: Gates
) -> GateResult:
    window = error_rate_test(
        candidate.errors,
        candidate.requests,
        baseline.errors,
        baseline.requests,
        max_delta=gates.max_error_rate_delta,
        alpha=gates.alpha * WINDOW_ALPHA_FACTOR,
    )
    tests: list[tuple[str, ErrorRateTest]] = [("window", window)]
    k = evidence.windows
    if k > 1:
        tests.append(
            (
                f"step ({k} windows)",
                error_rate_test(
                    evidence.candidate_errors,
                    evidence.candidate_requests,
                    evidence.baseline_errors,
                    evidence.baseline_requests,
                    max_delta=gates.max_error_rate_delta,
                    alpha=step_alpha(gates.alpha, k),
                ),
            )
        )
    detail = "; ".join(f"{name}: {t.describe()}" for name, t in tests)
    severe = (
        window.verdict is Verdict.FAIL
        and window.delta > SEVERE_ERROR_FACTOR * gates.max_error_rate_delta
        and window.p_value < gates.alpha * SEVERE_ERROR_ALPHA_FACTOR
    )
    if severe:
        return GateResult(DecisionRule.ERROR_RATE_SEVERE, Verdict.FAIL, detail, True)
    decisive = any(
        t.verdict is Verdict.FAIL and t.p_value < gates.alpha * DECISIVE_ERROR_ALPHA_FACTOR
        for _, t in tests
    )
    if decisive:
        return GateResult(DecisionRule.ERROR_RATE_DECISIVE, Verdict.FAIL, detail, True)
    verdicts = {t.verdict for _, t in tests}
    for verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE):
        if verdict in verdicts:
            return GateResult(DecisionRule.ERROR_RATE, verdict, detail)
    return GateResult(DecisionRule.ERROR_RATE, Verdict.PASS, detail)


def agreement_gate(agreement: AgreementStats, gates: Gates) -> GateResult:
    test = agreement_test(
        agreement.agreeing,
        agreement.pairs,
        min_rate=gates.min_output_agreement,
        alpha=gates.alpha,
    )
    return GateResult(DecisionRule.OUTPUT_AGREEMENT, test.verdict, test.describe())


def on_service_time(baseline: WindowStats, candidate: WindowStats) -> bool:
    """Both windows carry service times, so latency can be judged on them."""
    return baseline.service is not None and candidate.service is not None


def service_view(stats: WindowStats) -> WindowStats:
    """``stats`` with its latency quantiles replaced by its service-time quantiles."""
    return replace(
        stats,
        p50_ms=stats.service_p50_ms,
        p95_ms=stats.service_p95_ms,
        p99_ms=stats.service_p99_ms,
    )


def service_latency_gate(baseline: WindowStats, candidate: WindowStats, gates: Gates) -> GateResult:
    """:func:`~.gates.latency_gate` on service time where both sides have it."""
    if not on_service_time(baseline, candidate):
        result = latency_gate(baseline, candidate, gates)
        return replace(result, detail=f"end-to-end latency: {result.detail}")
    result = latency_gate(service_view(baseline), service_view(candidate), gates)
    return replace(result, detail=f"service time: {result.detail}")


def backlog_gate(
    baseline: WindowStats, candidate: WindowStats, gates: Gates, behind: str = ""
) -> GateResult | None:
    """INCONCLUSIVE ``candidate_backlog`` when the candidate queues; else None.

    ``behind`` is the liveness check's account of a lag that grows while the
    candidate consumes (see :mod:`.liveness`).
    """
    limit = max(
        gates.backlog_queue_ms,
        gates.max_p99_ratio * max(baseline.queue_wait_p99_ms, gates.p99_floor_ms),
    )
    queued = candidate.queue_wait_p99_ms > limit
    if not (queued or behind):
        return None
    parts = []
    if queued:
        parts.append(
            f"candidate queue wait p99 {candidate.queue_wait_p99_ms:.1f} ms vs baseline "
            f"{baseline.queue_wait_p99_ms:.1f} ms (limit {limit:.1f} ms)"
        )
    if behind:
        parts.append(behind)
    detail = "; ".join(parts) + ": a capacity problem, holding (scale the candidate out)"
    return GateResult(DecisionRule.CANDIDATE_BACKLOG, Verdict.INCONCLUSIVE, detail)
