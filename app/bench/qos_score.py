"""Scoring of one ``bench qos`` run from what the client saw (pure).

Every request submitted in the scored span counts: answered OK within the SLO
(good), answered OK too late, shed (``SHED``), another error, or never answered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SHED_CODE",
    "RequestOutcome",
    "RunScore",
    "Slice",
    "score",
    "seconds_to_top",
    "timeline",
]

SHED_CODE = "SHED"


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """How one request ended, as the client saw it."""

    ok: bool
    error_code: str
    latency_ms: float


@dataclass(frozen=True, slots=True)
class RunScore:
    requests: int
    goodput: float
    """Share of all requests answered OK within the SLO."""
    p99_admitted_ms: float
    """p99 client latency of the requests answered OK (admitted and served)."""
    shed: int
    errors: int
    """Answered with an error other than SHED."""
    unanswered: int
    good: int = 0
    """Answered OK within the SLO."""

    @property
    def late(self) -> int:
        """Answered OK, after the SLO."""
        return self.requests - self.good - self.shed - self.errors - self.unanswered


def score(
    sent_at: Mapping[str, float],
    answers: Mapping[str, RequestOutcome],
    *,
    start: float,
    end: float,
    slo_ms: float,
) -> RunScore:
    """Score the requests submitted in ``[start, end)`` (seconds on the sender's clock)."""
    ids = [rid for rid, at in sent_at.items() if start <= at < end]
    ok_latencies: list[float] = []
    shed = errors = unanswered = good = 0
    for rid in ids:
        answer = answers.get(rid)
        if answer is None:
            unanswered += 1
        elif answer.ok:
            ok_latencies.append(answer.latency_ms)
            good += answer.latency_ms <= slo_ms
        elif answer.error_code == SHED_CODE:
            shed += 1
        else:
            errors += 1
    return RunScore(
        requests=len(ids),
        goodput=good / len(ids) if ids else 0.0,
        p99_admitted_ms=float(np.percentile(ok_latencies, 99)) if ok_latencies else 0.0,
        shed=shed,
        errors=errors,
        unanswered=unanswered,
        good=good,
    )


@dataclass(frozen=True, slots=True)
class Slice:
    """The requests submitted in ``[start_s, start_s + width)`` of a run, scored."""

    start_s: float
    """Seconds from the scored span's start."""
    score: RunScore


def timeline(
    sent_at: Mapping[str, float],
    answers: Mapping[str, RequestOutcome],
    *,
    start: float,
    end: float,
    slo_ms: float,
    width_s: float = 5.0,
) -> tuple[Slice, ...]:
    """:func:`score` per ``width_s`` slice of ``[start, end)``: where a run lost its goodput."""
    if width_s <= 0:
        raise ValueError(f"slice width {width_s} must be positive")
    slices: list[Slice] = []
    at = start
    while at < end:
        upper = min(at + width_s, end)
        slices.append(
            Slice(at - start, score(sent_at, answers, start=at, end=upper, slo_ms=slo_ms))
        )
        at = upper
    return tuple(slices)


def seconds_to_top(
    changes: Sequence[tuple[float, str]], top: str, spike_end: float
) -> float | None:
    """Seconds from ``spike_end`` until the variant was ``top`` for good.

    ``changes`` are (time, variant) in time order. 0.0 when it already was at the
    spike's end (or never left it); None when it did not come back.
    """
    current, since = top, float("-inf")
    for at, variant in changes:
        if variant != current:
            current, since = variant, at
    if current != top:
        return None
    return max(0.0, since - spike_end)
