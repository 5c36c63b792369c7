"""LatencyHistogram <-> ``graylane.v1.LatencyHistogram`` (the wire form)."""

from __future__ import annotations

import math

from graylane.histogram import DEFAULT_GROWTH, DEFAULT_MIN_MS, LatencyHistogram
from graylane.v1 import telemetry_pb2

__all__ = ["MAX_BUCKET_MS", "histogram_from_pb", "histogram_to_pb", "max_bucket_index"]


def histogram_to_pb(h: LatencyHistogram) -> telemetry_pb2.LatencyHistogram:
    return telemetry_pb2.LatencyHistogram(
        min_ms=h.min_ms,
        growth=h.growth,
        buckets=dict(h.buckets),
        count=h.count,
        sum_ms=h.sum_ms,
        max_ms=h.max_ms,
    )


def histogram_from_pb(pb: telemetry_pb2.LatencyHistogram) -> LatencyHistogram:
    """The histogram of ``pb``; an empty one without a scheme takes the default scheme.

    ``count`` is recomputed from the buckets. Raises ValueError when buckets
    come without a valid scheme.
    """
    if pb.min_ms <= 0.0 or pb.growth <= 1.0:
        if pb.buckets:
            raise ValueError(
                f"histogram with buckets but no valid scheme ({pb.min_ms}, {pb.growth})"
            )
        return LatencyHistogram(DEFAULT_MIN_MS, DEFAULT_GROWTH)
    cap = max_bucket_index(pb.min_ms, pb.growth)
    buckets: dict[int, int] = {}
    for index, n in pb.buckets.items():
        capped = min(int(index), cap)
        buckets[capped] = buckets.get(capped, 0) + int(n)
    return LatencyHistogram(
        pb.min_ms, pb.growth, buckets=buckets, sum_ms=pb.sum_ms, max_ms=pb.max_ms
    )


MAX_BUCKET_MS = 1e12
"""Latencies above this (about 31 years) share the last bucket decoded from the wire."""


def max_bucket_index(min_ms: float, growth: float) -> int:
    """The highest bucket index kept at decode (upper bound finite, <= MAX_BUCKET_MS)."""
    if not (math.isfinite(min_ms) and math.isfinite(growth) and min_ms > 0.0 and growth > 1.0):
        return 0
    return max(1, math.floor(math.log(MAX_BUCKET_MS / min_ms) / math.log(growth)))
