"""The demo's spike is derived from measured capacity: beyond what the floor rung carries."""

from __future__ import annotations

import pytest

from graylane.app.demo.story import (
    BEYOND_FLOOR,
    MAX_RAISE,
    RAISE_FACTOR,
    floor_path_rps,
    raised_spike_rate,
    spike_rate,
)


def test_the_floor_pays_the_paths_overhead_per_request() -> None:
    # fp32: 25 rps engine, 13 rps through the whole path -> 36.9 ms overhead a request
    floor = floor_path_rps(13.0, 25.0, 59.0)
    assert floor == pytest.approx(1000.0 / (1000.0 / 59.0 + 1000.0 / 13.0 - 1000.0 / 25.0))
    assert 13.0 < floor < 59.0
    assert floor_path_rps(0.0, 25.0, 59.0) == 0.0


def test_the_spike_is_x3_unless_one_worker_at_the_floor_would_carry_it() -> None:
    base = 6.5
    raised = spike_rate(base, 3.0, 13.0, 25.0, 59.0)
    assert raised == pytest.approx(BEYOND_FLOOR * floor_path_rps(13.0, 25.0, 59.0))
    assert raised > 3.0 * base
    # a floor no faster than fp32: x3 is already beyond it
    assert spike_rate(base, 3.0, 13.0, 25.0, 24.0) == pytest.approx(3.0 * base)
    # unmeasured: x3
    assert spike_rate(base, 3.0, 0.0, 25.0, 59.0) == pytest.approx(3.0 * base)


def test_a_spike_carried_calmly_is_raised_up_to_its_cap() -> None:
    slo = 250.0
    assert raised_spike_rate(30.0, 30.0, 60.0, 0.0, slo) == pytest.approx(30.0 * RAISE_FACTOR)
    # raised step by step, never past MAX_RAISE x the first rate
    rate, steps = 30.0, 0
    while (higher := raised_spike_rate(rate, 30.0, 60.0, 0.0, slo)) is not None:
        rate, steps = higher, steps + 1
    assert rate == pytest.approx(MAX_RAISE * 30.0) and steps > 1


def test_a_spike_that_strains_the_stack_is_kept() -> None:
    slo = 250.0
    assert raised_spike_rate(30.0, 30.0, 260.0, 0.0, slo) is None  # p99 over the SLO
    assert raised_spike_rate(30.0, 30.0, 60.0, 0.05, slo) is None  # admission sheds
    assert raised_spike_rate(30.0, 30.0, None, 0.0, slo) is None  # nothing answered
