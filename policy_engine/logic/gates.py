"""The rollout gates, candidate vs baseline: fixed-horizon exact tests and anytime-valid
sequential tests.

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

Anytime-valid sequential tests over count data, and the rollout gates built on them.

A test keeps, for each alternative on a fixed grid, the running log
likelihood ratio against the null; its evidence is the log of the mixture
(the grid's mean ratio). Under the null every component is a non-negative
supermartingale with mean at most 1, so is the mixture, and by Ville's
inequality the chance that it *ever* reaches ``1 / alpha`` is at most
``alpha``: the false-alarm rate holds however often, and whenever, it is
looked at (the mixture SPRT of Johari et al., "Always valid inference", in the
count form of Lindon & Malek's multinomial tests, as in the ``savvi`` package).

:class:`RatioTest` -- "the candidate's event rate is at most ``r0`` x the
baseline's". It conditions on the events of each increment: given ``E``
events among ``n_c`` candidate and ``n_b`` baseline requests, each falls on
the candidate with probability ``p(r) = r rho / (r rho + 1 - rho)``,
``rho = n_c / (n_c + n_b)``, when the candidate's rate is ``r`` x the
baseline's. The traffic split may change between increments; zero counts are
fine (a clean baseline gives every error to the candidate). Under the null
the true conditional law is hypergeometric, less spread than this binomial,
so the ratios stay supermartingales.

:class:`RateTest` -- "the candidate's event rate is at most ``p0``" (an
absolute error budget), one binomial per increment.

**Bounded increments.** One increment multiplies a component by
``F = (1 - BET) + BET * min(L, e^cap)`` instead of its likelihood ratio
``L``. ``E[F] <= 1`` whenever ``E[L] <= 1``, so validity holds, and
``log F`` lies within ``[log(1 - BET), ~cap]``: a burst confined to one
increment (a stalled worker, a short error storm) on the candidate's side
counts as one increment of strong evidence, not as a verdict; one on the
baseline's side cannot bury the evidence gathered so far; a persistent
regression adds up over a few increments.

The rollout gates of ``GateMode.SEQUENTIAL`` (:func:`sequential_gates`,
:func:`advance_sequential`) run on these tests. They run over the whole
rollout (they are not restarted at each step) and consume *increments*:
the newest settled step's stats when the caller passes them
(:class:`~.rollout.RolloutSignals`), else whole windows that do not overlap.

Errors (rule ``error_rate_sequential``)
    :class:`RatioTest` of "the candidate's error rate is at most
    ``max_error_ratio`` x the baseline's", at ``alpha / 2``; with an
    ``error_budget`` the candidate's rate must also test above the budget
    (:class:`RateTest`, ``alpha / 2``). A clean baseline
    makes every candidate error evidence, so +1 pp over 0 % is caught fast.

Latency (rule ``service_time_sequential``)
    The share of requests slower than the baseline's p95 (and p99) service
    time, candidate vs baseline over the same increments. The thresholds are
    the (lower) median of the baseline's quantiles over the last five *earlier*
    increments (at first, of the baseline's window without the increment):
    independent of the data they judge (a threshold taken from the same data
    would bias the comparison), and robust to a burst of slow baseline
    requests in one step. Then a
    :class:`RatioTest` each ("at most ``max_slow_ratio`` x the
    baseline's share"), at ``alpha / 4`` each, and only when at least
    ``MIN_INCREMENTS`` of the last five increments raised the evidence (a
    further condition, so the level still holds). Without service-time
    histograms the fixed-horizon latency gate judges instead.

Generations (rules ``ttft_sequential``, ``tpot_sequential``; see :func:`generative`)
    The same slow-share tests on time to first token (as served: the prefill
    step) and on time per output token instead of service time, which for a
    generation is mostly its length; four tests (TTFT, TPOT x p95, p99) at
    ``alpha / 8`` each. A candidate generation is slow above (1 +
    ``token_time_tolerance``) x the threshold; the threshold is the smallest of
    the recent baseline quantiles (a stall slows every token of a generation);
    each increment bets :data:`GENERATION_BET` of its ratio. Output lengths and
    endings are :func:`length_drift_gate`'s, never a latency verdict.

A rejection is a FAIL marked severe (roll back now: the test's level already
accounts for every look); evidence past half the threshold is INCONCLUSIVE
(hold, do not advance on a suspect); else PASS. Each increment's log
evidence is capped so that at least ``MIN_INCREMENTS`` increments are needed
to reject (and bounded below, see above): one bursty step cannot
decide alone. The whole-rollout false-alarm rate is at most ``alpha`` under
i.i.d. requests, however often the gates are evaluated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.window import GenerationStats, WindowStats
from graylane.rollouts.spec import DriftAction, Gates
from graylane.rollouts.vocabulary import (
    DecisionRule,
)

__all__ = [
    "DECISIVE_ERROR_ALPHA_FACTOR",
    "LENGTH_MIN_GENERATIONS",
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
    "first_token_served",
    "first_token_times",
    "fisher_greater",
    "generation_latency_gates",
    "generative",
    "hypergeom_sf",
    "latency_gate",
    "length_drift_gate",
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
    drifted: bool = False
    """``output_length_drift`` found a drift (whatever the policy made of it)."""


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
    detail = f"{test.describe()} ({agreement.basis})"
    return GateResult(DecisionRule.OUTPUT_AGREEMENT, test.verdict, detail)


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


# --- generations -------------------------------------------------------------------

LENGTH_MIN_GENERATIONS = 20
"""Generations needed on each side of a window before the drift gate judges it."""


def generative(*stats: WindowStats) -> bool:
    """Whether any of ``stats`` carries generations with per-token times: their
    rollout is judged on TTFT and TPOT, never on whole-request latency (a model
    serving both FORWARD and GENERATE traffic is judged as generative). Generation
    run per batch, without a continuous decode loop, stamps no token times: it is
    judged on service time as before."""
    return any(s.generation is not None and s.generation.ttft.count > 0 for s in stats)


def first_token_served(*stats: GenerationStats | None) -> bool:
    """Whether every side carries the served part of its times to first token (the
    prefill step: dequeue to first token), which the TTFT gates then judge."""
    return all(g is not None and g.prefill.count > 0 for g in stats)


def first_token_times(g: GenerationStats | None, served: bool) -> LatencyHistogram | None:
    """The times to first token the gates judge: as served (the prefill step, without
    the queue and the wait for a decode row: those are capacity, see the backlog
    gate) when ``served``, else from the request's creation."""
    if g is None:
        return None
    return g.prefill if served else g.ttft


def _timing_view(stats: WindowStats, hist: LatencyHistogram) -> WindowStats:
    """``stats`` whose latency quantiles and request count are those of ``hist``."""
    return replace(
        stats,
        requests=hist.count,
        p50_ms=hist.quantile(0.50),
        p95_ms=hist.quantile(0.95),
        p99_ms=hist.quantile(0.99),
    )


def generation_latency_gates(
    baseline: WindowStats, candidate: WindowStats, gates: Gates
) -> list[GateResult]:
    """FIXED mode for generations: :func:`latency_gate` on TTFT and on TPOT.

    A side without the timing (no generation of two tokens or more has a TPOT)
    passes, said so: one-token answers have no time per output token to judge.
    """
    out: list[GateResult] = []
    b, c = baseline.generation, candidate.generation
    served = first_token_served(b, c)
    for name, rule, hb, hc in (
        (
            "TTFT (served)" if served else "TTFT",
            DecisionRule.TTFT_P99_RATIO,
            first_token_times(b, served),
            first_token_times(c, served),
        ),
        (
            "TPOT",
            DecisionRule.TPOT_P99_RATIO,
            b.tpot if b is not None else None,
            c.tpot if c is not None else None,
        ),
    ):
        if hb is None or hc is None or not (hb.count and hc.count):
            out.append(GateResult(rule, Verdict.PASS, f"{name}: not measured on both sides"))
            continue
        bv, cv = _timing_view(baseline, hb), _timing_view(candidate, hc)
        result = latency_gate(bv, cv, gates)
        detail = f"{name}: {result.detail}"
        if result.verdict is Verdict.FAIL and not result.severe:
            # A stall slows every token of the generations it hits, so one stalled step
            # lifts a window's p99 alone; a regression lifts the p95 with it.
            p95 = cv.p95_ms / max(bv.p95_ms, gates.p99_floor_ms)
            if p95 <= gates.max_p99_ratio:
                result = replace(result, verdict=Verdict.INCONCLUSIVE)
                detail += f"; p95 ratio {p95:.2f}x within the limit: holding"
        out.append(replace(result, rule=rule, detail=detail))
    return out


def _share_shift(
    c_events: int, c_n: int, b_events: int, b_n: int, margin: float, alpha: float
) -> tuple[Verdict, float]:
    """Two-sided: does the candidate's share of events differ from the baseline's by
    more than ``margin``, significantly at ``alpha`` (each side at alpha / 2)? The
    verdict and the observed difference (candidate - baseline)."""
    up = error_rate_test(c_events, c_n, b_events, b_n, max_delta=margin, alpha=alpha / 2)
    down = error_rate_test(
        c_n - c_events, c_n, b_n - b_events, b_n, max_delta=margin, alpha=alpha / 2
    )
    delta = (c_events / c_n if c_n else 0.0) - (b_events / b_n if b_n else 0.0)
    verdicts = {up.verdict, down.verdict}
    for verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE):
        if verdict in verdicts:
            return verdict, delta
    return Verdict.PASS, delta


def length_drift_gate(baseline: WindowStats, candidate: WindowStats, gates: Gates) -> GateResult:
    """Rule ``output_length_drift``: a quality signal, never a latency verdict.

    Two tests on the window, each two-sided with Fisher's exact test and a practical
    margin (like the error-rate gate), at ``alpha x WINDOW_ALPHA_FACTOR``:

    - *length*: the share of answers longer than the baseline's median output length,
      candidate vs baseline, may differ by ``max_length_shift``. A share, not a mean:
      heavy-tailed lengths (a few very long answers) do not move it, a shift of the
      whole distribution does (x2 lengths move 50 % to 70-90 %);
    - *endings*: the share of answers the model ended itself (EOS or a stop) may
      differ by ``max_eos_rate_delta``.

    A drift beyond them is FAIL (ROLLBACK), INCONCLUSIVE (HOLD) or a PASS that says it
    (REPORT), as ``gates.length_drift`` asks; too few generations pass.
    """
    rule = DecisionRule.OUTPUT_LENGTH_DRIFT
    b, c = baseline.generation, candidate.generation
    if b is None or c is None:
        return GateResult(rule, Verdict.PASS, "no generations on both sides")
    n = min(b.generations, c.generations)
    if n < LENGTH_MIN_GENERATIONS:
        return GateResult(
            rule,
            Verdict.PASS,
            f"{n} generations on the smaller side, drift needs {LENGTH_MIN_GENERATIONS}",
        )
    alpha = gates.alpha * WINDOW_ALPHA_FACTOR
    median = b.output_tokens.quantile(0.5)
    bucket = b.output_tokens.bucket_index(median)
    c_long, b_long = count_above(c.output_tokens, bucket), count_above(b.output_tokens, bucket)
    length, shift = _share_shift(
        c_long,
        c.output_tokens.count,
        b_long,
        b.output_tokens.count,
        gates.max_length_shift,
        alpha,
    )
    endings, eos_delta = _share_shift(
        c.ended_by_model,
        c.generations,
        b.ended_by_model,
        b.generations,
        gates.max_eos_rate_delta,
        alpha,
    )
    detail = (
        f"output tokens mean {c.mean_output_tokens:.1f} vs {b.mean_output_tokens:.1f}; "
        f"longer than the baseline median ({median:.0f}): "
        f"{c_long / max(1, c.output_tokens.count):.1%} vs "
        f"{b_long / max(1, b.output_tokens.count):.1%} ({shift:+.1%}, tolerance "
        f"{gates.max_length_shift:.0%}); ended by the model (EOS/stop): {c.eos_rate:.1%} vs "
        f"{b.eos_rate:.1%} ({eos_delta:+.1%}, tolerance {gates.max_eos_rate_delta:.0%})"
    )
    if Verdict.FAIL not in (length, endings):
        unsure = Verdict.INCONCLUSIVE in (length, endings)
        return GateResult(rule, Verdict.PASS, detail + ("; not yet significant" if unsure else ""))
    drifted = "drift: " + detail
    if gates.length_drift is DriftAction.ROLLBACK:
        return GateResult(rule, Verdict.FAIL, drifted)
    if gates.length_drift is DriftAction.HOLD:
        return GateResult(rule, Verdict.INCONCLUSIVE, drifted + "; holding (policy: hold)")
    return GateResult(rule, Verdict.PASS, drifted + " (policy: report)", drifted=True)


if TYPE_CHECKING:  # the rollout controller calls in here with its inputs
    from graylane.policy_engine.logic.rollout import RolloutSignals

__all__ = [
    "BET",
    "GENERATION_BET",
    "MIN_INCREMENTS",
    "P95_THRESHOLD_MIN",
    "P99_THRESHOLD_MIN",
    "RATE_GRID",
    "RATIO_GRID",
    "RECENT",
    "SUSPECT_FRACTION",
    "RateTest",
    "RatioTest",
    "SequentialEvidence",
    "SlowShare",
    "advance_sequential",
    "count_above",
    "log_threshold",
    "sequential_gates",
    "share_on_candidate",
]

RATIO_GRID: tuple[float, ...] = (1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
"""Alternatives of :class:`RatioTest`, as multiples of its ``r0``."""
RATE_GRID: tuple[float, ...] = (1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
"""Alternatives of :class:`RateTest`, as multiples of its ``p0`` (capped below 1)."""
BET = 0.9
GENERATION_BET = 0.5
"""The bet of the TTFT / TPOT tests: a stall slows every token of the generations it
hits, so a baseline stall makes a whole increment lean the wrong way; at 0.5 such an
increment costs at most log 2 of the evidence (0.9: log 10) and a strong one still
counts fully (the cap grows to match). Validity holds for any bet in (0, 1]."""
RECENT = 5
"""How many recent increments :meth:`RatioTest.persistent` looks at."""
"""Share of each increment's (capped) likelihood ratio a test stakes; see the module docstring."""


def _bounded(log_l: float, cap: float, bet: float = BET) -> float:
    """``log((1 - bet) + bet * min(L, e^cap))`` for ``log_l = log L``."""
    return math.log((1.0 - bet) + bet * math.exp(min(log_l, cap)))


def log_threshold(alpha: float) -> float:
    """The log evidence at which a test at level ``alpha`` rejects."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha {alpha} must be within (0, 1)")
    return math.log(1.0 / alpha)


def share_on_candidate(ratio: float, rho: float) -> float:
    """P(an event falls on the candidate) when its rate is ``ratio`` x the baseline's."""
    return ratio * rho / (ratio * rho + 1.0 - rho)


def _log_mean_exp(values: tuple[float, ...]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values) / len(values))


@dataclass(frozen=True)
class RatioTest:
    """Running mixture test of "candidate rate <= ``r0`` x baseline rate"."""

    r0: float = 1.0
    log_lr: tuple[float, ...] = (0.0,) * len(RATIO_GRID)
    candidate_events: int = 0
    candidate_requests: int = 0
    baseline_events: int = 0
    baseline_requests: int = 0
    recent_up: tuple[bool, ...] = ()
    """Whether each of the last ``RECENT`` increments raised the evidence, oldest first."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.r0) and self.r0 > 0.0):
            raise ValueError(f"r0 {self.r0} must be a positive number")
        if len(self.log_lr) != len(RATIO_GRID):
            raise ValueError("one log ratio per alternative of RATIO_GRID")

    def update(
        self,
        candidate_events: int,
        candidate_requests: int,
        baseline_events: int,
        baseline_requests: int,
        *,
        cap: float = 50.0,
        bet: float = BET,
    ) -> RatioTest:
        """Add one increment (counts disjoint from every earlier one); ``bet``: the
        share of the increment's ratio bet (see the module docstring)."""
        for events, n in (
            (candidate_events, candidate_requests),
            (baseline_events, baseline_requests),
        ):
            if n < 0 or not 0 <= events <= n:
                raise ValueError(f"{events} events out of {n} requests is impossible")
        log_lr = self.log_lr
        if candidate_requests and baseline_requests and candidate_events + baseline_events:
            rho = candidate_requests / (candidate_requests + baseline_requests)
            p0 = share_on_candidate(self.r0, rho)
            log_lr = tuple(
                acc
                + _bounded(
                    candidate_events * math.log(p / p0)
                    + baseline_events * math.log((1.0 - p) / (1.0 - p0)),
                    cap,
                    bet,
                )
                for acc, p in zip(
                    self.log_lr,
                    (share_on_candidate(self.r0 * m, rho) for m in RATIO_GRID),
                    strict=True,
                )
            )
        up = _log_mean_exp(log_lr) > self.log_evidence
        return RatioTest(
            r0=self.r0,
            log_lr=log_lr,
            candidate_events=self.candidate_events + candidate_events,
            candidate_requests=self.candidate_requests + candidate_requests,
            baseline_events=self.baseline_events + baseline_events,
            baseline_requests=self.baseline_requests + baseline_requests,
            recent_up=(*self.recent_up, up)[-RECENT:],
        )

    def persistent(self, increments: int) -> bool:
        """At least ``increments`` of the last :data:`RECENT` increments raised the evidence."""
        return sum(self.recent_up) >= increments

    @property
    def log_evidence(self) -> float:
        """Log of the mixture likelihood ratio; 0 before any evidence."""
        return _log_mean_exp(self.log_lr)

    def rejects(self, alpha: float) -> bool:
        return self.log_evidence >= log_threshold(alpha)

    @property
    def candidate_rate(self) -> float:
        return self.candidate_events / self.candidate_requests if self.candidate_requests else 0.0

    @property
    def baseline_rate(self) -> float:
        return self.baseline_events / self.baseline_requests if self.baseline_requests else 0.0

    def describe(self, alpha: float) -> str:
        return (
            f"candidate {self.candidate_events}/{self.candidate_requests} "
            f"({self.candidate_rate:.2%}) vs baseline {self.baseline_events}/"
            f"{self.baseline_requests} ({self.baseline_rate:.2%}), allowed {self.r0:g}x: "
            f"evidence e^{self.log_evidence:.2f} of e^{log_threshold(alpha):.2f} (alpha {alpha:g})"
        )


@dataclass(frozen=True)
class RateTest:
    """Running mixture test of "candidate rate <= ``p0``" (an absolute budget)."""

    p0: float = 0.0
    log_lr: tuple[float, ...] = (0.0,) * len(RATE_GRID)
    events: int = 0
    requests: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.p0 < 1.0:
            raise ValueError(f"p0 {self.p0} must be within [0, 1)")
        if len(self.log_lr) != len(RATE_GRID):
            raise ValueError("one log ratio per alternative of RATE_GRID")

    def update(self, events: int, requests: int, *, cap: float = 50.0) -> RateTest:
        if requests < 0 or not 0 <= events <= requests:
            raise ValueError(f"{events} events out of {requests} requests is impossible")
        log_lr = self.log_lr
        if requests and self.p0 > 0.0:
            p0 = self.p0
            log_lr = tuple(
                acc
                + _bounded(
                    events * math.log(p / p0) + (requests - events) * math.log((1 - p) / (1 - p0)),
                    cap,
                )
                for acc, p in zip(self.log_lr, (min(p0 * m, 0.999) for m in RATE_GRID), strict=True)
            )
        return RateTest(
            p0=self.p0,
            log_lr=log_lr,
            events=self.events + events,
            requests=self.requests + requests,
        )

    @property
    def log_evidence(self) -> float:
        return _log_mean_exp(self.log_lr)

    def rejects(self, alpha: float) -> bool:
        return self.p0 > 0.0 and self.log_evidence >= log_threshold(alpha)


@dataclass(frozen=True)
class SlowShare:
    """The slow-share tests of one timing of generations (TTFT or TPOT): the share of
    candidate generations slower than the baseline's p95 / p99, as for service time."""

    p95: RatioTest = RatioTest()
    p99: RatioTest = RatioTest()
    baseline_p95_ms: tuple[float, ...] = ()
    baseline_p99_ms: tuple[float, ...] = ()

    def advance(
        self,
        window: LatencyHistogram | None,
        inc_b: LatencyHistogram | None,
        inc_c: LatencyHistogram | None,
        cap: float,
        *,
        same: bool,
        margin: float,
    ) -> SlowShare:
        """Feed one increment; ``same``: the increment is the whole window; a candidate
        generation is slow above ``margin`` x the threshold."""
        # The smallest of the recent increments' quantiles and the window's before this
        # increment (never the increment's own: the threshold stays independent of the
        # data it judges). A stall slows every token of the generations it hits, so a
        # stalled baseline step lifts its quantiles several-fold; one or two of them
        # among the last five must not blind the test, as a median would be.
        before = None if same else _without(window, inc_b)
        t95 = _smallest(self.baseline_p95_ms, _threshold(before, 0.95, P95_THRESHOLD_MIN))
        t99 = _smallest(self.baseline_p99_ms, _threshold(before, 0.99, P99_THRESHOLD_MIN))
        return SlowShare(
            p95=_slow(self.p95, t95, inc_b, inc_c, cap, margin, GENERATION_BET),
            p99=_slow(self.p99, t99, inc_b, inc_c, cap, margin, GENERATION_BET),
            baseline_p95_ms=_keep(self.baseline_p95_ms, inc_b, window, 0.95, P95_THRESHOLD_MIN),
            baseline_p99_ms=_keep(self.baseline_p99_ms, inc_b, window, 0.99, P99_THRESHOLD_MIN),
        )


@dataclass(frozen=True)
class SequentialEvidence:
    """The running sequential tests of one rollout, kept across its steps.

    ``through_ms`` is the end of the last increment consumed; an increment is
    consumed once, and only when it starts at or after it. ``increments`` is
    0 until the first one (the tests' null hypotheses are set then).
    """

    errors: RatioTest = RatioTest()
    budget: RateTest = RateTest()
    slow_p95: RatioTest = RatioTest()
    slow_p99: RatioTest = RatioTest()
    increments: int = 0
    through_ms: int = 0
    baseline_p95_ms: tuple[float, ...] = ()
    """The baseline's service p95 / p99 (ms) of recent increments; their median is the
    threshold of the next increment."""
    baseline_p99_ms: tuple[float, ...] = ()
    ttft: SlowShare = SlowShare()
    """GENERATE rollouts: the slow-share tests on time to first token (instead of
    service time, which for a generation is mostly its length)."""
    tpot: SlowShare = SlowShare()
    """GENERATE rollouts: the slow-share tests on time per output token."""


MIN_INCREMENTS = 3
SUSPECT_FRACTION = 0.5
P95_THRESHOLD_MIN = 20
"""Baseline requests in the window needed before its p95 serves as a threshold."""
P99_THRESHOLD_MIN = 100
THRESHOLD_MEMORY = 5
"""Increments whose baseline quantiles make the threshold (their median)."""


def _alphas(gates: Gates) -> tuple[float, float]:
    """(error test level, each latency test's level)."""
    return gates.alpha / 2, gates.alpha / 4


def _generation_alpha(gates: Gates) -> float:
    """Each of the four generation latency tests' level (TTFT and TPOT, p95 and p99):
    together the latency share of ``alpha``, like service time's two."""
    return gates.alpha / 8


def _cap(alpha: float, bet: float = BET) -> float:
    # Enough for MIN_INCREMENTS strong increments to reject with one alternative of
    # the grid alone: the threshold, the mixture's log K and the bet's share.
    return (log_threshold(alpha) + math.log(len(RATIO_GRID))) / MIN_INCREMENTS - math.log(bet)


def count_above(hist: LatencyHistogram | None, bucket: int) -> int:
    """Requests of ``hist`` in buckets above ``bucket``."""
    if hist is None:
        return 0
    return sum(n for index, n in hist.buckets.items() if index > bucket)


def _fresh(gates: Gates) -> SequentialEvidence:
    def share() -> SlowShare:
        return SlowShare(RatioTest(r0=gates.max_slow_ratio), RatioTest(r0=gates.max_slow_ratio))

    return SequentialEvidence(
        errors=RatioTest(r0=gates.max_error_ratio),
        budget=RateTest(p0=gates.error_budget),
        slow_p95=RatioTest(r0=gates.max_slow_ratio),
        slow_p99=RatioTest(r0=gates.max_slow_ratio),
        ttft=share(),
        tpot=share(),
    )


def _threshold(ref: LatencyHistogram | None, q: float, min_n: int) -> float:
    """The ``q`` quantile of ``ref``, or 0.0 (none) with too few requests."""
    return ref.quantile(q) if ref is not None and ref.count >= min_n else 0.0


def _before(window: WindowStats, increment: WindowStats) -> LatencyHistogram | None:
    """The window's service times without the increment's (the newest step of it)."""
    if increment is window:
        return None
    return _without(window.service, increment.service)


def _without(w: LatencyHistogram | None, i: LatencyHistogram | None) -> LatencyHistogram | None:
    """``w`` less ``i`` when ``i`` is a part of it, else None."""
    if w is None or i is None or not w.same_scheme(i):
        return None
    rest = {b: n - i.buckets.get(b, 0) for b, n in w.buckets.items()}
    if any(n < 0 for n in rest.values()) or sum(rest.values()) != w.count - i.count:
        return None  # not a sub-window
    # max_ms bounds quantiles; the window's is an upper bound of what is left.
    return LatencyHistogram(w.min_ms, w.growth, buckets=rest, max_ms=w.max_ms)


def _slow(
    test: RatioTest,
    threshold_ms: float,
    baseline: LatencyHistogram | None,
    candidate: LatencyHistogram | None,
    cap: float,
    margin: float = 1.0,
    bet: float = BET,
) -> RatioTest:
    """Feed one increment's counts above ``threshold_ms`` (of the baseline's scheme);
    a candidate request is slow only above ``margin x threshold_ms``: the test is then
    of "the candidate is at most ``margin`` x slower", with the same guarantee."""
    if threshold_ms <= 0.0 or baseline is None or candidate is None:
        return test
    if not (baseline.count and candidate.count):
        return test
    bucket = baseline.bucket_index(threshold_ms)
    return test.update(
        count_above(candidate, candidate.bucket_index(threshold_ms * margin)),
        candidate.count,
        count_above(baseline, bucket),
        baseline.count,
        cap=cap,
        bet=bet,
    )


def advance_sequential(
    evidence: SequentialEvidence,
    gates: Gates,
    baseline: WindowStats,
    candidate: WindowStats,
    signals: RolloutSignals | None = None,
) -> SequentialEvidence:
    """Feed the newest increment to the tests, once (see the module docstring)."""
    if (
        signals is not None
        and signals.baseline_step is not None
        and signals.candidate_step is not None
    ):
        inc_b, inc_c = signals.baseline_step, signals.candidate_step
    else:
        inc_b, inc_c = baseline, candidate
    if inc_c.window_start_ms < evidence.through_ms or (
        inc_b.window_start_ms,
        inc_b.window_end_ms,
    ) != (inc_c.window_start_ms, inc_c.window_end_ms):
        return evidence
    ev = evidence if evidence.increments else _fresh(gates)
    a_err, a_lat = _alphas(gates)
    ev = replace(
        ev,
        errors=ev.errors.update(
            inc_c.errors, inc_c.requests, inc_b.errors, inc_b.requests, cap=_cap(a_err)
        ),
        budget=ev.budget.update(inc_c.errors, inc_c.requests, cap=_cap(a_err)),
        increments=ev.increments + 1,
        through_ms=inc_c.window_end_ms,
    )
    if generative(baseline, candidate, inc_b, inc_c):
        # A generation's service time is mostly its length: judge TTFT and TPOT instead.
        cap, same = _cap(_generation_alpha(gates), GENERATION_BET), inc_b is baseline
        margin = 1.0 + gates.token_time_tolerance
        window, gb, gc = baseline.generation, inc_b.generation, inc_c.generation
        served = first_token_served(window, gb, gc)
        return replace(
            ev,
            ttft=ev.ttft.advance(
                first_token_times(window, served),
                first_token_times(gb, served),
                first_token_times(gc, served),
                cap,
                same=same,
                margin=margin,
            ),
            tpot=ev.tpot.advance(
                window.tpot if window else None,
                gb.tpot if gb else None,
                gc.tpot if gc else None,
                cap,
                same=same,
                margin=margin,
            ),
        )
    # Thresholds never depend on the data they judge: the baseline's window before
    # the increment when there is one, else the window of the previous evaluation.
    before = _before(baseline, inc_b)
    t95 = _median(ev.baseline_p95_ms) or _threshold(before, 0.95, P95_THRESHOLD_MIN)
    t99 = _median(ev.baseline_p99_ms) or _threshold(before, 0.99, P99_THRESHOLD_MIN)
    cap = _cap(a_lat)
    return replace(
        ev,
        slow_p95=_slow(ev.slow_p95, t95, inc_b.service, inc_c.service, cap),
        slow_p99=_slow(ev.slow_p99, t99, inc_b.service, inc_c.service, cap),
        baseline_p95_ms=_remember(ev.baseline_p95_ms, inc_b, baseline, 0.95, P95_THRESHOLD_MIN),
        baseline_p99_ms=_remember(ev.baseline_p99_ms, inc_b, baseline, 0.99, P99_THRESHOLD_MIN),
    )


def _smallest(kept: tuple[float, ...], current: float) -> float:
    values = [v for v in (*kept, current) if v > 0.0]
    return min(values) if values else 0.0


def _median(values: tuple[float, ...]) -> float:
    """The lower median: of two (early in a rollout) the smaller, so that one baseline
    burst does not lift the threshold (and hide a regression) for several steps."""
    return sorted(values)[(len(values) - 1) // 2] if values else 0.0


def _remember(
    kept: tuple[float, ...], inc_b: WindowStats, window: WindowStats, q: float, min_n: int
) -> tuple[float, ...]:
    """Keep the increment's baseline quantile (the window's when it holds too few)."""
    return _keep(kept, inc_b.service, window.service, q, min_n)


def _keep(
    kept: tuple[float, ...],
    increment: LatencyHistogram | None,
    window: LatencyHistogram | None,
    q: float,
    min_n: int,
) -> tuple[float, ...]:
    value = _threshold(increment, q, min_n) or _threshold(window, q, min_n)
    return (*kept, value)[-THRESHOLD_MEMORY:] if value > 0.0 else kept


def _verdict(log_evidence: float, alpha: float, rejected: bool) -> Verdict:
    if rejected:
        return Verdict.FAIL
    if log_evidence >= SUSPECT_FRACTION * log_threshold(alpha):
        return Verdict.INCONCLUSIVE
    return Verdict.PASS


def _error_result(ev: SequentialEvidence, gates: Gates) -> GateResult:
    alpha, _ = _alphas(gates)
    detail = ev.errors.describe(alpha)
    rejected = ev.errors.rejects(alpha)
    log_evidence = ev.errors.log_evidence
    if gates.error_budget > 0.0:
        budget = ev.budget
        detail += (
            f"; budget {gates.error_budget:.2%}: evidence e^{budget.log_evidence:.2f} "
            f"of e^{log_threshold(alpha):.2f}"
        )
        rejected = rejected and budget.rejects(alpha)
        log_evidence = min(log_evidence, budget.log_evidence)
    verdict = _verdict(log_evidence, alpha, rejected)
    return GateResult(DecisionRule.ERROR_RATE_SEQUENTIAL, verdict, detail, verdict is Verdict.FAIL)


def _share_result(
    rule: DecisionRule, name: str, share: SlowShare, c_p99: float, b_p99: float, alpha: float
) -> GateResult:
    verdicts = []
    parts = []
    for q, test in (("p95", share.p95), ("p99", share.p99)):
        rejected = test.rejects(alpha) and test.persistent(MIN_INCREMENTS)
        verdicts.append(_verdict(test.log_evidence, alpha, rejected))
        parts.append(f"slower than baseline {q}: {test.describe(alpha)}")
    detail = f"{name} p99 {c_p99:.2f} ms vs {b_p99:.2f} ms; " + "; ".join(parts)
    for verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE):
        if verdict in verdicts:
            return GateResult(rule, verdict, detail, verdict is Verdict.FAIL)
    return GateResult(rule, Verdict.PASS, detail)


def _generation_results(
    baseline: WindowStats, candidate: WindowStats, ev: SequentialEvidence, gates: Gates
) -> list[GateResult]:
    alpha = _generation_alpha(gates)
    b, c = baseline.generation, candidate.generation
    served = first_token_served(b, c)
    hb, hc = first_token_times(b, served), first_token_times(c, served)
    return [
        _share_result(
            DecisionRule.TTFT_SEQUENTIAL,
            "TTFT (served)" if served else "TTFT",
            ev.ttft,
            hc.quantile(0.99) if hc else 0.0,
            hb.quantile(0.99) if hb else 0.0,
            alpha,
        ),
        _share_result(
            DecisionRule.TPOT_SEQUENTIAL,
            "TPOT",
            ev.tpot,
            c.tpot_p99_ms if c else 0.0,
            b.tpot_p99_ms if b else 0.0,
            alpha,
        ),
    ]


def _latency_result(
    baseline: WindowStats, candidate: WindowStats, ev: SequentialEvidence, gates: Gates
) -> GateResult:
    if baseline.service is None or candidate.service is None:
        fixed = latency_gate(baseline, candidate, gates)
        return replace(fixed, detail=f"no service times, end-to-end: {fixed.detail}")
    _, alpha = _alphas(gates)
    verdicts = []
    parts = []
    for name, test in (("p95", ev.slow_p95), ("p99", ev.slow_p99)):
        # Slow requests come in bursts (a stall, a noisy neighbour): a verdict also
        # needs most recent increments to lean the same way (only ever fewer alarms).
        rejected = test.rejects(alpha) and test.persistent(MIN_INCREMENTS)
        verdicts.append(_verdict(test.log_evidence, alpha, rejected))
        parts.append(f"slower than baseline {name}: {test.describe(alpha)}")
    detail = (
        f"service p99 {candidate.service_p99_ms:.2f} ms vs {baseline.service_p99_ms:.2f} ms; "
        + "; ".join(parts)
    )
    rule = DecisionRule.SERVICE_TIME_SEQUENTIAL
    for verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE):
        if verdict in verdicts:
            return GateResult(rule, verdict, detail, verdict is Verdict.FAIL)
    return GateResult(rule, Verdict.PASS, detail)


def sequential_gates(
    baseline: WindowStats, candidate: WindowStats, evidence: SequentialEvidence, gates: Gates
) -> list[GateResult]:
    """Latency and error verdicts from the evidence gathered so far: for generations,
    TTFT and TPOT instead of service time."""
    if generative(baseline, candidate):
        return [
            *_generation_results(baseline, candidate, evidence, gates),
            _error_result(evidence, gates),
        ]
    return [
        _latency_result(baseline, candidate, evidence, gates),
        _error_result(evidence, gates),
    ]
