"""Exact tests: Fisher one-sided, binomial tail, and the verdicts built on them."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graylane.policy_engine.logic.gates import (
    Verdict,
    agreement_test,
    binomial_cdf,
    error_rate_test,
    fisher_greater,
    hypergeom_sf,
)


def brute_fisher(a: int, n1: int, c: int, n2: int) -> float:
    total, k = n1 + n2, a + c
    denom = comb(total, n1)
    tail = sum(
        Fraction(comb(k, x) * comb(total - k, n1 - x), denom) for x in range(a, min(k, n1) + 1)
    )
    return float(tail)


def brute_binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(comb(n, x) * p**x * (1 - p) ** (n - x) for x in range(0, k + 1))


counts = st.integers(min_value=0, max_value=60).flatmap(
    lambda n: st.tuples(st.integers(min_value=0, max_value=n), st.just(n))
)


@given(counts, counts)
def test_fisher_matches_brute_force(cand: tuple[int, int], base: tuple[int, int]) -> None:
    (a, n1), (c, n2) = cand, base
    expected = 1.0 if n1 == 0 or n2 == 0 else brute_fisher(a, n1, c, n2)
    assert fisher_greater(a, n1, c, n2) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@given(
    st.integers(min_value=0, max_value=80),
    st.integers(min_value=0, max_value=80),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_binomial_cdf_matches_brute_force(k: int, n: int, p: float) -> None:
    expected = 1.0 if k >= n else brute_binomial_cdf(k, n, p)
    assert binomial_cdf(k, n, p) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_known_fisher_value() -> None:
    # The classic tea-tasting table: 3 of 4 right, one-sided p = 17/70.
    assert fisher_greater(3, 4, 1, 4) == pytest.approx(17 / 70)


def test_large_counts_are_fast_and_sane() -> None:
    p_same = fisher_greater(1_000, 100_000, 1_000, 100_000)
    assert 0.4 < p_same < 0.6
    assert fisher_greater(1_500, 100_000, 1_000, 100_000) < 1e-20
    assert hypergeom_sf(0, 10, 3, 5) == 1.0
    assert hypergeom_sf(4, 10, 3, 5) == 0.0


def test_error_verdicts() -> None:
    # Within the tolerance: pass, however significant.
    ok = error_rate_test(150, 10_000, 100, 10_000, max_delta=0.02, alpha=0.01)
    assert ok.significant and not ok.exceeds_margin and ok.verdict is Verdict.PASS
    # Over the tolerance but two errors in 25 requests: not evidence yet.
    unsure = error_rate_test(2, 25, 5, 475, max_delta=0.02, alpha=0.01)
    assert unsure.exceeds_margin and not unsure.significant
    assert unsure.verdict is Verdict.INCONCLUSIVE
    # A real regression: +5 pp over 500 requests.
    bad = error_rate_test(30, 500, 5, 500, max_delta=0.02, alpha=0.01)
    assert bad.verdict is Verdict.FAIL
    assert bad.delta == pytest.approx(0.05)
    assert "+5.00pp" in bad.describe()


def test_error_counts_are_validated() -> None:
    with pytest.raises(ValueError):
        fisher_greater(3, 2, 0, 10)


def test_agreement_verdicts() -> None:
    assert agreement_test(99, 100, min_rate=0.98, alpha=0.01).verdict is Verdict.PASS
    assert agreement_test(47, 50, min_rate=0.98, alpha=0.01).verdict is Verdict.INCONCLUSIVE
    assert agreement_test(45, 50, min_rate=0.98, alpha=0.01).verdict is Verdict.FAIL
    assert agreement_test(0, 0, min_rate=0.98, alpha=0.01).verdict is Verdict.INCONCLUSIVE
