"""The rollout gates: candidate vs baseline over the same window.

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
    :func:`significance.error_rate_test` on the window, for acute regressions,
    at ``alpha / 10`` (every window is a new look; at ``alpha`` per window,
    chance pairs of failures would add up to false rollbacks over a long
    step: about 2 % of healthy runs in simulations of 200 windows); and on the step's
    accumulated evidence, for a small regression at a small weight (25
    requests a window carry too few errors to judge, a few disjoint windows
    do), at :func:`step_alpha` (its level is spent over the looks). FAIL if
    either fails, INCONCLUSIVE if either is. Severe when the window shows
    delta > 5 x ``max_error_rate_delta`` at p < ``alpha`` / 100.

Agreement (rule ``output_agreement``, shadow phase only)
    :func:`significance.agreement_test` on the shadow pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.rollout_state import StepEvidence
from graylane.policy_engine.logic.significance import (
    ErrorRateTest,
    Verdict,
    agreement_test,
    error_rate_test,
)
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.spec import Gates
from graylane.rollouts.vocabulary import DecisionRule

__all__ = [
    "DECISIVE_ERROR_ALPHA_FACTOR",
    "P95_MIN_SAMPLES",
    "P99_MIN_SAMPLES",
    "SEVERE_ERROR_ALPHA_FACTOR",
    "SEVERE_ERROR_FACTOR",
    "SEVERE_MIN_SAMPLES",
    "SEVERE_P99_FACTOR",
    "GateResult",
    "agreement_gate",
    "error_gate",
    "latency_gate",
    "step_alpha",
]


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
