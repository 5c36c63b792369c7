"""``bench policy-scale``: its figures from what the engine exports, and the evidence floor."""

from __future__ import annotations

import math

from graylane.app.bench.policy_scale import (
    PolicyScaleConfig,
    SizeResult,
    evidence_ticks,
    max_models,
    tick_quantile,
)


def size(
    models: int, *, decisions: tuple[float, ...], lag_end: int = 0, missed: int = 0
) -> SizeResult:
    return SizeResult(
        models=models,
        records_per_s=3.0 * models,
        cpu_us_per_record=100.0,
        cpu_share=0.1,
        tick_ms_p50=1.0,
        tick_ms_p99=2.0,
        rss_mb=90.0,
        lag_start=0,
        lag_end=lag_end,
        decision_ms=decisions,
        detection_ms=tuple(d + 2_500 for d in decisions),
        missed=missed,
        ready_s=1.0,
    )


def test_tick_quantile_reads_the_growth_between_two_scrapes() -> None:
    before = {0.001: 10.0, 0.01: 10.0, 0.1: 10.0, math.inf: 10.0}
    after = {0.001: 10.0, 0.01: 60.0, 0.1: 109.0, math.inf: 110.0}  # 100 new ticks
    assert tick_quantile(before, after, 0.5) == 10.0  # 50 of 100 fell in (1 ms, 10 ms]
    assert tick_quantile(before, after, 0.99) == 100.0
    assert tick_quantile(before, before, 0.99) != tick_quantile(before, before, 0.99)  # NaN


def test_max_models_is_the_largest_size_kept_up_with_and_every_smaller_one_too() -> None:
    results = [
        size(10, decisions=(300.0, 400.0)),
        size(100, decisions=(500.0, 900.0)),
        size(1000, decisions=(800.0, 3_000.0)),  # p99 past the bound
        size(3000, decisions=(500.0,)),
    ]
    assert max_models(results, 2_000.0) == 100
    assert max_models([size(10, decisions=(100.0,), missed=1)], 2_000.0) == 0
    grows = size(10, decisions=(100.0,), lag_end=10_000)
    assert grows.lag_growing and max_models([grows], 2_000.0) == 0


def test_the_evidence_floor_is_several_ticks_and_fewer_with_a_longer_step() -> None:
    short = evidence_ticks(PolicyScaleConfig(step_ms=500))
    long = evidence_ticks(PolicyScaleConfig(step_ms=2_000))
    assert short >= 2 and 1 <= long <= short
