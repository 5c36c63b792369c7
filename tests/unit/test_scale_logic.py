"""The replica controller (issue 12, item 3): scale out at the floor or on growing lag,
scale in after a cooldown of low load, and QoS stepping up only once scale settled."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.policy_engine.logic.qos import QosDecisionKind, QosState, evaluate_qos
from graylane.policy_engine.logic.scale import (
    ScaleDecisionKind,
    ScalePolicy,
    ScaleReason,
    ScaleSignals,
    ScaleState,
    evaluate_scale,
    initial_scale_state,
    overload_beyond_floor,
    scale_unsettled,
)
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.errors import InputMismatch, InvalidPolicy
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule
from tests.support.window_stats import window_stats

POLICY = ScalePolicy(
    max_replicas=3, lag_growth_s=10.0, out_dwell_s=15.0, cooldown_s=30.0, settle_s=5.0
)
T0 = 1_000_000


def sig(**kw: object) -> ScaleSignals:
    base: dict[str, object] = {
        "model": "m",
        "version": "v1",
        "replicas": 1,
        "partitions": 3,
        "variant": "int8",
        "throughput_rps": 100.0,
    }
    base.update(kw)
    return ScaleSignals(**base)  # type: ignore[arg-type]


def state(desired: int = 1, **kw: object) -> ScaleState:
    return replace(ScaleState(model="m", version="v1", desired=desired), **kw)  # type: ignore[arg-type]


def test_a_breach_at_the_quality_floor_asks_for_one_more_replica_and_learns_capacity() -> None:
    d = evaluate_scale(state(), POLICY, sig(floor_breach=True, breaching=True), T0)
    assert d.kind is ScaleDecisionKind.SCALE_OUT
    assert (d.desired, d.reason, d.rule) == (2, ScaleReason.FLOOR_BREACH, "scale_floor_breach")
    assert d.changed and d.after.last_change_ms == T0
    learned = d.after.capacity_of("int8")
    assert learned is not None and learned.rps == pytest.approx(100.0)
    assert "1 -> 2 replicas" in d.detail


def spike(**kw: object) -> ScaleSignals:
    """fp32 (40 rps engine) shedding a 45 rps spike it serves 27 rps of: the path adds
    1000/27 - 1000/40 = 12 ms a request, so the int8 floor (90 rps engine) serves
    1000 / (11.1 + 12) = 43.2 rps a replica here, not 90."""
    base: dict[str, object] = {
        "variant": "fp32",
        "breaching": True,
        "throughput_rps": 27.0,
        "offered_rps": 45.0,
        "replica_capacity_rps": 40.0,
        "floor_capacity_rps": 90.0,
    }
    base.update(kw)
    return sig(**base)


def test_an_overload_the_floor_cannot_carry_scales_out_before_the_ladder_gets_there() -> None:
    why = overload_beyond_floor(spike(), 0.7)
    assert why is not None and "43.2 rps at the floor" in why
    d = evaluate_scale(state(), POLICY, spike(), T0)
    assert d.kind is ScaleDecisionKind.SCALE_OUT
    assert (d.desired, d.reason, d.rule) == (2, ScaleReason.OVERLOAD, "scale_overload")
    # with two replicas the floor carries it: no third
    two = spike(replicas=2, throughput_rps=44.0, offered_rps=45.0)
    assert overload_beyond_floor(two, 0.7) is None


@pytest.mark.parametrize(
    "calm",
    [
        {"breaching": False},  # no breach: the load is served
        {"offered_rps": 30.0},  # a breach below the running rung's capacity: not load
        {"floor_capacity_rps": 0.0},  # no calibrated floor: cannot tell
        {"replica_capacity_rps": 0.0},
        {"offered_rps": 42.0, "throughput_rps": 40.0, "floor_capacity_rps": 200.0},
    ],
)
def test_no_overload_scale_out_without_a_proven_overload_beyond_the_floor(
    calm: dict[str, object],
) -> None:
    assert overload_beyond_floor(spike(**calm), 0.7) is None
    d = evaluate_scale(state(), POLICY, spike(**calm), T0)
    assert d.reason is not ScaleReason.OVERLOAD


def test_no_breach_no_lag_holds() -> None:
    d = evaluate_scale(state(), POLICY, sig(), T0)
    assert d.kind is ScaleDecisionKind.HOLD and not d.changed
    assert d.rule is DecisionRule.WITHIN_BAND


@pytest.mark.parametrize(
    ("max_replicas", "partitions", "bound"), [(3, 2, 2), (2, 6, 2), (4, 0, 4), (4, 3, 3)]
)
def test_replicas_are_bounded_by_max_and_by_the_topics_partitions(
    max_replicas: int, partitions: int, bound: int
) -> None:
    policy = replace(POLICY, max_replicas=max_replicas)
    s = state(desired=bound)
    d = evaluate_scale(s, policy, sig(floor_breach=True, replicas=bound, partitions=partitions), T0)
    assert d.kind is ScaleDecisionKind.HOLD and d.rule is DecisionRule.SCALE_AT_MAX
    below = evaluate_scale(
        state(desired=bound - 1),
        policy,
        sig(floor_breach=True, replicas=bound - 1, partitions=partitions),
        T0,
    )
    assert below.desired == bound


def test_no_second_step_while_the_replicas_asked_for_are_not_serving_or_within_dwell() -> None:
    s = state(desired=2, last_change_ms=T0)
    pending = evaluate_scale(s, POLICY, sig(floor_breach=True, replicas=1), T0 + 60_000)
    assert pending.rule is DecisionRule.SCALE_PENDING and not pending.changed
    dwell = evaluate_scale(s, POLICY, sig(floor_breach=True, replicas=2), T0 + 10_000)
    assert dwell.rule is DecisionRule.MIN_DWELL and not dwell.changed
    after = evaluate_scale(s, POLICY, sig(floor_breach=True, replicas=2), T0 + 15_000)
    assert after.kind is ScaleDecisionKind.SCALE_OUT and after.desired == 3


def run(s: ScaleState, policy: ScalePolicy, steps: list[tuple[int, ScaleSignals]]) -> list:  # type: ignore[type-arg]
    out = []
    for at, signals in steps:
        d = evaluate_scale(s, policy, signals, at)
        out.append(d)
        s = d.after
    return out


def test_lag_that_keeps_growing_for_the_window_scales_out() -> None:
    steps = [(T0 + i * 1000, sig(lag=10 + 5 * i)) for i in range(12)]
    decisions = run(state(), POLICY, steps)
    kinds = [d.kind for d in decisions]
    first_out = kinds.index(ScaleDecisionKind.SCALE_OUT)
    assert first_out == 10  # held 10 s (lag_growth_s), not earlier
    assert decisions[first_out].reason is ScaleReason.LAG_GROWING
    assert "lag grew 10 -> 60" in decisions[first_out].detail


def test_a_lag_that_falls_restarts_the_growth_timer() -> None:
    lags = [10, 20, 30, 40, 50, 45, 50, 60, 70, 80, 90, 100, 110]
    steps = [(T0 + i * 1000, sig(lag=lag)) for i, lag in enumerate(lags)]
    decisions = run(state(), POLICY, steps)
    assert all(d.kind is ScaleDecisionKind.HOLD for d in decisions)
    # a flat, non-zero lag does not count as growth either
    flat = run(state(), POLICY, [(T0 + i * 1000, sig(lag=50)) for i in range(20)])
    assert all(d.kind is ScaleDecisionKind.HOLD for d in flat)


def test_scale_in_after_a_cooldown_of_sustained_low_load() -> None:
    # 2 replicas; one int8 replica served 100 rps when it needed help.
    out = evaluate_scale(state(), POLICY, sig(floor_breach=True, throughput_rps=100.0), T0)
    s = out.after
    low = sig(replicas=2, throughput_rps=40.0)  # < 0.5 x 1 replica x 100 rps
    decisions = run(s, POLICY, [(T0 + 5_000 + i * 1000, low) for i in range(40)])
    ins = [i for i, d in enumerate(decisions) if d.kind is ScaleDecisionKind.SCALE_IN]
    assert len(ins) == 1
    d = decisions[ins[0]]
    assert d.desired == 1 and d.reason is ScaleReason.LOW_LOAD
    assert d.at_ms - (T0 + 5_000) >= 30_000  # the whole cooldown of low load
    assert d.at_ms - T0 >= 30_000  # and a cooldown since the scale-out


def test_load_above_half_of_one_fewer_replicas_keeps_the_replicas() -> None:
    s = state(desired=2, last_change_ms=T0)
    s = replace(
        s,
        capacities=evaluate_scale(state(), POLICY, sig(floor_breach=True), T0).after.capacities,
    )
    busy = sig(replicas=2, throughput_rps=60.0)
    decisions = run(s, POLICY, [(T0 + i * 1000, busy) for i in range(120)])
    assert all(not d.changed for d in decisions)


def test_a_breach_or_a_load_rise_restarts_the_cooldown() -> None:
    s = state(desired=2, last_change_ms=T0 - 100_000)
    steps = []
    for i in range(60):
        breaching = i == 20
        signals = sig(replicas=2, throughput_rps=30.0, breaching=breaching)
        steps.append((T0 + i * 1000, replace(signals, replica_capacity_rps=100.0)))
    decisions = run(s, POLICY, steps)
    first_in = next(i for i, d in enumerate(decisions) if d.kind is ScaleDecisionKind.SCALE_IN)
    assert first_in == 21 + 30  # cooldown counted again from after the breach


def test_capacity_is_learned_whenever_the_version_is_saturated() -> None:
    # fp32 breached with 2 replicas at 30 rps: 15 rps per replica, kept per variant
    d = evaluate_scale(
        state(desired=2),
        POLICY,
        sig(variant="fp32", replicas=2, throughput_rps=30.0, breaching=True),
        T0,
    )
    learned = d.after.capacity_of("fp32")
    assert not d.changed and learned is not None and learned.rps == pytest.approx(15.0)
    calm = evaluate_scale(
        d.after, POLICY, sig(variant="fp32", replicas=2, throughput_rps=3.0), T0 + 1000
    )
    assert calm.after.capacity_of("fp32") == learned  # only saturation teaches


def test_unknown_capacity_never_scales_in_and_calibration_is_used_when_given() -> None:
    s = state(desired=2, last_change_ms=T0 - 100_000)
    idle = run(s, POLICY, [(T0 + i * 1000, sig(replicas=2, throughput_rps=1.0)) for i in range(60)])
    assert all(not d.changed for d in idle)
    calibrated = sig(replicas=2, throughput_rps=1.0, replica_capacity_rps=50.0)
    done = run(s, POLICY, [(T0 + i * 1000, calibrated) for i in range(60)])
    assert [d.desired for d in done if d.changed] == [1]


def test_scale_in_stops_at_min_replicas_and_disabled_policy_holds() -> None:
    policy = replace(POLICY, min_replicas=2)
    s = state(desired=2, last_change_ms=T0 - 100_000)
    cal = sig(replicas=2, throughput_rps=0.5, replica_capacity_rps=50.0)
    assert all(not d.changed for d in run(s, policy, [(T0 + i * 1000, cal) for i in range(60)]))
    off = evaluate_scale(state(), ScalePolicy(), sig(floor_breach=True), T0)
    assert off.rule is DecisionRule.DISABLED and not off.changed


def test_initial_state_follows_what_serves_within_the_bounds() -> None:
    assert initial_scale_state("m", "v1", POLICY, replicas=2, partitions=3).desired == 2
    assert initial_scale_state("m", "v1", POLICY, replicas=0).desired == 1
    assert initial_scale_state("m", "v1", POLICY, replicas=5, partitions=2).desired == 2


def test_signals_of_another_version_are_refused() -> None:
    with pytest.raises(InputMismatch):
        evaluate_scale(state(), POLICY, sig(version="v2"), T0)


@pytest.mark.parametrize(
    "bad",
    [
        {"min_replicas": 0},
        {"max_replicas": 0},
        {"cooldown_s": -1.0},
        {"in_load_fraction": 0.0},
        {"settle_s": float("nan")},
    ],
)
def test_policy_validates_itself(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicy):
        ScalePolicy(**bad)  # type: ignore[arg-type]


def test_settled_once_every_replica_serves_and_the_change_is_old_enough() -> None:
    s = state(desired=2, last_change_ms=T0)
    assert "1 serving" in scale_unsettled(s, POLICY, 1, T0 + 60_000)
    assert "settle" in scale_unsettled(s, POLICY, 2, T0 + 2_000)
    assert scale_unsettled(s, POLICY, 2, T0 + 5_000) == ""
    assert scale_unsettled(state(), POLICY, 0, T0) == ""  # nothing ever changed
    # a scale-in: the leaving replica still serves (its partitions change hands)
    leaving = scale_unsettled(state(1, last_change_ms=T0), POLICY, 2, T0 + 60_000)
    assert "one is leaving" in leaving


QOS = QosPolicy(
    model="m",
    version="v1",
    slo_p99_ms=100.0,
    ladder=("fp32", "int8"),
    sustain_s=0.0,
    min_dwell_s=0.0,
)


def stats(p99: float) -> WindowStats:
    """An int8 window ending at T0 (p50 and mean at half the p99)."""
    return window_stats(
        p99,
        variant="int8",
        window_start_ms=T0 - 10_000,
        window_end_ms=T0,
        requests=100,
        throughput_rps=10.0,
        p50_ms=p99 / 2,
        p95_ms=p99,
        mean_ms=p99 / 2,
    )


def test_qos_steps_up_only_once_scale_is_settled_and_still_steps_down() -> None:
    at_floor = QosState(model="m", version="v1", active_variant="int8")
    held = evaluate_qos(at_floor, QOS, stats(20.0), T0, scale_hold="2 asked for, 1 serving")
    assert held.kind is QosDecisionKind.HOLD and held.rule is DecisionRule.SCALE_UNSETTLED
    assert held.scale_hold == "2 asked for, 1 serving" and "not settled" in held.reason
    free = evaluate_qos(at_floor, QOS, stats(20.0), T0)
    assert free.kind is QosDecisionKind.STEP_UP
    top = QosState(model="m", version="v1", active_variant="fp32")
    fp32 = replace(stats(500.0), variant="fp32")
    down = evaluate_qos(top, QOS, fp32, T0, scale_hold="settling")
    assert down.kind is QosDecisionKind.STEP_DOWN
