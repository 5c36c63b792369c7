"""The demo's QoS act: its load, spike, objective and policy come from measured capacity,
and the steps it reports are the audit's precision changes."""

from __future__ import annotations

import pytest

from graylane.app.demo.qos_act import (
    LADDER,
    MAX_RAISE,
    MIN_TTFT_OBJECTIVE_MS,
    QOS_MODEL,
    QOS_VERSION,
    RAISE_FACTOR,
    SPIKE_FACTOR,
    STEADY_FRACTION,
    act_rates,
    precision_steps,
    qos_act_policy,
    raised_spike_rate,
    ttft_objective_ms,
)
from graylane.policy_engine.logic.qos import QosPolicy
from graylane.rollouts.pb import qos_policy_from_pb
from graylane.v1 import audit_pb2


def test_the_steady_load_is_under_the_step_up_band_and_the_spike_beyond_the_capacity() -> None:
    rates = act_rates(3.0)
    assert rates.steady_gps == pytest.approx(STEADY_FRACTION * 3.0)
    assert rates.spike_gps == pytest.approx(SPIKE_FACTOR * 3.0)
    policy = qos_act_policy(3.0, 1500.0)
    assert rates.steady_gps < policy.up_capacity_fraction * 3.0 < 3.0 < rates.spike_gps


def test_the_ttft_objective_is_twice_the_probes_p99_with_a_floor() -> None:
    assert ttft_objective_ms([800.0, 1000.0]) == pytest.approx(2 * 998.0)
    assert ttft_objective_ms([50.0, 60.0]) == MIN_TTFT_OBJECTIVE_MS
    assert ttft_objective_ms([]) == MIN_TTFT_OBJECTIVE_MS


def test_the_policy_is_a_generative_one_on_the_weight_only_ladder() -> None:
    pb = qos_act_policy(2.5, 1800.0)
    policy: QosPolicy = qos_policy_from_pb(pb)
    assert (pb.model, pb.version) == (QOS_MODEL, QOS_VERSION)
    assert tuple(policy.ladder) == LADDER == ("fp32", "int8-weight-only")
    assert policy.generative and policy.slo_ttft_p99_ms == 1800.0
    assert policy.capacity_of("fp32") == 2.5


def test_the_steps_are_the_audits_precision_changes_of_the_acts_version() -> None:
    def record(at: int, kind: int, before: str, after: str, **kw: str) -> audit_pb2.AuditRecord:
        return audit_pb2.AuditRecord(
            decided_at_unix_ms=at,
            model=kw.get("model", QOS_MODEL),
            version=kw.get("version", QOS_VERSION),
            kind=kind,  # type: ignore[arg-type]
            rule="ttft_breach" if after == "int8-weight-only" else "load_calm",
            reason="r",
            qos_before=audit_pb2.QosState(active_variant=before),
            qos_after=audit_pb2.QosState(active_variant=after),
        )

    change = audit_pb2.DECISION_PRECISION_CHANGE
    records = [
        record(30, change, "int8-weight-only", "fp32"),
        record(10, change, "fp32", "int8-weight-only"),
        record(20, audit_pb2.DECISION_HOLD, "int8-weight-only", "int8-weight-only"),
        record(15, change, "fp32", "int8-weight-only", model="smollm2"),
        record(16, change, "fp32", "int8-weight-only", version="2.0.0"),
    ]
    steps = precision_steps(records)
    assert [(s.before, s.after) for s in steps] == [
        ("fp32", "int8-weight-only"),
        ("int8-weight-only", "fp32"),
    ]
    assert [s.rule for s in steps] == ["ttft_breach", "load_calm"]


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
    assert raised_spike_rate(30.0, 30.0, 60.0, 0.05, slo) is None  # answers fall behind
    assert raised_spike_rate(30.0, 30.0, None, 0.0, slo) is None  # nothing answered


def test_a_policy_with_the_floor_fp32_sets_the_top_rung_at_once_without_data() -> None:
    """The act's start: a version an earlier run left on the lower rung goes back to fp32
    before anything is measured."""
    from graylane.policy_engine.logic.qos import QosDecisionKind, QosState, evaluate_qos

    policy = qos_policy_from_pb(qos_act_policy(0.0, MIN_TTFT_OBJECTIVE_MS, LADDER[0]))
    assert policy.rung_capacity_rps == ()
    state = QosState(
        model=QOS_MODEL, version=QOS_VERSION, active_variant=LADDER[1], last_change_ms=1_000
    )
    decision = evaluate_qos(state, policy, None, 2_000)
    assert decision.kind is QosDecisionKind.SET
    assert decision.after.active_variant == LADDER[0]
