"""bench rollback: the bad canary's first step carries enough requests, and the
detection figures summarise every run (a run never rolled back is not dropped)."""

from __future__ import annotations

import itertools
import math

import pytest

from graylane.app.bench.rollback import (
    BAD_CANDIDATE_RPS,
    MAX_FIRST_WEIGHT,
    bad_steps,
    first_weight,
    summary,
)


@pytest.mark.parametrize("rate", [20.0, 60.0, 100.0, 600.0, 5000.0])
def test_first_weight_gives_the_bad_canary_its_requests_within_bounds(rate: float) -> None:
    w = first_weight(rate)
    assert 5.0 <= w <= MAX_FIRST_WEIGHT
    if 5.0 < w < MAX_FIRST_WEIGHT:
        assert rate * w / 100.0 == pytest.approx(BAD_CANDIDATE_RPS, rel=0.01)
    steps = bad_steps(rate)
    weights = [s[0] for s in steps]
    assert weights[0] == w and weights[-1] == 100.0
    assert all(a < b for a, b in itertools.pairwise(weights))  # a ramp rises


def test_summary_counts_a_missed_detection_as_slowest() -> None:
    runs = [
        {"detect_s": 4.0, "rolled_back": 1.0, "bad_served": 10.0},
        {"detect_s": 6.0, "rolled_back": 1.0, "bad_served": 20.0},
        {"detect_s": float("nan"), "rolled_back": 0.0, "bad_served": 90.0},
    ]
    got = summary(runs)
    assert got["median"] == 6.0 and math.isinf(got["max"]) and got["served"] == 40.0
    assert summary(runs[:2])["max"] == 6.0
