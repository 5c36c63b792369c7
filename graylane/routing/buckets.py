"""Sticky hash buckets and monotone bucket ranges.

``bucket = hash(routing_key) mod 10000``. Non-stable versions own contiguous
ranges starting at bucket 0, in a fixed order; the stable version owns the rest.
Raising a candidate's weight only extends its range upward, so a key that
reached the candidate at weight ``w`` stays on it at every weight ``>= w``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from graylane.errors import GraylaneError

BUCKETS = 10_000


class WeightError(GraylaneError, ValueError):
    """Weights that cannot be turned into bucket ranges."""


@dataclass(frozen=True, order=True)
class BucketRange:
    """Half-open range ``[start, end)`` of buckets."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end <= BUCKETS:
            raise WeightError(f"bucket range [{self.start}, {self.end}) is outside 0..{BUCKETS}")

    def __contains__(self, bucket: object) -> bool:
        return isinstance(bucket, int) and self.start <= bucket < self.end

    @property
    def size(self) -> int:
        return self.end - self.start


def _hash64(data: str, salt: bytes) -> int:
    digest = hashlib.blake2b(data.encode("utf-8"), digest_size=8, key=salt).digest()
    return int.from_bytes(digest, "big")


def bucket_of(routing_key: str) -> int:
    """The sticky bucket of a routing key (stable across processes and versions)."""
    return _hash64(routing_key, b"graylane-route") % BUCKETS


def sample_fraction(request_id: str, salt: str = "shadow") -> float:
    """A stable pseudo-random number in [0, 1) for sampling (e.g. shadow copies)."""
    return _hash64(request_id, salt.encode("utf-8")[:64]) / 2.0**64


def percent_to_buckets(percent: float) -> int:
    if not 0.0 <= percent <= 100.0:
        raise WeightError(f"weight {percent}% is outside 0..100")
    return round(percent * BUCKETS / 100.0)


def assign_ranges(
    stable_version: str, others: Sequence[tuple[str, float]]
) -> dict[str, BucketRange]:
    """Contiguous ranges for ``others`` (in the given order) from bucket 0 up.

    The stable version gets the remaining buckets at the top. Weights are in
    percent; their sum may not exceed 100.
    """
    ranges: dict[str, BucketRange] = {}
    start = 0
    for version, percent in others:
        if version == stable_version:
            raise WeightError(f"version {version} is both stable and weighted")
        if version in ranges:
            raise WeightError(f"version {version} is weighted twice")
        size = percent_to_buckets(percent)
        if start + size > BUCKETS:
            raise WeightError("weights add up to more than 100%")
        ranges[version] = BucketRange(start, start + size)
        start += size
    ranges[stable_version] = BucketRange(start, BUCKETS)
    return ranges
