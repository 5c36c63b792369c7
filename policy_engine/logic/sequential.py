"""Anytime-valid sequential tests: test supermartingales over count data (math only).

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "BET",
    "RATE_GRID",
    "RATIO_GRID",
    "RECENT",
    "RateTest",
    "RatioTest",
    "SequentialEvidence",
    "log_threshold",
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
