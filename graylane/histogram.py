"""A sparse, log-bucketed, mergeable latency histogram.

The bucket scheme is the one of ``graylane.v1.LatencyHistogram``: bucket 0
holds values ``v <= min_ms``; bucket ``i >= 1`` holds
``min_ms * growth**(i-1) < v <= min_ms * growth**i``. Two histograms with the
same ``(min_ms, growth)`` merge by adding their bucket counts, so a worker can
send one histogram per batch and the policy engine can add them up per window.

Quantiles use the nearest-rank definition (the smallest recorded value ``x``
with at least ``q * count`` values ``<= x``; numpy's ``method="inverted_cdf"``)
and answer with a representative value of the bucket holding that rank: the
value ``2*L*U / (L + U)`` of the bucket ``(L, U]``, which is at most
``(growth - 1) / (growth + 1)`` away from any value of the bucket in relative
terms (about 2.44 % for the default growth of 1.05). The answer is clipped to
the largest value seen, so ``quantile(1.0)`` is exact. Values at or below
``min_ms`` (bucket 0) are answered with ``min(min_ms, max_ms)``: an absolute
error of at most ``min_ms`` (0.05 ms by default).

``record`` mutates (a histogram is a builder while a batch runs); ``merge`` and
``+`` are pure and return a new histogram.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from graylane.errors import GraylaneError

__all__ = [
    "DEFAULT_GROWTH",
    "DEFAULT_MIN_MS",
    "HistogramMismatch",
    "LatencyHistogram",
    "relative_error_bound",
]

DEFAULT_MIN_MS = 0.05
DEFAULT_GROWTH = 1.05


class HistogramMismatch(GraylaneError, ValueError):
    """Two histograms with different bucket schemes cannot be merged."""


def relative_error_bound(growth: float = DEFAULT_GROWTH) -> float:
    """The largest relative error of a quantile for values above ``min_ms``."""
    return (growth - 1.0) / (growth + 1.0)


class LatencyHistogram:
    """Counts of latencies (milliseconds) in logarithmic buckets."""

    __slots__ = ("_buckets", "_count", "_log_growth", "_max", "_sum", "growth", "min_ms")

    def __init__(
        self,
        min_ms: float = DEFAULT_MIN_MS,
        growth: float = DEFAULT_GROWTH,
        *,
        buckets: Mapping[int, int] | None = None,
        sum_ms: float = 0.0,
        max_ms: float = 0.0,
    ) -> None:
        if not (math.isfinite(min_ms) and min_ms > 0.0):
            raise ValueError(f"min_ms must be a positive number, got {min_ms}")
        if not (math.isfinite(growth) and growth > 1.0):
            raise ValueError(f"growth must be a number above 1, got {growth}")
        self.min_ms = float(min_ms)
        self.growth = float(growth)
        self._log_growth = math.log(self.growth)
        self._buckets: dict[int, int] = {}
        for index, n in (buckets or {}).items():
            if index < 0 or n < 0:
                raise ValueError(f"bucket {index} with count {n} is invalid")
            if n:
                self._buckets[int(index)] = int(n)
        self._count = sum(self._buckets.values())
        self._sum = float(sum_ms)
        self._max = float(max_ms)

    # -- scheme ---------------------------------------------------------------

    def bucket_index(self, value_ms: float) -> int:
        """The bucket that holds ``value_ms``."""
        if value_ms <= self.min_ms:
            return 0
        index = max(1, math.ceil(math.log(value_ms / self.min_ms) / self._log_growth))
        # The logarithm can land one bucket off at a boundary; settle it on the bounds.
        while value_ms > self.bucket_upper(index):
            index += 1
        while index > 1 and value_ms <= self.bucket_upper(index - 1):
            index -= 1
        return index

    def bucket_upper(self, index: int) -> float:
        """Upper bound (inclusive) of bucket ``index``."""
        return self.min_ms * self.growth**index

    def bucket_lower(self, index: int) -> float:
        """Lower bound (exclusive) of bucket ``index``; 0 for bucket 0."""
        return 0.0 if index <= 0 else self.min_ms * self.growth ** (index - 1)

    def same_scheme(self, other: LatencyHistogram) -> bool:
        return self.min_ms == other.min_ms and self.growth == other.growth

    # -- recording (mutating) -------------------------------------------------

    def record(self, value_ms: float, n: int = 1) -> None:
        """Count ``n`` requests that took ``value_ms`` milliseconds."""
        if n < 0:
            raise ValueError(f"cannot record a negative count {n}")
        if not math.isfinite(value_ms) or value_ms < 0.0:
            raise ValueError(f"latency must be a finite non-negative number, got {value_ms}")
        if n == 0:
            return
        index = self.bucket_index(value_ms)
        self._buckets[index] = self._buckets.get(index, 0) + n
        self._count += n
        self._sum += value_ms * n
        self._max = max(self._max, value_ms)

    def record_many(self, values_ms: Iterable[float]) -> None:
        for value in values_ms:
            self.record(value)

    def update(self, other: LatencyHistogram) -> None:
        """Add ``other``'s counts into this histogram (in place)."""
        if not self.same_scheme(other):
            raise HistogramMismatch(
                f"cannot merge scheme ({other.min_ms}, {other.growth}) "
                f"into ({self.min_ms}, {self.growth})"
            )
        for index, n in other._buckets.items():
            self._buckets[index] = self._buckets.get(index, 0) + n
        self._count += other._count
        self._sum += other._sum
        self._max = max(self._max, other._max)

    # -- pure operations ------------------------------------------------------

    def copy(self) -> LatencyHistogram:
        clone = LatencyHistogram.__new__(LatencyHistogram)  # valid already: no checks again
        clone.min_ms, clone.growth, clone._log_growth = self.min_ms, self.growth, self._log_growth
        clone._buckets = dict(self._buckets)
        clone._count, clone._sum, clone._max = self._count, self._sum, self._max
        return clone

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        """A new histogram holding the counts of both; neither input changes."""
        merged = self.copy()
        merged.update(other)
        return merged

    def __add__(self, other: LatencyHistogram) -> LatencyHistogram:
        return self.merge(other)

    @classmethod
    def merge_all(
        cls,
        histograms: Iterable[LatencyHistogram],
        min_ms: float = DEFAULT_MIN_MS,
        growth: float = DEFAULT_GROWTH,
    ) -> LatencyHistogram:
        """The sum of ``histograms`` (an empty histogram of the given scheme if none)."""
        total = cls(min_ms, growth)
        for h in histograms:
            total.update(h)
        return total

    @classmethod
    def of(
        cls,
        values_ms: Iterable[float],
        min_ms: float = DEFAULT_MIN_MS,
        growth: float = DEFAULT_GROWTH,
    ) -> LatencyHistogram:
        hist = cls(min_ms, growth)
        hist.record_many(values_ms)
        return hist

    # -- reading --------------------------------------------------------------

    @property
    def count(self) -> int:
        return self._count

    @property
    def sum_ms(self) -> float:
        return self._sum

    @property
    def max_ms(self) -> float:
        return self._max

    @property
    def mean_ms(self) -> float:
        """Mean latency; 0.0 when empty."""
        return self._sum / self._count if self._count else 0.0

    @property
    def buckets(self) -> Mapping[int, int]:
        """A read-only view of the non-empty buckets."""
        return MappingProxyType(self._buckets)

    def is_empty(self) -> bool:
        return self._count == 0

    def quantile(self, q: float) -> float:
        """The nearest-rank ``q``-quantile (0 <= q <= 1); 0.0 when empty.

        See the module docstring for the estimate and its error bound.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is outside 0..1")
        if self._count == 0:
            return 0.0
        # The tiny slack keeps q * count = 99.00000000000001 on rank 99.
        rank = max(1, math.ceil(q * self._count - 1e-9))
        seen = 0
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if seen >= rank:
                return min(self._representative(index), self._max)
        return self._max  # unreachable: counts add up to count

    def quantiles(self, qs: tuple[float, ...]) -> tuple[float, ...]:
        """:meth:`quantile` of each of ``qs`` (ascending), in one pass over the buckets."""
        if not all(0.0 <= a <= b <= 1.0 for a, b in zip(qs, (*qs[1:], 1.0), strict=True)):
            raise ValueError(f"quantiles {qs} are not ascending within 0..1")
        count = self._count
        if count == 0:
            return tuple(0.0 for _ in qs)
        ranks = [max(1, math.ceil(q * count - 1e-9)) for q in qs]
        out: list[float] = []
        want, last = ranks[0], len(ranks)
        seen = 0
        buckets = self._buckets
        for index in sorted(buckets):
            seen += buckets[index]
            while seen >= want:
                out.append(min(self._representative(index), self._max))
                if len(out) == last:
                    return tuple(out)
                want = ranks[len(out)]
        return tuple(out)  # unreachable: counts add up to count

    def _representative(self, index: int) -> float:
        if index == 0:
            return self.min_ms
        lower, upper = self.bucket_lower(index), self.bucket_upper(index)
        return 2.0 * lower * upper / (lower + upper)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LatencyHistogram):
            return NotImplemented
        return (
            self.same_scheme(other)
            and self._buckets == other._buckets
            and self._sum == other._sum
            and self._max == other._max
        )

    __hash__ = None  # type: ignore[assignment]  # mutable: not hashable

    def __repr__(self) -> str:
        return (
            f"LatencyHistogram(count={self._count}, mean_ms={self.mean_ms:.3f}, "
            f"max_ms={self._max:.3f}, buckets={len(self._buckets)})"
        )
