"""SlidingWindow: panes, whole-pane windows, lanes, per-version merging, eviction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.window import (
    ALL_VARIANTS,
    Lane,
    SlidingWindow,
    TelemetrySample,
    WindowKey,
)

KEY = WindowKey("m", "v1", "fp32")


def sample(
    at_ms: int,
    latencies: list[float],
    *,
    errors: int = 0,
    version: str = "v1",
    variant: str = "fp32",
    worker: str = "w1",
    shadow: int = 0,
    lag: int = 0,
    load: float = 0.5,
    queue: list[float] | None = None,
    queue_mean: float = 0.0,
) -> TelemetrySample:
    return TelemetrySample(
        model="m",
        version=version,
        variant=variant,
        worker_id=worker,
        completed_at_ms=at_ms,
        request_count=len(latencies),
        error_count=errors,
        latency=LatencyHistogram.of(latencies),
        queue_wait=LatencyHistogram.of(queue or []),
        queue_wait_mean_ms=queue_mean,
        device_load=load,
        shadow_count=shadow,
        lag=lag,
    )


def test_sample_validation() -> None:
    with pytest.raises(ValueError):
        sample(0, [1.0], errors=2)
    with pytest.raises(ValueError):
        sample(0, [1.0], shadow=2)


def test_window_covers_whole_panes_only() -> None:
    w = SlidingWindow(10_000, 2_000)
    w.add(sample(1_000, [10.0] * 4, errors=1))
    w.add(sample(9_999, [20.0] * 4))
    w.add(sample(10_500, [30.0] * 100))  # pane [10 s, 12 s) still filling at 11 s
    s = w.stats(KEY, 11_000)
    assert s is not None
    assert (s.window_start_ms, s.window_end_ms) == (0, 10_000)
    assert (s.requests, s.errors, s.batches) == (8, 1, 2)
    assert s.error_rate == pytest.approx(1 / 8)
    assert s.p99_ms == pytest.approx(20.0, rel=0.03)
    # Two seconds later the window has slid by one pane.
    s2 = w.stats(KEY, 12_000)
    assert s2 is not None and (s2.window_start_ms, s2.window_end_ms) == (2_000, 12_000)
    assert s2.requests == 104


def test_no_stats_without_a_batch_in_the_window() -> None:
    w = SlidingWindow()
    assert w.stats(KEY, 50_000) is None
    w.add(sample(1_000, [1.0]))
    assert w.stats(KEY, 1_500) is None  # only the pane in progress
    assert w.stats(KEY, 40_000) is None  # long gone


def test_throughput_counts_from_first_sight() -> None:
    w = SlidingWindow(10_000, 2_000)
    w.add(sample(100_500, [5.0] * 40))
    w.add(sample(102_500, [5.0] * 40))
    s = w.stats(KEY, 104_000)
    assert s is not None
    # Seen since 100 s: 80 requests over 4 s, not over the 10 s window.
    assert s.throughput_rps == pytest.approx(20.0)
    w.add(sample(106_100, [5.0] * 20))
    s = w.stats(KEY, 112_000)  # window [102 s, 112 s): fully after first sight
    assert s is not None and s.throughput_rps == pytest.approx(6.0)


def test_shadow_batches_stay_out_of_live_stats() -> None:
    w = SlidingWindow()
    w.add(sample(1_000, [10.0] * 10, version="v2"))
    w.add(sample(1_200, [500.0] * 5, errors=5, version="v2", shadow=5))
    live = w.stats(WindowKey("m", "v2", "fp32"), 2_000)
    shadow = w.stats(WindowKey("m", "v2", "fp32"), 2_000, Lane.SHADOW)
    assert live is not None and shadow is not None
    assert (live.requests, live.errors) == (10, 0)
    assert live.p99_ms == pytest.approx(10.0, rel=0.03)
    assert (shadow.requests, shadow.errors) == (5, 5)
    assert w.keys() == w.keys(Lane.SHADOW) == frozenset({WindowKey("m", "v2", "fp32")})
    # A mixed batch cannot be split: it counts as live.
    w.add(sample(1_300, [10.0] * 4, version="v2", shadow=1))
    live = w.stats(WindowKey("m", "v2", "fp32"), 2_000)
    assert live is not None and live.requests == 14


def test_stats_by_version_merges_variants() -> None:
    w = SlidingWindow()
    w.add(sample(500, [10.0] * 10, variant="fp32", errors=1))
    w.add(sample(700, [4.0] * 30, variant="int8", worker="w2"))
    w.add(sample(800, [1.0] * 30, version="v2"))
    s = w.stats_by_version("m", "v1", 2_000)
    assert s is not None
    assert (s.variant, s.requests, s.errors, s.batches) == (ALL_VARIANTS, 40, 1, 2)
    only = w.stats_by_version("m", "v2", 2_000)
    assert only is not None and only.variant == "fp32" and only.requests == 30
    assert w.stats_by_version("m", "v9", 2_000) is None


def test_queue_wait_device_load_and_lag() -> None:
    w = SlidingWindow()
    w.add(sample(100, [1.0] * 2, queue=[4.0, 6.0], load=0.2, lag=50, worker="a"))
    w.add(sample(900, [1.0] * 2, queue_mean=10.0, load=0.6, lag=7, worker="a"))
    w.add(sample(400, [1.0] * 2, load=0.4, lag=3, worker="b"))
    s = w.stats(KEY, 2_000)
    assert s is not None
    # (4 + 6 + 2 x 10 + 2 x 0) / 6 requests.
    assert s.queue_wait_mean_ms == pytest.approx(30.0 / 6)
    assert s.device_load == pytest.approx(0.4)
    assert s.lag == 7 + 3  # latest per worker, summed


def test_evict_drops_old_panes_and_late_samples() -> None:
    w = SlidingWindow(10_000, 2_000)
    for t in range(0, 30_000, 1_000):
        w.add(sample(t, [1.0]))
    removed = w.evict(30_000)
    assert removed == 10  # panes 0..9 s ... 18 s; the window at 30 s starts at 20 s
    s = w.stats(KEY, 30_000)
    assert s is not None and s.requests == 10
    assert not w.add(sample(5_000, [1.0]))
    assert w.dropped_late == 1
    w.evict(100_000)
    assert w.keys() == frozenset()


def test_window_must_be_a_multiple_of_the_step() -> None:
    with pytest.raises(ValueError):
        SlidingWindow(10_000, 3_000)


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=40_000),
            st.lists(st.floats(min_value=0.1, max_value=500.0), min_size=1, max_size=8),
            st.booleans(),
        ),
        max_size=40,
    ),
    st.integers(min_value=0, max_value=50_000),
)
def test_window_equals_direct_aggregation(
    batches: list[tuple[int, list[float], bool]], now_ms: int
) -> None:
    w = SlidingWindow(10_000, 2_000)
    for at, lats, err in batches:
        w.add(sample(at, lats, errors=1 if err else 0))
    start, end = w.window_bounds(now_ms)
    inside = [(lats, err) for at, lats, err in batches if start <= at < end]
    s = w.stats(KEY, now_ms)
    if not inside:
        assert s is None
        return
    assert s is not None
    direct = LatencyHistogram.of([x for lats, _ in inside for x in lats])
    assert s.requests == direct.count
    assert s.errors == sum(1 for _, err in inside if err)
    assert s.p99_ms == direct.quantile(0.99)
    assert s.p50_ms == direct.quantile(0.5)
    assert s.mean_ms == pytest.approx(direct.mean_ms)


def test_a_batch_added_after_a_read_in_the_same_step_is_in_the_next_read() -> None:
    w = SlidingWindow(10_000, 1_000)
    w.add(sample(500, [10.0, 10.0]))
    first = w.stats_by_version("m", "v1", 1_500)
    assert first is not None and first.requests == 2
    w.add(sample(700, [10.0], errors=1))  # same pane, same window end: the read must see it
    again = w.stats_by_version("m", "v1", 1_500)
    assert again is not None and (again.requests, again.errors) == (3, 1)
    assert w.stats(KEY, 1_500) == again


def test_versions_are_read_apart_among_many_and_evicted_versions_leave_no_trace() -> None:
    w = SlidingWindow(4_000, 1_000)
    for v in range(50):
        w.add(sample(500, [float(v + 1)] * (v + 1), version=f"v{v}"))
    w.add(sample(600, [99.0], version="v7", variant="int8"))
    for v in (0, 7, 49):
        s = w.stats_by_version("m", f"v{v}", 1_000)
        assert s is not None
        assert s.requests == v + 1 + (1 if v == 7 else 0)
    assert w.stats_by_version("m", "v7", 1_000).variant == ALL_VARIANTS  # type: ignore[union-attr]
    w.evict(10_000)  # every pane is older than any window at 10 s
    assert w.stats_by_version("m", "v7", 10_000) is None
    w.add(sample(10_500, [5.0], version="v7"))
    back = w.stats_by_version("m", "v7", 11_000)
    assert back is not None and (back.requests, back.variant) == (1, "fp32")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "read", "evict"]),
            st.integers(min_value=0, max_value=1_500),
            st.lists(st.floats(min_value=0.1, max_value=500.0), min_size=1, max_size=4),
            st.sampled_from(["fp32", "int8"]),
        ),
        max_size=80,
    )
)
def test_a_window_read_again_and_again_equals_its_samples_aggregated_directly(
    ops: list[tuple[str, int, list[float], str]],
) -> None:
    """Reads sum a slot's panes incrementally (two stacks, rebuilt as the window slides):
    over any interleaving of adds (late ones included, into panes already read), reads at
    a clock that moves on, and evictions, every read equals the window's samples merged
    directly."""
    w = SlidingWindow(4_000, 500)  # 8 panes: reads take the incremental sums
    clock = 0
    kept: list[tuple[int, list[float], str, bool]] = []
    for i, (op, delta, lats, variant) in enumerate(ops):
        if op == "add":
            at = max(1, clock - delta)  # up to 1.5 s late: into panes already summed
            err = i % 3 == 0
            if w.add(sample(at, lats, errors=1 if err else 0, variant=variant)):
                kept.append((at, lats, variant, err))
            continue
        clock += delta
        if op == "evict":
            w.evict(clock)
            continue
        start, end = w.window_bounds(clock)
        for read_variant in ("fp32", "int8", None):
            inside = [
                (lats_, err_)
                for at_, lats_, var_, err_ in kept
                if start <= at_ < end and read_variant in (None, var_)
            ]
            s = (
                w.stats_by_version("m", "v1", clock)
                if read_variant is None
                else w.stats(WindowKey("m", "v1", read_variant), clock)
            )
            if not inside:
                assert s is None
                continue
            assert s is not None
            direct = LatencyHistogram.of([x for lats_, _ in inside for x in lats_])
            assert s.requests == direct.count
            assert s.errors == sum(1 for _, err_ in inside if err_)
            assert s.batches == len(inside)
            assert (s.p50_ms, s.p95_ms, s.p99_ms) == (
                direct.quantile(0.5),
                direct.quantile(0.95),
                direct.quantile(0.99),
            )
            assert s.mean_ms == pytest.approx(direct.mean_ms)


def test_a_late_batch_into_a_pane_already_read_is_in_the_next_read() -> None:
    w = SlidingWindow(4_000, 500)
    w.add(sample(100, [10.0]))
    assert w.stats(KEY, 2_000).requests == 1  # type: ignore[union-attr]
    w.add(sample(2_100, [10.0]))
    assert w.stats(KEY, 2_600).requests == 2  # type: ignore[union-attr]
    w.add(sample(2_200, [10.0]))  # late: into the newest pane the last read summed
    assert w.stats(KEY, 2_600).requests == 3  # type: ignore[union-attr]
    w.add(sample(150, [10.0]))  # late: into the oldest pane of the window
    assert w.stats(KEY, 2_600).requests == 4  # type: ignore[union-attr]
    assert w.stats(KEY, 4_600).requests == 2  # type: ignore[union-attr]  # 100 and 150 left it


def test_samples_up_to_a_quarter_window_late_keep_the_window_sums() -> None:
    """An engine reading a step or two behind must not rebuild each key's sums at every
    read: samples that late land in the sums' newest part; older ones still count."""
    w = SlidingWindow(10_000, 500)
    for t in range(0, 20_000, 250):
        w.add(sample(t, [10.0]))
    assert w.stats(KEY, 20_000).requests == 40  # type: ignore[union-attr]
    slot = (Lane.LIVE, KEY)
    built = w._sums[slot]
    for late in (19_900, 19_000, 17_600):  # 1, 2 and 5 panes before the window's end
        w.add(sample(late, [10.0]))
        assert w._sums[slot] is built
    assert w.stats(KEY, 20_000).requests == 43  # type: ignore[union-attr]
    w.add(sample(12_000, [10.0]))  # deep in the window: the sums are rebuilt, it counts
    assert w.stats(KEY, 20_000).requests == 44  # type: ignore[union-attr]
    assert w._sums[slot] is not built


def test_the_settled_time_trails_now_by_the_typical_lateness() -> None:
    w = SlidingWindow(10_000, 500)
    assert w.settled_ms(5_000) == 5_000  # nothing arrived yet: nothing to wait for
    for received in range(0, 10_000, 100):
        w.note_arrival(received - 700, received)  # every batch 700 ms late
    assert w.settled_ms(10_000) == 9_300
    # One straggler 6 s late, in one step, does not move it: the median of the steps.
    w.note_arrival(10_050 - 6_000, 10_050)
    assert w.settled_ms(10_100) == 9_400
    # A worker whose clock runs ahead reads as on time; one an hour behind as half a window.
    w2 = SlidingWindow(10_000, 500)
    w2.note_arrival(5_000, 4_000)
    assert w2.settled_ms(4_000) == 4_000
    w3 = SlidingWindow(10_000, 500)
    w3.note_arrival(0, 3_600_000)
    assert w3.settled_ms(3_600_000) == 3_595_000
