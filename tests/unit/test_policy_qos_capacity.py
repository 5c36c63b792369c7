"""QoS step-up from calibrated capacity, shed breaches, and the shed figures of a window."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.histogram import LatencyHistogram
from graylane.policy_engine import wire
from graylane.policy_engine.logic.qos import QosDecision, evaluate_qos, initial_qos_state
from graylane.policy_engine.logic.window import SlidingWindow, WindowStats
from graylane.rollouts.errors import InvalidPolicy
from graylane.rollouts.pb import qos_policy_from_pb, qos_policy_to_pb
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule
from tests.support.window_stats import served_window, telemetry

T0 = 1_700_000_000_000
FP32_RPS, INT8_RPS = 20.0, 36.0
"""One worker's calibrated capacity per rung (the issue's slow machine: int8 ~1.8x)."""

LATENCY_ONLY = QosPolicy(
    model="m",
    version="v1",
    slo_p99_ms=250.0,
    ladder=("fp32", "int8"),
    sustain_s=2.0,
    min_dwell_s=10.0,
)
CALIBRATED = replace(LATENCY_ONLY, rung_capacity_rps=(("fp32", FP32_RPS), ("int8", INT8_RPS)))
CAPACITY = {"fp32": FP32_RPS, "int8": INT8_RPS}
BASE_MS = {"fp32": 150.0, "int8": 180.0}
"""p99 at no load (int8 at 0.5 x fp32's capacity: ~210 ms, as in the issue)."""


def system(variant: str, offered: float, *, admission: bool) -> WindowStats:
    """A queueing-style rung: p99 grows as load nears capacity; past it, either the
    queue explodes or admission control sheds the excess at the SLO."""
    cap = CAPACITY[variant]
    if offered < cap:
        p99 = BASE_MS[variant] / max(0.05, 1.0 - offered / cap) ** 0.5
        return served_window(min(p99, 5_000.0), variant=variant, served_rps=offered)
    if admission:
        return served_window(240.0, variant=variant, served_rps=cap, shed_rps=offered - cap)
    return served_window(5_000.0, variant=variant, served_rps=cap)


class Loop:
    def __init__(self, policy: QosPolicy, *, admission: bool = False) -> None:
        self.policy, self.admission = policy, admission
        self.state = initial_qos_state(policy)
        self.t = T0
        self.decisions: list[QosDecision] = []

    def drive(self, offered: float, seconds: int) -> None:
        for _ in range(seconds):
            self.t += 1000
            window = system(self.state.active_variant, offered, admission=self.admission)
            d = evaluate_qos(self.state, self.policy, window, self.t)
            self.decisions.append(d)
            self.state = d.after

    def changes(self) -> list[tuple[float, str, DecisionRule]]:
        return [((d.at_ms - T0) / 1000, d.variant, d.rule) for d in self.decisions if d.changed]


def spike(loop: Loop) -> None:
    base = 0.5 * FP32_RPS
    loop.drive(base, 30)
    loop.drive(3 * base, 40)
    loop.drive(base, 90)


def test_the_issue_latency_only_never_steps_back_up() -> None:
    """int8's p99 at normal load (~200 ms) never falls under 0.6 x 250 ms."""
    loop = Loop(LATENCY_ONLY)
    spike(loop)
    assert [v for _, v, _ in loop.changes()] == ["int8"]


def test_capacity_steps_back_up_soon_after_the_spike() -> None:
    loop = Loop(CALIBRATED)
    spike(loop)
    changes = loop.changes()
    assert [(v, r) for _, v, r in changes] == [
        ("int8", DecisionRule.P99_BREACH),
        ("fp32", DecisionRule.LOAD_CALM),
    ]
    back_at = changes[-1][0]
    assert 70 < back_at <= 70 + 15  # spike ends at 70 s: sustain 2 s, dwell 10 s
    assert "0.7 x fp32's capacity 20.0 rps" in loop.decisions[int(back_at) - 1].reason


@pytest.mark.parametrize("fraction_of_capacity", [0.75, 0.9, 0.99])
def test_hysteresis_no_step_up_above_the_fraction(fraction_of_capacity: float) -> None:
    """Above 0.7 x fp32's capacity int8 looks calm, yet fp32 would queue: stay."""
    loop = Loop(CALIBRATED)
    loop.drive(1.5 * FP32_RPS, 30)
    loop.drive(fraction_of_capacity * FP32_RPS, 600)
    assert [v for _, v, _ in loop.changes()] == ["int8"]
    assert loop.decisions[-1].rule is DecisionRule.WITHIN_BAND


def test_offered_load_counts_the_shed_requests() -> None:
    """Served 10 rps looks calm, but 30 arrive: the shed part is load too."""
    loop = Loop(replace(CALIBRATED, max_shed_fraction=1.0))
    loop.state = replace(loop.state, active_variant="int8")
    window = served_window(150.0, variant="int8", served_rps=10.0, shed_rps=20.0)
    assert window.offered_rps == pytest.approx(30.0)
    for _ in range(40):
        loop.t += 1000
        d = evaluate_qos(loop.state, loop.policy, window, loop.t)
        loop.state = d.after
        assert not d.changed


def test_admission_keeps_p99_low_so_shedding_is_the_breach() -> None:
    """With admission control the admitted p99 stays under the SLO; the shed share
    steps down instead, and the capacity steps back up after the spike."""
    loop = Loop(CALIBRATED, admission=True)
    spike(loop)
    assert [(v, r) for _, v, r in loop.changes()] == [
        ("int8", DecisionRule.SHED_BREACH),
        ("fp32", DecisionRule.LOAD_CALM),
    ]
    without_shed_rule = Loop(replace(CALIBRATED, max_shed_fraction=1.0), admission=True)
    spike(without_shed_rule)
    assert without_shed_rule.changes() == []


def test_latency_step_up_remains_without_calibration_of_the_rung_above() -> None:
    policy = replace(CALIBRATED, rung_capacity_rps=(("int8", INT8_RPS),))
    assert policy.capacity_of("fp32") is None and policy.capacity_of("int8") == INT8_RPS
    state = replace(initial_qos_state(policy), active_variant="int8")
    calm = served_window(100.0, variant="int8", served_rps=30.0)  # p99 < 150: calm by latency
    decisions = []
    for i in range(1, 5):
        decisions.append(evaluate_qos(state, policy, calm, T0 + 1000 * i))
        state = decisions[-1].after
    assert [(d.variant, d.rule) for d in decisions if d.changed] == [
        ("fp32", DecisionRule.P99_CALM)
    ]


@pytest.mark.parametrize(
    "capacities",
    [
        (("fp16", 10.0),),
        (("fp32", 0.0),),
        (("fp32", float("nan")),),
        (("fp32", 10.0), ("fp32", 12.0)),
    ],
)
def test_invalid_capacities_are_refused(capacities: tuple[tuple[str, float], ...]) -> None:
    with pytest.raises(InvalidPolicy):
        replace(CALIBRATED, rung_capacity_rps=capacities)


@pytest.mark.parametrize("changes", [{"up_capacity_fraction": 0.0}, {"max_shed_fraction": 1.5}])
def test_invalid_fractions_are_refused(changes: dict[str, float]) -> None:
    with pytest.raises(InvalidPolicy):
        replace(CALIBRATED, **changes)  # type: ignore[arg-type]


def test_policy_round_trip_carries_capacities() -> None:
    policy = replace(CALIBRATED, up_capacity_fraction=0.6, max_shed_fraction=0.05)
    assert qos_policy_from_pb(qos_policy_to_pb(policy)) == policy
    # zeros on the wire mean the defaults
    bare = qos_policy_to_pb(LATENCY_ONLY)
    bare.ClearField("up_capacity_fraction")
    bare.ClearField("max_shed_fraction")
    assert qos_policy_from_pb(bare) == LATENCY_ONLY


def test_window_counts_shed_requests_apart_from_served() -> None:
    window = SlidingWindow(window_ms=4_000, step_ms=1_000)
    for i in range(4):
        window.add(
            telemetry(
                completed_at_ms=1_000 * i + 10,
                request_count=5,
                latency=LatencyHistogram.of([10.0] * 5),
                shed_count=15,
            )
        )
    s = window.stats_by_version("m", "v1", 4_000)
    assert s is not None
    assert (s.requests, s.shed, s.batches) == (20, 60, 4)
    assert s.throughput_rps == pytest.approx(5.0)
    assert s.offered_rps == pytest.approx(20.0)
    assert s.shed_fraction == pytest.approx(0.75)
    assert wire.window_stats_from_pb(wire.window_stats_to_pb(s)).shed == 60


def test_negative_shed_counts_are_refused() -> None:
    with pytest.raises(ValueError):
        telemetry(
            worker_id="w",
            completed_at_ms=1,
            request_count=1,
            latency=LatencyHistogram.of([1.0]),
            shed_count=-1,
        )


def test_a_window_of_sheds_alone_is_data_and_a_breach() -> None:
    """Admission may shed every request (nothing runs): the worker reports the sheds
    alone, the window counts them, and QoS steps down on them."""
    window = SlidingWindow(window_ms=4_000, step_ms=1_000)
    for i in range(4):
        window.add(telemetry(completed_at_ms=1_000 * i + 10, request_count=0, shed_count=30))
    s = window.stats_by_version("m", "v1", 4_000)
    assert s is not None
    assert (s.requests, s.shed, s.batches, s.p99_ms) == (0, 120, 0, 0.0)
    assert s.offered_rps == pytest.approx(30.0) and s.shed_fraction == 1.0
    state, decisions = initial_qos_state(CALIBRATED), []
    for i in range(1, 5):
        decisions.append(evaluate_qos(state, CALIBRATED, s, T0 + 1000 * i))
        state = decisions[-1].after
    # 30 rps offered is past fp32's capacity (20): an overload steps down at once.
    assert decisions[0].changed
    assert [(d.variant, d.rule) for d in decisions if d.changed] == [
        ("int8", DecisionRule.SHED_BREACH)
    ]


def _first_change_s(policy: QosPolicy, window: WindowStats, scale_hold: str = "") -> float | None:
    state = initial_qos_state(policy)
    for i in range(0, 10):
        decision = evaluate_qos(state, policy, window, T0 + 1000 * i, scale_hold=scale_hold)
        if decision.changed:
            return float(i)
        state = decision.after
    return None


def test_an_overload_by_measured_capacity_steps_down_without_waiting() -> None:
    over = served_window(
        240.0, variant="fp32", served_rps=FP32_RPS, shed_rps=5.0
    )  # offered 25 > 20
    under = served_window(400.0, variant="fp32", served_rps=0.5 * FP32_RPS)  # slow, not loaded
    assert _first_change_s(CALIBRATED, over) == 0.0
    assert _first_change_s(CALIBRATED, under) == CALIBRATED.sustain_s
    # without a calibrated capacity the load cannot be judged: sustain_s as before
    assert _first_change_s(LATENCY_ONLY, over) == LATENCY_ONLY.sustain_s


def test_a_hand_over_while_replicas_settle_is_not_a_breach_to_step_down_on() -> None:
    """A replica change pauses consumption for a moment: what waited is shed. At a
    load the rung copes with, no precision change helps; at an overload it does."""
    hand_over = served_window(100.0, variant="fp32", served_rps=0.4 * FP32_RPS, shed_rps=1.0)
    settling = "replicas changed 2 s ago (settle 5 s)"
    assert _first_change_s(CALIBRATED, hand_over, settling) is None
    held = evaluate_qos(
        initial_qos_state(CALIBRATED), CALIBRATED, hand_over, T0, scale_hold=settling
    )
    assert held.rule is DecisionRule.SCALE_UNSETTLED and "hand-over" in held.reason
    assert _first_change_s(CALIBRATED, hand_over) == CALIBRATED.sustain_s
    overload = served_window(240.0, variant="fp32", served_rps=FP32_RPS, shed_rps=5.0)
    assert _first_change_s(CALIBRATED, overload, settling) == 0.0


def test_the_ceiling_is_the_offered_load_not_what_was_served() -> None:
    """Shedding most of a spike, fp32 served little: its ceiling is the load that
    arrived, or the step back up would wait for a load far below normal."""
    loop = Loop(CALIBRATED, admission=True)
    spike(loop)
    (ceiling,) = loop.state.ceilings
    assert (ceiling.variant, ceiling.throughput_rps) == ("fp32", pytest.approx(30.0))


def test_the_newest_step_shows_a_jump_in_load_the_window_average_hides() -> None:
    window = SlidingWindow(window_ms=4_000, step_ms=1_000)
    for i, (served, shed) in enumerate([(10, 0), (10, 0), (10, 0), (30, 15)]):
        window.add(telemetry(completed_at_ms=1_000 * i + 10, request_count=served, shed_count=shed))
    s = window.stats_by_version("m", "v1", 4_000)
    assert s is not None
    assert s.offered_rps == pytest.approx(75 / 4) and s.step_offered_rps == pytest.approx(45.0)
    back = wire.window_stats_from_pb(wire.window_stats_to_pb(s))  # audit replay sees it
    assert back.step_offered_rps == s.step_offered_rps
    # 45 rps in the newest step is past fp32's 20: at once, though the window says 18.75
    breach = replace(s, p99_ms=400.0)
    assert _first_change_s(CALIBRATED, breach) == 0.0
    assert _first_change_s(CALIBRATED, replace(breach, step_offered_rps=0.0)) == 2.0
