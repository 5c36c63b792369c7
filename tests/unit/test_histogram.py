"""LatencyHistogram: bucket scheme, merging, quantile accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graylane.histogram import (
    DEFAULT_GROWTH,
    DEFAULT_MIN_MS,
    HistogramMismatch,
    LatencyHistogram,
    relative_error_bound,
)

latencies = st.lists(
    st.floats(min_value=0.0, max_value=60_000.0, allow_nan=False, allow_infinity=False),
    max_size=200,
)
positive_latencies = st.lists(
    st.floats(min_value=DEFAULT_MIN_MS * 1.0001, max_value=60_000.0, allow_nan=False),
    min_size=1,
    max_size=300,
)


def _core(h: LatencyHistogram) -> tuple[dict[int, int], int, float]:
    return dict(h.buckets), h.count, h.max_ms


def test_bucket_scheme_matches_the_contract() -> None:
    h = LatencyHistogram()
    assert h.bucket_index(0.0) == 0
    assert h.bucket_index(DEFAULT_MIN_MS) == 0
    assert h.bucket_index(DEFAULT_MIN_MS * 1.0000001) == 1
    for i in (1, 2, 10, 100, 250):
        upper = DEFAULT_MIN_MS * DEFAULT_GROWTH**i
        assert h.bucket_index(upper) == i  # upper bound is inclusive
        assert h.bucket_index(upper * 1.000001) == i + 1


@given(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False))
def test_every_value_lies_within_its_bucket(v: float) -> None:
    h = LatencyHistogram()
    i = h.bucket_index(v)
    assert h.bucket_lower(i) < v <= h.bucket_upper(i) or (i == 0 and v <= h.min_ms)


def test_counts_sum_mean_and_max() -> None:
    h = LatencyHistogram.of([1.0, 2.0, 3.0, 10.0])
    h.record(5.0, n=2)
    assert h.count == 6
    assert h.sum_ms == pytest.approx(26.0)
    assert h.max_ms == 10.0
    assert h.mean_ms == pytest.approx(26.0 / 6)
    assert LatencyHistogram().mean_ms == 0.0
    assert LatencyHistogram().quantile(0.99) == 0.0


def test_record_rejects_nonsense() -> None:
    h = LatencyHistogram()
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            h.record(bad)
    with pytest.raises(ValueError):
        h.record(1.0, n=-1)
    with pytest.raises(ValueError):
        h.quantile(1.5)
    with pytest.raises(ValueError):
        LatencyHistogram(growth=1.0)


def test_merge_is_pure_and_rejects_another_scheme() -> None:
    a, b = LatencyHistogram.of([1.0, 2.0]), LatencyHistogram.of([3.0])
    before_a, before_b = _core(a), _core(b)
    c = a + b
    assert c.count == 3 and c.max_ms == 3.0
    assert _core(a) == before_a and _core(b) == before_b
    with pytest.raises(HistogramMismatch):
        a.merge(LatencyHistogram(growth=1.1))


@given(latencies, latencies, latencies)
def test_merge_is_associative_and_commutative(
    xs: list[float], ys: list[float], zs: list[float]
) -> None:
    a, b, c = LatencyHistogram.of(xs), LatencyHistogram.of(ys), LatencyHistogram.of(zs)
    left, right = (a + b) + c, a + (b + c)
    assert _core(left) == _core(right)
    assert left.sum_ms == pytest.approx(right.sum_ms)
    assert _core(a + b) == _core(b + a)
    assert (a + b).sum_ms == pytest.approx((b + a).sum_ms)
    # Merging equals recording everything into one histogram.
    assert _core(left) == _core(LatencyHistogram.of(xs + ys + zs))


@settings(max_examples=200)
@given(positive_latencies, st.sampled_from([0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]))
def test_quantile_within_relative_error_of_numpy(values: list[float], q: float) -> None:
    h = LatencyHistogram.of(values)
    exact = float(np.quantile(np.array(values), q, method="inverted_cdf"))
    assert abs(h.quantile(q) - exact) <= relative_error_bound() * exact * (1 + 1e-9)


@given(latencies.filter(bool))
def test_small_values_have_an_absolute_error_of_min_ms(values: list[float]) -> None:
    h = LatencyHistogram.of(values)
    for q in (0.0, 0.5, 0.99, 1.0):
        exact = float(np.quantile(np.array(values), q, method="inverted_cdf"))
        err = abs(h.quantile(q) - exact)
        assert err <= max(relative_error_bound() * exact * (1 + 1e-9), DEFAULT_MIN_MS)


def test_quantile_one_is_the_exact_maximum() -> None:
    values = np.random.default_rng(1).lognormal(3.0, 0.5, 10_000)
    h = LatencyHistogram.of(values.tolist())
    assert h.quantile(1.0) == pytest.approx(values.max())
    for q in (0.5, 0.95, 0.99):
        exact = float(np.quantile(values, q, method="inverted_cdf"))
        assert h.quantile(q) == pytest.approx(exact, rel=relative_error_bound())


def test_buckets_view_is_read_only_and_equality_is_by_content() -> None:
    h = LatencyHistogram.of([1.0, 1.0, 7.0])
    with pytest.raises(TypeError):
        h.buckets[0] = 5  # type: ignore[index]
    assert h == LatencyHistogram.of([7.0, 1.0, 1.0])
    assert h != LatencyHistogram.of([1.0, 7.0])
    assert h.copy() == h and h.copy() is not h


@given(
    st.lists(st.floats(min_value=0.0, max_value=10_000.0), max_size=200),
    st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=5),
)
def test_quantiles_in_one_pass_equal_each_quantile(values: list[float], qs: list[float]) -> None:
    h = LatencyHistogram.of(values)
    ordered = tuple(sorted(qs))
    assert h.quantiles(ordered) == tuple(h.quantile(q) for q in ordered)


def test_quantiles_refuse_an_unordered_or_out_of_range_list() -> None:
    h = LatencyHistogram.of([1.0, 2.0])
    with pytest.raises(ValueError):
        h.quantiles((0.9, 0.5))
    with pytest.raises(ValueError):
        h.quantiles((0.5, 1.5))


def test_a_copy_is_equal_and_apart() -> None:
    h = LatencyHistogram.of([1.0, 2.0, 300.0])
    c = h.copy()
    assert c == h and c.count == 3 and c.max_ms == 300.0
    c.record(5.0)
    assert h.count == 3 and c.count == 4
