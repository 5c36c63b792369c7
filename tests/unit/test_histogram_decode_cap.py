"""Bucket indices from the wire are capped at decode, so a hostile record cannot overflow."""

from __future__ import annotations

import math

from graylane.histogram_pb import MAX_BUCKET_MS, histogram_from_pb, max_bucket_index
from graylane.v1 import telemetry_pb2


def test_huge_bucket_index_is_capped_and_quantile_stays_finite() -> None:
    pb = telemetry_pb2.LatencyHistogram(
        min_ms=0.1, growth=1.1, buckets={2**31 - 1: 3, 5: 1}, sum_ms=1.0, max_ms=1.0
    )
    h = histogram_from_pb(pb)
    cap = max_bucket_index(0.1, 1.1)
    assert max(h.buckets) == cap
    assert h.buckets[cap] == 3
    assert h.count == 4
    assert math.isfinite(h.bucket_upper(max(h.buckets)))
    assert h.bucket_upper(cap) <= MAX_BUCKET_MS * (1 + 1e-9)


def test_indices_below_the_cap_are_kept() -> None:
    pb = telemetry_pb2.LatencyHistogram(min_ms=0.1, growth=1.1, buckets={0: 1, 7: 2})
    assert dict(histogram_from_pb(pb).buckets) == {0: 1, 7: 2}
