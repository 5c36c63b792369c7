"""Protobuf adapter: round trips and the audit record of a decision."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_from_pb, histogram_to_pb
from graylane.policy_engine import wire
from graylane.policy_engine.logic.gates import StepEvidence, advance_sequential
from graylane.policy_engine.logic.qos import Ceiling, QosState, evaluate_qos
from graylane.policy_engine.logic.rollout import RolloutState, apply_command, evaluate, start
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.pb import (
    manual_command_from_pb,
    qos_policy_from_pb,
    qos_policy_to_pb,
    rollout_spec_from_pb,
    rollout_spec_to_pb,
)
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step, Strategy
from graylane.rollouts.vocabulary import DecisionKind, ManualCommand, Phase
from graylane.v1 import audit_pb2, rollout_pb2, telemetry_pb2

SPEC = RolloutSpec(
    rollout_id="r-1",
    model="gpt",
    baseline="v6",
    candidate="v7",
    strategy=Strategy.SHADOW_THEN_CANARY,
    steps=(Step(2.0, 30, 10.0), Step(20.0, 300, 60.0), Step(100.0, 0, 0.0)),
    gates=Gates(max_p99_ratio=1.3, max_error_rate_delta=0.01, alpha=0.05, min_output_agreement=0.9),
    failures_to_rollback=3,
    shadow_share=0.5,
    shadow_duration_s=120.0,
    ab_weight_percent=40.0,
    ab_duration_s=600.0,
    created_at_ms=1_700_000_000_000,
    created_by="alice",
)

finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
window_stats = st.builds(
    WindowStats,
    model=st.text(max_size=8),
    version=st.text(max_size=8),
    variant=st.text(max_size=8),
    window_start_ms=st.integers(min_value=0, max_value=2**62),
    window_end_ms=st.integers(min_value=0, max_value=2**62),
    requests=st.integers(min_value=0, max_value=2**40),
    errors=st.integers(min_value=0, max_value=2**40),
    p50_ms=finite,
    p95_ms=finite,
    p99_ms=finite,
    mean_ms=finite,
    throughput_rps=finite,
    queue_wait_mean_ms=finite,
    queue_wait_p99_ms=finite,
    batches=st.integers(min_value=0, max_value=2**40),
    device_load=st.floats(min_value=0.0, max_value=1.0),
    shed=st.integers(min_value=0, max_value=2**40),
)


def test_histogram_round_trip() -> None:
    h = LatencyHistogram.of([0.01, 1.0, 2.5, 2.5, 900.0])
    assert histogram_from_pb(histogram_to_pb(h)) == h
    empty = histogram_from_pb(telemetry_pb2.LatencyHistogram())
    assert empty.count == 0 and empty.min_ms == 0.05
    with pytest.raises(ValueError):
        histogram_from_pb(telemetry_pb2.LatencyHistogram(buckets={3: 1}))


def test_telemetry_from_pb() -> None:
    h = LatencyHistogram.of([5.0, 6.0, 7.0])
    pb = telemetry_pb2.BatchTelemetry(
        model="gpt",
        version="v7",
        variant="int8",
        worker_id="w-3",
        batch_size=3,
        request_count=3,
        error_count=1,
        latency=histogram_to_pb(h),
        queue_wait_ms_mean=2.5,
        compute_ms=4.0,
        device_load=0.7,
        started_at_unix_ms=100,
        completed_at_unix_ms=120,
        shadow_count=3,
        lag=42,
    )
    s = wire.telemetry_from_pb(pb)
    assert (s.model, s.version, s.variant, s.worker_id) == ("gpt", "v7", "int8", "w-3")
    assert (s.request_count, s.error_count, s.shadow_count, s.lag) == (3, 1, 3, 42)
    assert s.latency == h and s.queue_wait.count == 0 and s.queue_wait_mean_ms == 2.5
    assert (s.completed_at_ms, s.started_at_ms, s.batch_size) == (120, 100, 3)
    assert s.is_shadow


@given(window_stats)
def test_window_stats_round_trip(w: WindowStats) -> None:
    assert wire.window_stats_from_pb(wire.window_stats_to_pb(w)) == w


def test_window_stats_lag_is_not_carried() -> None:
    w = WindowStats(
        model="m", version="v", variant="a", window_start_ms=0, window_end_ms=1, requests=1,
        errors=0, p50_ms=1, p95_ms=1, p99_ms=1, mean_ms=1, throughput_rps=1, lag=9,
    )  # fmt: skip
    assert wire.window_stats_from_pb(wire.window_stats_to_pb(w)) == replace(w, lag=0)


def test_rollout_spec_round_trip() -> None:
    pb = rollout_spec_to_pb(SPEC)
    assert rollout_spec_from_pb(pb) == SPEC
    assert rollout_spec_to_pb(rollout_spec_from_pb(pb)) == pb


def test_rollout_spec_round_trip_carries_every_gate() -> None:
    gates = Gates(
        max_p99_ratio=1.3,
        mode=GateMode.SEQUENTIAL,
        max_error_ratio=2.0,
        error_budget=0.005,
        max_slow_ratio=1.8,
        unresponsive_s=25.0,
        backlog_queue_ms=0.0,
        p99_floor_ms=0.0,
    )
    spec = replace(SPEC, gates=gates)
    pb = rollout_pb2.RolloutSpec.FromString(rollout_spec_to_pb(spec).SerializeToString())
    assert pb.gates.mode == rollout_pb2.GATE_MODE_SEQUENTIAL
    assert rollout_spec_from_pb(pb).gates == gates
    # Zero where zero is valid survives (optional fields); absent ones take the defaults.
    assert pb.gates.HasField("backlog_queue_ms") and pb.gates.HasField("p99_floor_ms")
    pb.gates.ClearField("backlog_queue_ms")
    pb.gates.ClearField("p99_floor_ms")
    pb.gates.ClearField("error_budget")
    pb.gates.mode = rollout_pb2.GATE_MODE_UNSPECIFIED
    back = rollout_spec_from_pb(pb).gates
    d = Gates()
    assert (back.backlog_queue_ms, back.p99_floor_ms, back.error_budget, back.mode) == (
        d.backlog_queue_ms,
        d.p99_floor_ms,
        d.error_budget,
        GateMode.SEQUENTIAL,
    )


def test_window_stats_round_trip_with_service_times() -> None:
    service = LatencyHistogram()
    for ms in (3.0, 4.0, 5.0, 40.0):
        service.record(ms, 5)
    w = WindowStats(
        model="m", version="v", variant="a", window_start_ms=0, window_end_ms=1, requests=20,
        errors=0, p50_ms=9, p95_ms=50, p99_ms=60, mean_ms=12, throughput_rps=1,
        service_p50_ms=service.quantile(0.5), service_p95_ms=service.quantile(0.95),
        service_p99_ms=service.quantile(0.99), service=service,
    )  # fmt: skip
    back = wire.window_stats_from_pb(wire.window_stats_to_pb(w))
    assert back == w and back.service == service
    assert wire.window_stats_from_pb(wire.window_stats_to_pb(replace(w, service=None))) == (
        replace(w, service=None)
    )


def test_rollout_state_round_trip_carries_the_sequential_evidence() -> None:
    gates = Gates(mode=GateMode.SEQUENTIAL, error_budget=0.01)
    spec = replace(SPEC, gates=gates)
    state = start(spec, 1_000).after
    assert wire.rollout_state_to_pb(state, spec).HasField("sequential") is False
    b, c = _stats("v6", 20.0), _stats("v7", 21.0)
    ev = advance_sequential(state.sequential, gates, replace(b, errors=1), replace(c, errors=3))
    ev = advance_sequential(
        ev,
        gates,
        replace(b, window_start_ms=b.window_end_ms, window_end_ms=b.window_end_ms + 10_000),
        replace(c, window_start_ms=c.window_end_ms, window_end_ms=c.window_end_ms + 10_000),
    )
    assert ev.increments == 2 and ev.errors.log_evidence != 0.0
    state = replace(state, sequential=ev)
    pb = rollout_pb2.RolloutState.FromString(
        wire.rollout_state_to_pb(state, spec).SerializeToString()
    )
    assert wire.rollout_state_from_pb(pb) == (state, spec)


def test_rollout_spec_zeros_mean_defaults() -> None:
    pb = rollout_pb2.RolloutSpec(
        rollout_id="r", model="m", baseline_version="v1", candidate_version="v2"
    )
    spec = rollout_spec_from_pb(pb)
    assert spec == RolloutSpec(rollout_id="r", model="m", baseline="v1", candidate="v2")


def test_rollout_state_round_trip() -> None:
    d = start(SPEC, 1_000)
    paused = apply_command(d.after, SPEC, ManualCommand.PAUSE, 2_000).after
    for state in (d.before, d.after, paused):
        pb = wire.rollout_state_to_pb(state, SPEC)
        back, spec = wire.rollout_state_from_pb(pb, epoch=state.epoch)
        assert spec == SPEC
        assert wire.rollout_state_to_pb(back, spec) == pb
        assert back == state  # the wire carries the whole state
        # A record of an older engine (no resume fields) comes back conservatively.
        old = rollout_pb2.RolloutState()
        old.CopyFrom(pb)
        for name in ("step_started_at_unix_ms", "shadow_share", "epoch", "evidence"):
            old.ClearField(name)
        back_old, _ = wire.rollout_state_from_pb(old, epoch=state.epoch)
        assert back_old == replace(
            state,
            step_started_ms=state.updated_ms,
            shadow_share=SPEC.shadow_share if state.shadow_share else 0.0,
            evidence=StepEvidence(),
        )
    assert (
        wire.rollout_state_from_pb(wire.rollout_state_to_pb(paused, SPEC), epoch=1)[0].shadow_share
        == 0.5
    )


def test_rollout_state_from_pb_needs_a_phase() -> None:
    with pytest.raises(ValueError):
        wire.rollout_state_from_pb(rollout_pb2.RolloutState(spec=rollout_spec_to_pb(SPEC)))


def test_manual_commands_from_pb() -> None:
    def kind(k: int) -> ManualCommand | None:
        return manual_command_from_pb(k)

    assert kind(rollout_pb2.COMMAND_PAUSE) is ManualCommand.PAUSE
    assert kind(rollout_pb2.COMMAND_ABORT) is ManualCommand.ABORT
    assert kind(rollout_pb2.COMMAND_START) is None


POLICY = QosPolicy(
    model="gpt",
    version="v6",
    slo_p99_ms=80.0,
    ladder=("fp32", "fp16", "int8"),
    quality_floor="fp16",
    step_down_margin=0.3,
    step_up_ratio=0.5,
    max_queue_wait_ms=25.0,
    sustain_s=8.0,
    min_dwell_s=45.0,
    enabled=True,
)


def test_qos_policy_and_state_round_trip() -> None:
    pb = qos_policy_to_pb(POLICY)
    assert qos_policy_from_pb(pb) == POLICY
    state = QosState(
        model="gpt", version="v6", active_variant="fp16", last_change_ms=5, breach_since_ms=9
    )
    assert wire.qos_state_from_pb(wire.qos_state_to_pb(state)) == state
    with_ceiling = replace(state, ceilings=(Ceiling("fp32", 90.0, 3),))
    assert wire.qos_state_from_pb(wire.qos_state_to_pb(with_ceiling)) == state


def _stats(version: str, p99: float) -> WindowStats:
    return WindowStats(
        model="gpt", version=version, variant="fp32", window_start_ms=0, window_end_ms=10_000,
        requests=500, errors=0, p50_ms=p99 / 2, p95_ms=p99 * 0.8, p99_ms=p99, mean_ms=p99 / 2,
        throughput_rps=50.0,
    )  # fmt: skip


def test_decision_to_audit() -> None:
    started = start(SPEC, 1_000, epoch=10)
    d = evaluate(started.after, SPEC, _stats("v6", 20.0), _stats("v7", 60.0), None, 12_000)
    assert d.kind is DecisionKind.HOLD  # no shadow pairs yet
    rec = wire.decision_to_audit(d, SPEC, command_id="c-1")
    assert (rec.model, rec.rollout_id, rec.version) == ("gpt", "r-1", "v7")
    assert rec.kind == audit_pb2.DECISION_HOLD and rec.rule == d.rule and rec.reason == d.reason
    assert [wire.window_stats_from_pb(w) for w in rec.inputs] == list(d.inputs)
    assert rec.rollout_before.phase == rollout_pb2.SHADOWING
    assert rec.decided_at_unix_ms == 12_000 and rec.epoch == 11 and rec.command_id == "c-1"
    assert rec.decision_id == wire.decision_id_of(d)
    assert wire.decision_id_of(d) != wire.decision_id_of(started)
    assert wire.decision_to_audit(started, SPEC).kind == audit_pb2.DECISION_ROLLOUT_STARTED
    manual = apply_command(d.after, SPEC, ManualCommand.ROLLBACK, 13_000)
    rec = wire.decision_to_audit(manual, SPEC)
    assert rec.kind == audit_pb2.DECISION_MANUAL_COMMAND
    assert rec.rollout_after.phase == rollout_pb2.ROLLED_BACK


def test_qos_decision_to_audit_and_precision_command() -> None:
    state = QosState(model="gpt", version="v6", active_variant="fp32", breach_since_ms=1)
    d = evaluate_qos(state, POLICY, _stats("v6", 500.0), 100_000)
    assert d.changed and d.variant == "fp16"
    rec = wire.qos_decision_to_audit(d, epoch=4)
    assert rec.kind == audit_pb2.DECISION_PRECISION_CHANGE
    assert rec.qos_after.active_variant == "fp16" and rec.epoch == 4
    cmd = wire.precision_command_of(d, epoch=4)
    assert (cmd.model, cmd.version, cmd.variant, cmd.epoch) == ("gpt", "v6", "fp16", 4)
    assert cmd.decision_id == rec.decision_id
    hold = evaluate_qos(d.after, POLICY, _stats("v6", 100.0), 101_000)
    assert wire.qos_decision_to_audit(hold).kind == audit_pb2.DECISION_HOLD


def test_routing_table_of_a_plan() -> None:
    canary = replace(SPEC, strategy=Strategy.CANARY)
    d = start(canary, 0, epoch=2)
    assert d.routing is not None
    pb = wire.routing_table_of(d.routing, now_ms=99, reason=d.reason)
    assert (pb.model, pb.stable_version, pb.epoch, pb.updated_at_unix_ms) == ("gpt", "v6", 3, 99)
    weights = {r.version: r.weight_percent for r in pb.routes}
    assert weights == {"v7": 2.0, "v6": 98.0}


def test_the_state_carries_its_phase() -> None:
    state = RolloutState(rollout_id="r-1", model="gpt", phase=Phase.ABORTED)
    assert wire.rollout_state_to_pb(state, SPEC).phase == rollout_pb2.ABORTED
