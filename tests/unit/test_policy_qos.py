"""QoS controller: sustain, dwell, hysteresis, floor, load ceilings, like-for-like."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.policy_engine.logic.qos import (
    Ceiling,
    QosDecision,
    QosDecisionKind,
    QosState,
    evaluate_qos,
    initial_qos_state,
    qos_during_rollout,
)
from graylane.policy_engine.logic.window import ALL_VARIANTS, WindowStats
from graylane.rollouts.errors import InputMismatch, InvalidPolicy
from graylane.rollouts.qos_policy import QosPolicy
from tests.support.window_stats import window_stats

POLICY = QosPolicy(
    model="m",
    version="v1",
    slo_p99_ms=50.0,
    ladder=("fp32", "fp16", "int8"),
    quality_floor="int8",
)
T0 = 1_700_000_000_000


class Loop:
    """Feeds one window a second through the controller."""

    def __init__(self, policy: QosPolicy = POLICY, state: QosState | None = None) -> None:
        self.policy = policy
        self.state = state or initial_qos_state(policy)
        self.t = T0
        self.decisions: list[QosDecision] = []

    def tick(self, stats: WindowStats | None, seconds: float = 1.0) -> QosDecision:
        self.t += int(seconds * 1000)
        d = evaluate_qos(self.state, self.policy, stats, self.t)
        self.decisions.append(d)
        self.state = d.after
        return d

    def changes(self) -> list[QosDecision]:
        return [d for d in self.decisions if d.changed]


@pytest.mark.parametrize(
    "changes",
    [
        {"ladder": ()},
        {"ladder": ("fp32", "fp32")},
        {"quality_floor": "int4"},
        {"slo_p99_ms": 0.0},
        {"step_up_ratio": 1.5},
        {"min_dwell_s": -1.0},
        {"up_load_fraction": 0.0},
    ],
)
def test_invalid_policies_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicy):
        replace(POLICY, **changes)  # type: ignore[arg-type]


def test_thresholds_and_floor() -> None:
    assert POLICY.down_threshold_ms == pytest.approx(60.0)
    assert POLICY.up_threshold_ms == pytest.approx(30.0)
    assert POLICY.floor_index == 2
    assert replace(POLICY, quality_floor="").floor_index == 2
    assert replace(POLICY, quality_floor="fp16").floor_index == 1


def test_step_down_needs_a_sustained_breach() -> None:
    loop = Loop()
    for _ in range(4):
        d = loop.tick(window_stats(80.0))
        assert (d.kind, d.rule) == (QosDecisionKind.HOLD, "sustain")
    d = loop.tick(window_stats(80.0))  # 4 s since the first breach was seen
    assert d.kind is QosDecisionKind.HOLD
    d = loop.tick(window_stats(80.0))  # 5 s: sustained
    assert (d.kind, d.rule) == (QosDecisionKind.STEP_DOWN, "p99_breach")
    assert d.variant == "fp16" and d.after.last_change_ms == loop.t
    assert d.after.ceiling_of("fp32") == Ceiling("fp32", 50.0, loop.t)
    assert "80.0 ms" in d.reason


def test_a_gap_in_the_breach_restarts_sustain() -> None:
    loop = Loop()
    for p99 in (80.0, 80.0, 80.0, 40.0, 80.0, 80.0, 80.0, 80.0):
        d = loop.tick(window_stats(p99))
        assert not d.changed
    assert loop.state.breach_since_ms == loop.t - 3_000


def test_min_dwell_between_changes() -> None:
    loop = Loop()
    for _ in range(6):
        loop.tick(window_stats(80.0))
    assert loop.state.active_variant == "fp16"
    rules = [loop.tick(window_stats(80.0, variant="fp16")).rule for _ in range(29)]
    assert rules[:5] == ["sustain"] * 5 and set(rules[5:]) == {"min_dwell"}
    d = loop.tick(window_stats(80.0, variant="fp16"))  # 30 s after the last change
    assert d.kind is QosDecisionKind.STEP_DOWN and d.variant == "int8"


def test_never_below_the_quality_floor() -> None:
    loop = Loop(
        replace(POLICY, quality_floor="fp16"),
        QosState(model="m", version="v1", active_variant="fp16"),
    )
    for _ in range(20):
        d = loop.tick(window_stats(500.0, variant="fp16"))
    assert (d.kind, d.rule) == (QosDecisionKind.HOLD, "quality_floor")
    assert loop.state.active_variant == "fp16"


def test_never_above_the_top_rung() -> None:
    loop = Loop()
    for _ in range(20):
        d = loop.tick(window_stats(5.0))
    assert (d.kind, d.rule) == (QosDecisionKind.HOLD, "top_rung")


def test_step_up_after_sustained_calm() -> None:
    state = QosState(model="m", version="v1", active_variant="int8", last_change_ms=T0 - 60_000)
    loop = Loop(state=state)
    for _ in range(5):
        assert not loop.tick(window_stats(10.0, variant="int8")).changed
    d = loop.tick(window_stats(10.0, variant="int8"))
    assert (d.kind, d.rule, d.variant) == (QosDecisionKind.STEP_UP, "p99_calm", "fp16")


def test_within_the_band_nothing_moves() -> None:
    state = QosState(model="m", version="v1", active_variant="fp16")
    loop = Loop(state=state)
    for _ in range(100):
        d = loop.tick(window_stats(45.0, variant="fp16"))  # between 30 and 60 ms
        assert (d.kind, d.rule) == (QosDecisionKind.HOLD, "within_band")


def test_oscillating_signal_does_not_flap() -> None:
    loop = Loop(state=QosState(model="m", version="v1", active_variant="fp16"))
    for i in range(600):
        # Breach and calm alternate every 2 s: never sustained for 5 s.
        loop.tick(window_stats(90.0 if (i // 2) % 2 else 10.0, variant="fp16"))
    assert loop.changes() == []


def test_queue_wait_breach() -> None:
    policy = replace(POLICY, max_queue_wait_ms=20.0)
    loop = Loop(policy)
    for _ in range(6):
        d = loop.tick(window_stats(40.0, queue_wait_mean_ms=35.0))
    assert (d.kind, d.rule) == (QosDecisionKind.STEP_DOWN, "queue_wait_breach")
    # Low p99 is not calm while the queue is still long.
    state = QosState(model="m", version="v1", active_variant="fp16")
    loop = Loop(policy, state)
    for _ in range(10):
        d = loop.tick(window_stats(10.0, variant="fp16", queue_wait_mean_ms=15.0))
    assert d.rule == "within_band"


def test_no_data_holds_and_restarts_both_timers() -> None:
    loop = Loop()
    for _ in range(4):
        loop.tick(window_stats(80.0))
    for stats in (None, window_stats(80.0, requests=0)):
        d = loop.tick(stats)
        assert (d.kind, d.rule) == (QosDecisionKind.HOLD, "no_data")
        assert d.after.breach_since_ms is None and d.after.calm_since_ms is None
    for _ in range(5):
        assert not loop.tick(window_stats(80.0)).changed  # sustain starts over


def test_stats_of_another_variant_are_stale() -> None:
    loop = Loop()
    d = loop.tick(window_stats(80.0, variant="int8"))
    assert d.rule == "stale_variant"
    d = loop.tick(window_stats(80.0, variant=ALL_VARIANTS))
    assert d.rule == "sustain"


def test_policy_changes_under_the_state_are_repaired_at_once() -> None:
    d = evaluate_qos(QosState(model="m", version="v1", active_variant="bf16"), POLICY, None, T0)
    assert (d.kind, d.rule, d.variant) == (QosDecisionKind.SET, "not_in_ladder", "fp32")
    policy = replace(POLICY, quality_floor="fp16")
    d = evaluate_qos(
        QosState(model="m", version="v1", active_variant="int8", last_change_ms=T0),
        policy,
        None,
        T0,
    )
    assert (d.kind, d.rule, d.variant) == (QosDecisionKind.SET, "quality_floor", "fp16")


def test_disabled_policy_holds() -> None:
    loop = Loop(replace(POLICY, enabled=False))
    for _ in range(10):
        d = loop.tick(window_stats(500.0))
    assert (d.kind, d.rule) == (QosDecisionKind.HOLD, "disabled")


def test_mismatched_inputs_are_refused() -> None:
    state = initial_qos_state(POLICY)
    with pytest.raises(InputMismatch):
        evaluate_qos(replace(state, version="v2"), POLICY, None, T0)
    with pytest.raises(InputMismatch):
        evaluate_qos(state, POLICY, replace(window_stats(1.0), version="v2"), T0)


# -- load ceilings: no flapping after a step down ------------------------------------

CAPACITY = {"fp32": 100.0, "fp16": 180.0, "int8": 300.0}
BASE_MS = {"fp32": 20.0, "fp16": 12.0, "int8": 8.0}


def system_p99(variant: str, rps: float) -> float:
    """A queueing-style p99: grows sharply as load nears the variant's capacity."""
    return BASE_MS[variant] / max(0.05, 1.0 - rps / CAPACITY[variant])


def drive(loop: Loop, rps: float, seconds: int) -> None:
    for _ in range(seconds):
        v = loop.state.active_variant
        loop.tick(window_stats(system_p99(v, rps), variant=v, throughput_rps=rps))


def test_load_ceiling_keeps_a_stepped_down_variant_from_flapping() -> None:
    loop = Loop(replace(POLICY, ceiling_ttl_s=3_600.0))
    drive(loop, 90.0, 1_800)  # fp32 breaches at 90 req/s; fp16 is calm at 90
    assert [d.variant for d in loop.changes()] == ["fp16"]
    held = [d for d in loop.decisions if d.rule == "load_ceiling"]
    assert held and "fp32's ceiling 90.0 rps" in held[-1].reason
    drive(loop, 40.0, 600)  # load falls below 0.8 x 90: fp32 is safe again
    assert [d.variant for d in loop.changes()] == ["fp16", "fp32"]


def test_without_load_hysteresis_the_same_signal_flaps() -> None:
    """The bug the ceiling pins down: a calm cheap variant invites a step back up."""
    policy = replace(POLICY, up_load_fraction=1.0, ceiling_ttl_s=0.0)
    loop = Loop(policy)
    drive(loop, 90.0, 1_800)
    assert len(loop.changes()) > 10


def test_ceilings_expire() -> None:
    loop = Loop(replace(POLICY, ceiling_ttl_s=120.0))
    drive(loop, 90.0, 60)
    assert loop.state.active_variant == "fp16"
    drive(loop, 90.0, 200)
    # After the ceiling expired the controller probed fp32 again (and stepped back down).
    assert [d.variant for d in loop.changes()][:3] == ["fp16", "fp32", "fp16"]


# -- like-for-like during a rollout ----------------------------------------------------


def test_candidate_follows_the_baseline_variant() -> None:
    baseline = QosState(model="m", version="v1", active_variant="int8")
    candidate = QosState(model="m", version="v2", active_variant="fp32", breach_since_ms=T0)
    d = qos_during_rollout(candidate, baseline, T0)
    assert (d.kind, d.rule, d.variant) == (QosDecisionKind.SET, "follow_baseline", "int8")
    assert d.after.last_change_ms == T0 and d.after.breach_since_ms is None
    again = qos_during_rollout(d.after, baseline, T0 + 1_000)
    assert (again.kind, again.rule) == (QosDecisionKind.HOLD, "like_for_like")


def test_candidate_cannot_follow_a_variant_it_lacks() -> None:
    baseline = QosState(model="m", version="v1", active_variant="int8")
    candidate = QosState(model="m", version="v2", active_variant="fp32")
    policy = QosPolicy(model="m", version="v2", slo_p99_ms=50.0, ladder=("fp32", "fp16"))
    d = qos_during_rollout(candidate, baseline, T0, policy)
    assert (d.kind, d.rule, d.variant) == (
        QosDecisionKind.HOLD,
        "like_for_like_unavailable",
        "fp32",
    )
    floored = replace(POLICY, version="v2", quality_floor="fp16")
    d = qos_during_rollout(candidate, baseline, T0, floored)
    assert d.rule == "like_for_like_unavailable"
    with pytest.raises(InputMismatch):
        qos_during_rollout(replace(candidate, model="x"), baseline, T0)


def test_regression_a_breach_that_began_at_time_zero_counts_as_begun() -> None:
    """``breach_since_ms == 0`` was read as "no breach" and sustain never elapsed."""
    state = QosState(model="m", version="v1", active_variant="fp32", breach_since_ms=0)
    d = evaluate_qos(state, POLICY, window_stats(80.0), 60_000)
    assert d.kind is QosDecisionKind.STEP_DOWN
