"""Anytime-valid rollout gates (GateMode.SEQUENTIAL), on :mod:`.sequential`'s tests.

The tests run over the whole rollout (they are not restarted at each step)
and consume *increments*: the newest step's stats when the caller passes them
(:class:`~.facts.RolloutFacts`), else whole windows that do not overlap.

Errors (rule ``error_rate_sequential``)
    :class:`~.sequential.RatioTest` of "the candidate's error rate is at most
    ``max_error_ratio`` x the baseline's", at ``alpha / 2``; with an
    ``error_budget`` the candidate's rate must also test above the budget
    (:class:`~.sequential.RateTest`, ``alpha / 2``). A clean baseline
    makes every candidate error evidence, so +1 pp over 0 % is caught fast.

Latency (rule ``service_time_sequential``)
    The share of requests slower than the baseline's p95 (and p99) service
    time, candidate vs baseline over the same increments. The thresholds are
    the (lower) median of the baseline's quantiles over the last five *earlier*
    increments (at first, of the baseline's window without the increment):
    independent of the data they judge (a threshold taken from the same data
    would bias the comparison), and robust to a burst of slow baseline
    requests in one step. Then a
    :class:`~.sequential.RatioTest` each ("at most ``max_slow_ratio`` x the
    baseline's share"), at ``alpha / 4`` each, and only when at least
    ``MIN_INCREMENTS`` of the last five increments raised the evidence (a
    further condition, so the level still holds). Without service-time
    histograms the fixed-horizon latency gate judges instead.

A rejection is a FAIL marked severe (roll back now: the test's level already
accounts for every look); evidence past half the threshold is INCONCLUSIVE
(hold, do not advance on a suspect); else PASS. Each increment's log
evidence is capped so that at least ``MIN_INCREMENTS`` increments are needed
to reject (and bounded below, see :mod:`.sequential`): one bursty step cannot
decide alone. The whole-rollout false-alarm rate is at most ``alpha`` under
i.i.d. requests, however often the gates are evaluated.
"""

from __future__ import annotations

import math
from dataclasses import replace

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.facts import RolloutFacts
from graylane.policy_engine.logic.gates import GateResult, latency_gate
from graylane.policy_engine.logic.sequential import (
    BET,
    RATIO_GRID,
    RateTest,
    RatioTest,
    SequentialEvidence,
    log_threshold,
)
from graylane.policy_engine.logic.significance import Verdict
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.spec import Gates
from graylane.rollouts.vocabulary import DecisionRule

__all__ = [
    "MIN_INCREMENTS",
    "P95_THRESHOLD_MIN",
    "P99_THRESHOLD_MIN",
    "SUSPECT_FRACTION",
    "advance_sequential",
    "count_above",
    "sequential_gates",
]

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


def _cap(alpha: float) -> float:
    # Enough for MIN_INCREMENTS strong increments to reject with one alternative of
    # the grid alone: the threshold, the mixture's log K and BET's share.
    return (log_threshold(alpha) + math.log(len(RATIO_GRID))) / MIN_INCREMENTS - math.log(BET)


def count_above(hist: LatencyHistogram | None, bucket: int) -> int:
    """Requests of ``hist`` in buckets above ``bucket``."""
    if hist is None:
        return 0
    return sum(n for index, n in hist.buckets.items() if index > bucket)


def _fresh(gates: Gates) -> SequentialEvidence:
    return SequentialEvidence(
        errors=RatioTest(r0=gates.max_error_ratio),
        budget=RateTest(p0=gates.error_budget),
        slow_p95=RatioTest(r0=gates.max_slow_ratio),
        slow_p99=RatioTest(r0=gates.max_slow_ratio),
    )


def _threshold(ref: LatencyHistogram | None, q: float, min_n: int) -> float:
    """The ``q`` quantile of ``ref``, or 0.0 (none) with too few requests."""
    return ref.quantile(q) if ref is not None and ref.count >= min_n else 0.0


def _before(window: WindowStats, increment: WindowStats) -> LatencyHistogram | None:
    """The window's service times without the increment's (the newest step of it)."""
    w, i = window.service, increment.service
    if w is None or i is None or increment is window or not w.same_scheme(i):
        return None
    rest = {b: n - i.buckets.get(b, 0) for b, n in w.buckets.items()}
    if any(n < 0 for n in rest.values()) or sum(rest.values()) != w.count - i.count:
        return None  # not a sub-window
    # max_ms bounds quantiles; the window's is an upper bound of what is left.
    return LatencyHistogram(w.min_ms, w.growth, buckets=rest, max_ms=w.max_ms)


def _slow(
    test: RatioTest,
    threshold_ms: float,
    inc_b: WindowStats,
    inc_c: WindowStats,
    cap: float,
) -> RatioTest:
    if threshold_ms <= 0.0 or inc_b.service is None or inc_c.service is None:
        return test
    bucket = inc_b.service.bucket_index(threshold_ms)
    return test.update(
        count_above(inc_c.service, bucket),
        inc_c.service.count,
        count_above(inc_b.service, bucket),
        inc_b.service.count,
        cap=cap,
    )


def advance_sequential(
    evidence: SequentialEvidence,
    gates: Gates,
    baseline: WindowStats,
    candidate: WindowStats,
    facts: RolloutFacts | None = None,
) -> SequentialEvidence:
    """Feed the newest increment to the tests, once (see the module docstring)."""
    if facts is not None and facts.baseline_step is not None and facts.candidate_step is not None:
        inc_b, inc_c = facts.baseline_step, facts.candidate_step
    else:
        inc_b, inc_c = baseline, candidate
    if inc_c.window_start_ms < evidence.through_ms or (
        inc_b.window_start_ms,
        inc_b.window_end_ms,
    ) != (inc_c.window_start_ms, inc_c.window_end_ms):
        return evidence
    ev = evidence if evidence.increments else _fresh(gates)
    a_err, a_lat = _alphas(gates)
    # Thresholds never depend on the data they judge: the baseline's window before
    # the increment when there is one, else the window of the previous evaluation.
    before = _before(baseline, inc_b)
    t95 = _median(ev.baseline_p95_ms) or _threshold(before, 0.95, P95_THRESHOLD_MIN)
    t99 = _median(ev.baseline_p99_ms) or _threshold(before, 0.99, P99_THRESHOLD_MIN)
    return SequentialEvidence(
        errors=ev.errors.update(
            inc_c.errors, inc_c.requests, inc_b.errors, inc_b.requests, cap=_cap(a_err)
        ),
        budget=ev.budget.update(inc_c.errors, inc_c.requests, cap=_cap(a_err)),
        slow_p95=_slow(ev.slow_p95, t95, inc_b, inc_c, _cap(a_lat)),
        slow_p99=_slow(ev.slow_p99, t99, inc_b, inc_c, _cap(a_lat)),
        increments=ev.increments + 1,
        through_ms=inc_c.window_end_ms,
        baseline_p95_ms=_remember(ev.baseline_p95_ms, inc_b, baseline, 0.95, P95_THRESHOLD_MIN),
        baseline_p99_ms=_remember(ev.baseline_p99_ms, inc_b, baseline, 0.99, P99_THRESHOLD_MIN),
    )


def _median(values: tuple[float, ...]) -> float:
    """The lower median: of two (early in a rollout) the smaller, so that one baseline
    burst does not lift the threshold (and hide a regression) for several steps."""
    return sorted(values)[(len(values) - 1) // 2] if values else 0.0


def _remember(
    kept: tuple[float, ...], inc_b: WindowStats, window: WindowStats, q: float, min_n: int
) -> tuple[float, ...]:
    """Keep the increment's baseline quantile (the window's when it holds too few)."""
    value = _threshold(inc_b.service, q, min_n) or _threshold(window.service, q, min_n)
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
    """Latency and error verdicts from the evidence gathered so far."""
    return [
        _latency_result(baseline, candidate, evidence, gates),
        _error_result(evidence, gates),
    ]
