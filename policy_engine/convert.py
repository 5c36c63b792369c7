"""Protobuf (``graylane.v1``) <-> the policy logic's dataclasses: the adapter edge.

The vocabulary, specs and QoS policies map in :mod:`graylane.rollouts.pb`
(re-exported here for the engine's adapters). Conventions:

- Timestamps of "not since" (``breach_since``, ``calm_since``) travel as 0.
- Fields the wire contract has no room for are lost on the way out and come
  back at a conservative value: see :func:`rollout_state_from_pb`,
  :func:`qos_state_from_pb` (load ceilings), :func:`window_stats_to_pb`
  (``lag``); for specs and policies see :mod:`graylane.rollouts.pb`.
"""

from __future__ import annotations

import hashlib

from graylane.histogram_pb import histogram_from_pb, histogram_to_pb
from graylane.policy_engine.convert_facts import liveness_from_pb, liveness_to_pb
from graylane.policy_engine.convert_sequential import sequential_from_pb, sequential_to_pb
from graylane.policy_engine.logic.agreement import AgreementStats, SchemaMismatch
from graylane.policy_engine.logic.facts import RolloutFacts, VersionLiveness
from graylane.policy_engine.logic.qos import QosDecision, QosState
from graylane.policy_engine.logic.rollout_state import Decision, RolloutState, StepEvidence
from graylane.policy_engine.logic.routing_plan import RoutingPlan, route_table_for
from graylane.policy_engine.logic.window import TelemetrySample, WindowStats
from graylane.rollouts.pb import (
    decision_kind_to_pb,
    phase_from_pb,
    phase_to_pb,
    qos_policy_from_pb,
    qos_policy_to_pb,
    rollout_spec_from_pb,
    rollout_spec_to_pb,
)
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import Phase
from graylane.routing.cohorts import RouteConfig
from graylane.routing.convert import table_to_pb
from graylane.v1 import audit_pb2, control_pb2, rollout_pb2, telemetry_pb2

__all__ = [
    "decision_id_of",
    "decision_to_audit",
    "facts_from_audit",
    "histogram_from_pb",
    "histogram_to_pb",
    "precision_command_of",
    "qos_decision_to_audit",
    "qos_policy_from_pb",
    "qos_policy_to_pb",
    "qos_state_from_pb",
    "qos_state_to_pb",
    "rollout_spec_from_pb",
    "rollout_spec_to_pb",
    "rollout_state_from_pb",
    "rollout_state_to_pb",
    "routing_table_of",
    "telemetry_from_pb",
    "window_stats_from_pb",
    "window_stats_to_pb",
]


# -- histograms and telemetry ---------------------------------------------------


def telemetry_from_pb(pb: telemetry_pb2.BatchTelemetry) -> TelemetrySample:
    return TelemetrySample(
        model=pb.model,
        version=pb.version,
        variant=pb.variant,
        worker_id=pb.worker_id,
        completed_at_ms=pb.completed_at_unix_ms,
        request_count=pb.request_count,
        error_count=pb.error_count,
        latency=histogram_from_pb(pb.latency),
        queue_wait=histogram_from_pb(pb.queue_wait),
        queue_wait_mean_ms=pb.queue_wait_ms_mean,
        compute_ms=pb.compute_ms,
        device_load=pb.device_load,
        shadow_count=pb.shadow_count,
        lag=pb.lag,
        started_at_ms=pb.started_at_unix_ms,
        batch_size=pb.batch_size,
        batch_id=(
            (pb.batch_id.worker_id, pb.batch_id.partition, pb.batch_id.first_offset)
            if pb.HasField("batch_id")
            else None
        ),
        shed_count=pb.shed_count,
    )


# -- window stats -----------------------------------------------------------------


def window_stats_to_pb(s: WindowStats) -> audit_pb2.WindowStats:
    """``lag`` has no field on the wire and is dropped."""
    return audit_pb2.WindowStats(
        model=s.model,
        version=s.version,
        variant=s.variant,
        window_start_unix_ms=s.window_start_ms,
        window_end_unix_ms=s.window_end_ms,
        requests=s.requests,
        errors=s.errors,
        p50_ms=s.p50_ms,
        p95_ms=s.p95_ms,
        p99_ms=s.p99_ms,
        mean_ms=s.mean_ms,
        throughput_rps=s.throughput_rps,
        queue_wait_mean_ms=s.queue_wait_mean_ms,
        queue_wait_p99_ms=s.queue_wait_p99_ms,
        batches=s.batches,
        device_load=s.device_load,
        service=histogram_to_pb(s.service) if s.service is not None else None,
        service_p50_ms=s.service_p50_ms,
        service_p95_ms=s.service_p95_ms,
        service_p99_ms=s.service_p99_ms,
        shed=s.shed,
        shed_rps=s.shed_rps,
        service_busy_ms=s.service_busy_ms,
        service_requests=s.service_requests,
        step_offered_rps=s.step_offered_rps,
    )


def window_stats_from_pb(pb: audit_pb2.WindowStats) -> WindowStats:
    """Service times come back as recorded (histogram and quantiles): the gates
    judge latency on them, so a replay decides as the engine did."""
    return WindowStats(
        model=pb.model,
        version=pb.version,
        variant=pb.variant,
        window_start_ms=pb.window_start_unix_ms,
        window_end_ms=pb.window_end_unix_ms,
        requests=pb.requests,
        errors=pb.errors,
        p50_ms=pb.p50_ms,
        p95_ms=pb.p95_ms,
        p99_ms=pb.p99_ms,
        mean_ms=pb.mean_ms,
        throughput_rps=pb.throughput_rps,
        queue_wait_mean_ms=pb.queue_wait_mean_ms,
        queue_wait_p99_ms=pb.queue_wait_p99_ms,
        batches=pb.batches,
        device_load=pb.device_load,
        service_p50_ms=pb.service_p50_ms,
        service_p95_ms=pb.service_p95_ms,
        service_p99_ms=pb.service_p99_ms,
        service=histogram_from_pb(pb.service) if pb.HasField("service") else None,
        shed=pb.shed,
        shed_rps=pb.shed_rps,
        service_busy_ms=pb.service_busy_ms,
        service_requests=pb.service_requests,
        step_offered_rps=pb.step_offered_rps,
    )


# -- rollout state -----------------------------------------------------


def rollout_state_to_pb(state: RolloutState, spec: RolloutSpec) -> rollout_pb2.RolloutState:
    """The wire form, complete: a restarted engine resumes exactly from it."""
    ev = state.evidence
    return rollout_pb2.RolloutState(
        step_started_at_unix_ms=state.step_started_ms,
        shadow_share=state.shadow_share,
        failure_window_end_unix_ms=state.failure_window_end_ms,
        epoch=state.epoch,
        evidence=rollout_pb2.StepEvidence(
            candidate_requests=ev.candidate_requests,
            candidate_errors=ev.candidate_errors,
            baseline_requests=ev.baseline_requests,
            baseline_errors=ev.baseline_errors,
            windows=ev.windows,
            through_unix_ms=ev.through_ms,
        ),
        rollout_id=state.rollout_id,
        model=state.model,
        phase=phase_to_pb(state.phase),
        step_index=state.step_index,
        candidate_weight_percent=state.candidate_weight_percent,
        phase_started_at_unix_ms=state.phase_started_ms,
        consecutive_failures=state.consecutive_failures,
        updated_at_unix_ms=state.updated_ms,
        last_reason=state.last_reason,
        paused_from=phase_to_pb(state.paused_from),
        spec=rollout_spec_to_pb(spec),
        sequential=sequential_to_pb(state.sequential),
    )


def rollout_state_from_pb(
    pb: rollout_pb2.RolloutState, *, epoch: int = 0
) -> tuple[RolloutState, RolloutSpec]:
    """State and spec from the wire, after a restart.

    Records of current engines carry the whole state. In older records (no
    ``step_started_at`` / ``epoch`` / ... fields) what is missing comes back
    conservatively: the step's dwell restarts at the last update
    (``step_started_ms = updated_at``), the step's evidence is empty (its
    sample minimum starts over), the next gate failure counts, and ``epoch``
    is the caller's (the model's routing table holds it). The shadow share is
    then the spec's while shadowing (also when paused from it).
    """
    phase = phase_from_pb(pb.phase)
    if phase is None:
        raise ValueError(f"rollout {pb.rollout_id!r} has no phase")
    spec = rollout_spec_from_pb(pb.spec)
    paused_from = phase_from_pb(pb.paused_from)
    shadowing = Phase.SHADOWING in (phase, paused_from)
    ev = pb.evidence
    state = RolloutState(
        rollout_id=pb.rollout_id,
        model=pb.model,
        phase=phase,
        step_index=pb.step_index,
        candidate_weight_percent=pb.candidate_weight_percent,
        shadow_share=pb.shadow_share
        if pb.HasField("shadow_share")
        else (spec.shadow_share if shadowing else 0.0),
        phase_started_ms=pb.phase_started_at_unix_ms,
        step_started_ms=pb.step_started_at_unix_ms
        if pb.HasField("step_started_at_unix_ms")
        else pb.updated_at_unix_ms,
        consecutive_failures=pb.consecutive_failures,
        failure_window_end_ms=pb.failure_window_end_unix_ms,
        paused_from=paused_from,
        last_reason=pb.last_reason,
        epoch=pb.epoch if pb.HasField("epoch") else epoch,
        updated_ms=pb.updated_at_unix_ms,
        evidence=StepEvidence(
            candidate_requests=ev.candidate_requests,
            candidate_errors=ev.candidate_errors,
            baseline_requests=ev.baseline_requests,
            baseline_errors=ev.baseline_errors,
            windows=ev.windows,
            through_ms=ev.through_unix_ms,
        ),
        sequential=sequential_from_pb(pb),
    )
    return state, spec


def qos_state_to_pb(s: QosState) -> audit_pb2.QosState:
    """Load ceilings are not carried."""
    return audit_pb2.QosState(
        model=s.model,
        version=s.version,
        active_variant=s.active_variant,
        last_change_unix_ms=s.last_change_ms,
        breach_since_unix_ms=s.breach_since_ms or 0,
        calm_since_unix_ms=s.calm_since_ms or 0,
        contention=s.contention,
    )


def qos_state_from_pb(pb: audit_pb2.QosState) -> QosState:
    """Without load ceilings: after a restart the first step up is not load-checked."""
    return QosState(
        model=pb.model,
        version=pb.version,
        active_variant=pb.active_variant,
        last_change_ms=pb.last_change_unix_ms,
        breach_since_ms=pb.breach_since_unix_ms or None,
        calm_since_ms=pb.calm_since_unix_ms or None,
        contention=pb.contention or 1.0,
    )


def precision_command_of(
    decision: QosDecision, *, epoch: int, decision_id: str = ""
) -> control_pb2.PrecisionCommand:
    after = decision.after
    return control_pb2.PrecisionCommand(
        model=after.model,
        version=after.version,
        variant=after.active_variant,
        epoch=epoch,
        reason=decision.reason,
        issued_at_unix_ms=decision.at_ms,
        decision_id=decision_id or qos_decision_id_of(decision),
    )


# -- routing --------------------------------------------------------------------


def routing_table_of(
    plan: RoutingPlan, *, now_ms: int, reason: str = "", config: RouteConfig | None = None
) -> control_pb2.RoutingTable:
    """The compacted routing record for ``plan`` (bucket ranges by ``graylane.routing``),
    carrying the model's cohort rules and pinning (``config``)."""
    table = route_table_for(plan, reason=reason, config=config)
    return table_to_pb(table, updated_at_unix_ms=now_ms)


# -- audit ----------------------------------------------------------------------


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:24]


def decision_id_of(decision: Decision) -> str:
    """A stable id: the same decision replayed gets the same id."""
    return _digest(
        decision.after.rollout_id,
        decision.at_ms,
        decision.kind.value,
        decision.rule,
        decision.before.epoch,
        decision.after.epoch,
        decision.before.updated_ms,
    )


def qos_decision_id_of(decision: QosDecision) -> str:
    return _digest(
        decision.after.model,
        decision.after.version,
        decision.at_ms,
        decision.kind.value,
        decision.rule,
        decision.after.active_variant,
    )


def decision_to_audit(
    decision: Decision,
    spec: RolloutSpec,
    *,
    decision_id: str = "",
    actor: str = "policy-engine",
    command_id: str = "",
) -> audit_pb2.AuditRecord:
    return audit_pb2.AuditRecord(
        decision_id=decision_id or decision_id_of(decision),
        decided_at_unix_ms=decision.at_ms,
        model=spec.model,
        rollout_id=spec.rollout_id,
        version=spec.candidate,
        kind=decision_kind_to_pb(decision.kind),
        rule=decision.rule,
        reason=decision.reason,
        inputs=[window_stats_to_pb(s) for s in decision.inputs],
        rollout_before=rollout_state_to_pb(decision.before, spec),
        rollout_after=rollout_state_to_pb(decision.after, spec),
        actor=actor,
        epoch=decision.after.epoch,
        command_id=command_id,
        agreement=_agreement_to_pb(decision.agreement) if decision.agreement is not None else None,
        note=decision.note,
        step_inputs=[window_stats_to_pb(s) for s in _steps(decision.facts)],
        liveness=[liveness_to_pb(v) for v in _liveness(decision.facts)],
    )


def _steps(facts: RolloutFacts | None) -> list[WindowStats]:
    if facts is None:
        return []
    return [s for s in (facts.baseline_step, facts.candidate_step) if s is not None]


def _liveness(facts: RolloutFacts | None) -> list[VersionLiveness]:
    if facts is None:
        return []
    return [v for v in (facts.baseline_liveness, facts.candidate_liveness) if v is not None]


def facts_from_audit(
    rec: audit_pb2.AuditRecord, baseline: str, candidate: str
) -> RolloutFacts | None:
    """The facts a decision was taken with (None when the record carries none)."""
    if not rec.step_inputs and not rec.liveness:
        return None
    steps = {s.version: window_stats_from_pb(s) for s in rec.step_inputs}
    live = {v.version: liveness_from_pb(v) for v in rec.liveness}
    return RolloutFacts(
        baseline_step=steps.get(baseline),
        candidate_step=steps.get(candidate),
        baseline_liveness=live.get(baseline),
        candidate_liveness=live.get(candidate),
    )


def _agreement_to_pb(stats: AgreementStats) -> audit_pb2.ShadowAgreement:
    pb = audit_pb2.ShadowAgreement(pairs=stats.pairs, agreeing=stats.agreeing)
    if stats.mismatch is not None:
        pb.baseline_schema = stats.mismatch.baseline
        pb.candidate_schema = stats.mismatch.candidate
    return pb


def agreement_from_pb(pb: audit_pb2.ShadowAgreement) -> AgreementStats:
    mismatch = (
        SchemaMismatch(pb.baseline_schema, pb.candidate_schema)
        if pb.baseline_schema or pb.candidate_schema
        else None
    )
    return AgreementStats(pb.pairs, pb.agreeing, mismatch)


def qos_decision_to_audit(
    decision: QosDecision,
    *,
    epoch: int = 0,
    decision_id: str = "",
    actor: str = "policy-engine",
    rollout_id: str = "",
    policy: QosPolicy | None = None,
) -> audit_pb2.AuditRecord:
    """PRECISION_CHANGE when the variant changes, else HOLD; with ``policy`` for replay."""
    kind = audit_pb2.DECISION_PRECISION_CHANGE if decision.changed else audit_pb2.DECISION_HOLD
    return audit_pb2.AuditRecord(
        qos_policy=qos_policy_to_pb(policy) if policy is not None else None,
        decision_id=decision_id or qos_decision_id_of(decision),
        decided_at_unix_ms=decision.at_ms,
        model=decision.after.model,
        rollout_id=rollout_id,
        version=decision.after.version,
        kind=kind,
        rule=decision.rule,
        reason=decision.reason,
        inputs=[window_stats_to_pb(s) for s in decision.inputs],
        qos_before=qos_state_to_pb(decision.before),
        qos_after=qos_state_to_pb(decision.after),
        actor=actor,
        epoch=epoch,
        qos_scale_hold=decision.scale_hold,
    )
