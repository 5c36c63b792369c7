"""Capped exponential backoff with jitter."""

from __future__ import annotations

import random

import pytest

from graylane.kafka.backoff import Backoff, BackoffPolicy


def test_ceiling_grows_exponentially_then_stays_at_the_cap() -> None:
    p = BackoffPolicy(base_s=0.1, factor=2.0, cap_s=1.0, jitter=0.0)
    assert [p.ceiling(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert p.ceiling(10_000) == 1.0  # no overflow after a long outage


def test_jitter_stays_within_its_share_of_the_delay() -> None:
    p = BackoffPolicy(base_s=1.0, factor=2.0, cap_s=8.0, jitter=0.5)
    assert p.delay(2, 0.0) == pytest.approx(2.0)
    assert p.delay(2, 0.999999) == pytest.approx(4.0, rel=1e-5)
    full = BackoffPolicy(base_s=1.0, cap_s=8.0, jitter=1.0)
    assert full.delay(3, 0.0) == 0.0
    assert full.delay(3, 0.5) == pytest.approx(4.0)


def test_backoff_counts_failures_and_resets_on_success() -> None:
    draws = iter([0.0, 0.0, 0.0, 0.0])
    b = Backoff(BackoffPolicy(base_s=0.5, factor=3.0, cap_s=2.0, jitter=1.0), rand=lambda: 1.0)
    assert [b.next_delay() for _ in range(3)] == pytest.approx([0.5, 1.5, 2.0])
    assert b.failures == 3
    b.reset()
    assert b.next_delay() == pytest.approx(0.5)
    b2 = Backoff(BackoffPolicy(jitter=1.0), rand=lambda: next(draws))
    assert b2.next_delay() == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [{"base_s": 0.0}, {"base_s": 2.0, "cap_s": 1.0}, {"factor": 0.5}, {"jitter": 1.5}],
)
def test_nonsense_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(**kwargs)


def test_backoff_grows_is_capped_jittered_and_resets() -> None:
    """The audit sink's retry backoff (a 20 % jitter share) under the same claims."""
    policy = BackoffPolicy(base_s=0.1, cap_s=1.0, factor=2.0, jitter=0.2)
    backoff = Backoff(policy, rand=random.Random(3).random)
    delays = [backoff.next_delay() for _ in range(8)]
    for n, delay in enumerate(delays):
        base = min(1.0, 0.1 * 2**n)
        assert base * 0.8 <= delay <= min(1.0, base * 1.2)
    assert max(delays) <= 1.0 and delays[-1] >= 0.8
    backoff.reset()
    assert backoff.next_delay() <= 0.12
    with pytest.raises(ValueError):
        BackoffPolicy(base_s=2.0, cap_s=1.0)
