"""Anytime-valid sequential tests over count data, and the rollout gates built on them.

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
the newest step's stats when the caller passes them
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
from typing import TYPE_CHECKING

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.gates import GateResult, Verdict, latency_gate
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.spec import Gates
from graylane.rollouts.vocabulary import DecisionRule

if TYPE_CHECKING:  # the rollout controller calls in here with its inputs
    from graylane.policy_engine.logic.rollout import RolloutSignals

__all__ = [
    "BET",
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
RECENT = 5
"""How many recent increments :meth:`RatioTest.persistent` looks at."""
"""Share of each increment's (capped) likelihood ratio a test stakes; see the module docstring."""


def _bounded(log_l: float, cap: float) -> float:
    """``log((1 - BET) + BET * min(L, e^cap))`` for ``log_l = log L``."""
    return math.log((1.0 - BET) + BET * math.exp(min(log_l, cap)))


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
    ) -> RatioTest:
        """Add one increment (counts disjoint from every earlier one)."""
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
