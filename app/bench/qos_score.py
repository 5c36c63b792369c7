"""Scoring of one ``bench qos`` run from what the client saw (pure).

Every request submitted in the scored span counts: answered OK within the SLO
(good), answered OK too late, shed (``SHED``), another error, or never answered.

A generation's SLO is stated on its time to first token and its time per output
token (:class:`GenerationSlo`): it is good when both are within their
objectives, however long its answer (its whole latency is then not judged
unless ``slo_ms`` is stated too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SHED_CODE",
    "GenerationSlo",
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
    ttft_ms: float = 0.0
    """A generation's time to first token (from its creation); 0.0 for other requests."""
    tpot_ms: float = 0.0
    """A generation's mean time per output token after the first (0.0: one token)."""


@dataclass(frozen=True, slots=True)
class GenerationSlo:
    """A generation's objectives: TTFT and TPOT (0 = not stated), in milliseconds."""

    ttft_ms: float = 0.0
    tpot_ms: float = 0.0

    def met(self, outcome: RequestOutcome) -> bool:
        """An OK generation within both objectives (a one-token answer has no TPOT)."""
        return (
            outcome.ok
            and (self.ttft_ms <= 0.0 or 0.0 < outcome.ttft_ms <= self.ttft_ms)
            and (self.tpot_ms <= 0.0 or outcome.tpot_ms <= self.tpot_ms)
        )


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
    ttft_p99_ms: float = 0.0
    """Generations: p99 time to first token of those answered OK (0.0 otherwise)."""
    tpot_p99_ms: float = 0.0
    """Generations: p99 time per output token of those answered OK (0.0 otherwise)."""

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
    generation: GenerationSlo | None = None,
) -> RunScore:
    """Score the requests submitted in ``[start, end)`` (seconds on the sender's clock).

    With ``generation``, a request is good when it meets it (and ``slo_ms`` when > 0).
    """
    ids = [rid for rid, at in sent_at.items() if start <= at < end]
    ok_latencies: list[float] = []
    ttfts: list[float] = []
    tpots: list[float] = []
    shed = errors = unanswered = good = 0
    for rid in ids:
        answer = answers.get(rid)
        if answer is None:
            unanswered += 1
        elif answer.ok:
            ok_latencies.append(answer.latency_ms)
            in_latency = slo_ms <= 0.0 or answer.latency_ms <= slo_ms
            if generation is None:
                good += in_latency
            else:
                good += in_latency and generation.met(answer)
                ttfts.append(answer.ttft_ms)
                tpots.append(answer.tpot_ms)
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
        ttft_p99_ms=float(np.percentile(ttfts, 99)) if ttfts else 0.0,
        tpot_p99_ms=float(np.percentile(tpots, 99)) if tpots else 0.0,
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
    generation: GenerationSlo | None = None,
) -> tuple[Slice, ...]:
    """:func:`score` per ``width_s`` slice of ``[start, end)``: where a run lost its goodput."""
    if width_s <= 0:
        raise ValueError(f"slice width {width_s} must be positive")
    slices: list[Slice] = []
    at = start
    while at < end:
        upper = min(at + width_s, end)
        slices.append(
            Slice(
                at - start,
                score(sent_at, answers, start=at, end=upper, slo_ms=slo_ms, generation=generation),
            )
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
