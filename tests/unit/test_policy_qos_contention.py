"""The contention factor: rung capacities as they hold in the running stack."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.histogram import LatencyHistogram
from graylane.policy_engine import audit_replay, wire
from graylane.policy_engine.logic import qos
from graylane.policy_engine.logic.qos import QosState, evaluate_qos, initial_qos_state
from graylane.policy_engine.logic.window import SlidingWindow, WindowStats
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule
from tests.support.window_stats import served_window, telemetry

T0 = 1_700_000_000_000
FP32_RPS, INT8_RPS = 20.0, 36.0
"""Calibrated capacity of one worker alone: fp32 50 ms a request, int8 ~27.8 ms."""

POLICY = QosPolicy(
    model="m",
    version="v1",
    slo_p99_ms=250.0,
    ladder=("fp32", "int8"),
    sustain_s=2.0,
    min_dwell_s=0.0,
    rung_capacity_rps=(("fp32", FP32_RPS), ("int8", INT8_RPS)),
)


def test_observed_factor_is_calibrated_over_observed_service_time() -> None:
    # int8 calibrated at 36 rps = 27.8 ms a request; observed 4x slower in the stack
    stats = served_window(variant="int8", served_rps=5.0, per_request_ms=1000.0 / 36.0 * 4)
    assert qos.observed_factor(stats, INT8_RPS) == pytest.approx(0.25)


def test_observed_factor_is_bounded_and_needs_evidence() -> None:
    fast = served_window(variant="int8", served_rps=5.0, per_request_ms=1.0)  # faster than alone
    assert qos.observed_factor(fast, INT8_RPS) == qos.MAX_FACTOR
    crawl = served_window(variant="int8", served_rps=5.0, per_request_ms=100_000.0)
    assert qos.observed_factor(crawl, INT8_RPS) == qos.MIN_FACTOR
    assert qos.observed_factor(fast, None) is None  # not calibrated
    few = served_window(variant="int8", served_rps=1.0, per_request_ms=100.0)  # 4 requests
    assert few.requests < qos.MIN_REQUESTS
    assert qos.observed_factor(few, INT8_RPS) is None
    unknown = replace(fast, service_busy_ms=0.0, service_requests=0)
    assert qos.observed_factor(unknown, INT8_RPS) is None


def test_smoothed_factor_moves_toward_the_observation_within_bounds() -> None:
    assert qos.smoothed_factor(1.0, None) == 1.0
    once = qos.smoothed_factor(1.0, 0.2)
    assert 0.2 < once < 1.0
    assert once == pytest.approx(qos.SMOOTHING * 0.2 + (1 - qos.SMOOTHING))
    factor = 1.0
    for _ in range(30):
        factor = qos.smoothed_factor(factor, 0.2)
    assert factor == pytest.approx(0.2, abs=1e-3)
    assert qos.effective_capacity(20.0, 0.25) == pytest.approx(5.0)
    assert qos.effective_capacity(None, 0.25) is None


def test_window_reports_busy_time_per_request_once_per_batch() -> None:
    w = SlidingWindow(window_ms=10_000, step_ms=1_000)
    for i in range(4):  # batches of 5 requests, 100 ms each: 20 ms a request
        w.add(
            telemetry(
                completed_at_ms=T0 + 100 * (i + 1),
                started_at_ms=T0 + 100 * i,
                request_count=5,
                latency=LatencyHistogram.of([150.0] * 5),
                batch_size=5,
            )
        )
    s = w.stats(w.keys().__iter__().__next__(), T0 + 2_000)
    assert s is not None
    assert (s.service_busy_ms, s.service_requests) == (400.0, 20)
    assert s.service_per_request_ms == pytest.approx(20.0)
    back = wire.window_stats_from_pb(wire.window_stats_to_pb(s))
    assert back.service_per_request_ms == pytest.approx(20.0)


def _drive(state: QosState, stats: WindowStats, seconds: int, t: int) -> tuple[QosState, int]:
    decision = None
    for _ in range(seconds):
        t += 1000
        decision = evaluate_qos(state, POLICY, stats, t)
        state = decision.after
    assert decision is not None
    return state, t


def test_step_up_threshold_follows_the_contended_capacity() -> None:
    """On int8 a request takes 4 x its calibrated 27.8 ms in the stack: the stack adds
    83 ms a request, so fp32 (50 ms calibrated) really serves 1000 / 133 = 7.5 rps:
    8 rps offered (< 0.7 x 20 calibrated, but > 0.7 x 7.5) must not step up; 3 rps
    must. (The factor was measured on int8 before: a fresh state starts at 1.0.)"""
    slow = 4.0
    start = replace(initial_qos_state(POLICY), active_variant="int8", contention=1 / slow)
    busy = served_window(variant="int8", served_rps=8.0, per_request_ms=1000.0 / INT8_RPS * slow)
    state, t = _drive(start, busy, 30, T0)
    assert state.active_variant == "int8"
    assert state.contention == pytest.approx(1 / slow, rel=0.02)
    last = evaluate_qos(state, POLICY, busy, t + 1000)
    assert last.rule == DecisionRule.WITHIN_BAND
    quiet = served_window(variant="int8", served_rps=3.0, per_request_ms=1000.0 / INT8_RPS * slow)
    up = None
    for _ in range(10):
        t += 1000
        d = evaluate_qos(state, POLICY, quiet, t)
        state = d.after
        if d.changed:
            up = d
            break
    assert up is not None and up.rule == DecisionRule.LOAD_CALM
    assert up.variant == "fp32"
    assert "contention 0.2" in up.reason and "7.5 rps here" in up.reason


def test_the_time_the_stack_adds_is_what_every_rung_pays_not_the_same_share() -> None:
    """At half its calibrated speed on int8 (27.8 -> 55.6 ms), fp32 pays the same
    27.8 ms more: 1000 / 77.8 = 12.9 rps, not 0.5 x 20 = 10."""
    assert qos.effective_capacity(FP32_RPS, 0.5, INT8_RPS) == pytest.approx(12.86, 0.01)
    assert qos.effective_capacity(INT8_RPS, 0.5) == pytest.approx(18.0)
    assert qos.effective_capacity(INT8_RPS, 0.5, INT8_RPS) == pytest.approx(18.0)
    # measured on fp32 (50 -> 100 ms), int8 pays 50 ms more: it keeps only 36 %
    assert qos.effective_capacity(INT8_RPS, 0.5, FP32_RPS) == pytest.approx(12.86, 0.01)
    assert qos.effective_capacity(None, 0.5, FP32_RPS) is None


def test_uncontended_stack_keeps_the_calibrated_threshold() -> None:
    start = replace(initial_qos_state(POLICY), active_variant="int8")
    alone = served_window(variant="int8", served_rps=8.0, per_request_ms=1000.0 / INT8_RPS)
    state, _ = _drive(start, alone, 5, T0)
    assert state.active_variant == "fp32"  # 8 < 0.7 x 20
    assert state.contention == pytest.approx(1.0)


def test_contention_travels_in_the_audit_record_and_replays() -> None:
    start = replace(initial_qos_state(POLICY), active_variant="int8", contention=0.3)
    stats = served_window(variant="int8", served_rps=8.0, per_request_ms=1000.0 / INT8_RPS * 4)
    decision = evaluate_qos(start, POLICY, stats, T0)
    rec = wire.qos_decision_to_audit(decision, policy=POLICY)
    assert rec.qos_before.contention == pytest.approx(0.3)
    assert rec.qos_after.contention == pytest.approx(decision.after.contention)
    assert wire.qos_state_from_pb(rec.qos_after).contention == decision.after.contention
    assert audit_replay.verify([rec]) == []
    tampered = type(rec)()
    tampered.CopyFrom(rec)
    tampered.qos_before.contention = 1.0
    # the replayed state differs: a replay that ignored the factor could not see it
    assert audit_replay.replay_qos_record(tampered).qos_after != rec.qos_after


def test_a_breach_below_the_rungs_capacity_records_no_ceiling() -> None:
    """fp32 (20 rps calibrated, contention 0.99) breaches at 3.5 rps: a start-up or a
    neighbour, not load; no ceiling pins it down, the capacity check gates the way up."""
    start = replace(initial_qos_state(POLICY), breach_since_ms=T0 - 5_000)
    stats = served_window(variant="fp32", served_rps=3.5, per_request_ms=50.0, p99_ms=2_000.0)
    d = evaluate_qos(start, POLICY, stats, T0)
    assert d.variant == "int8"
    assert d.after.ceiling_of("fp32") is None
    assert "no ceiling" in d.reason


def test_a_breach_at_the_rungs_capacity_records_its_ceiling() -> None:
    """In a stack at 1/4 speed fp32 copes with 5 rps: a breach at 4 rps (> 0.7 x 5) is load."""
    start = replace(initial_qos_state(POLICY), breach_since_ms=T0 - 5_000, contention=0.25)
    stats = served_window(variant="fp32", served_rps=4.0, per_request_ms=200.0, p99_ms=2_000.0)
    d = evaluate_qos(start, POLICY, stats, T0)
    assert d.variant == "int8"
    ceiling = d.after.ceiling_of("fp32")
    assert ceiling is not None and ceiling.throughput_rps == pytest.approx(4.0)
