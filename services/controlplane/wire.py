"""Every protobuf the control plane builds: commands, views of registry records, stored
policies and receipts; and the gRPC status an error code is answered with.

The servicers answer with these messages; the domain and the store never build them.
"""

from __future__ import annotations

import uuid
from typing import Any

import grpc

from graylane.artifacts.naming import Precision
from graylane.errors import ErrorCode
from graylane.notifications.transitions import Transition, transition_kind
from graylane.registry.records import (
    ArtifactInfo,
    RegisteredModel,
    RegistryError,
    RungQuality,
    StableRevision,
)
from graylane.registry.repository import Registry
from graylane.rollouts.errors import InvalidSpec
from graylane.rollouts.pb import (
    decision_kind_from_pb,
    decision_rule_from_pb,
    phase_from_pb,
    webhooks_from_pb,
)
from graylane.services.controlplane.logic.apply import ApplyAction, ApplyPlan
from graylane.services.controlplane.logic.verdict import LastDecision, VerdictFacts, VersionVerdict
from graylane.services.controlplane.state import StoredPolicy, StoredRollout
from graylane.v1 import audit_pb2, controlplane_pb2, dlq_pb2, inference_pb2, rollout_pb2

__all__ = [
    "ROLLOUT_DECISION_KINDS",
    "apply_response",
    "dead_letter_of",
    "grpc_status",
    "model_summary",
    "new_command",
    "qos_policy_view",
    "receipt",
    "rung_quality_from_pb",
    "rung_quality_info",
    "stable_history",
    "transition_of",
    "variant_info",
    "verdict_facts",
    "verdict_json",
    "version_summary",
]


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status a call refused or failed with ``code`` ends with (the code's own,
    stated in ``graylane.errors``)."""
    return grpc.StatusCode[code.grpc_status.name]


def model_summary(model: RegisteredModel) -> controlplane_pb2.ModelSummary:
    return controlplane_pb2.ModelSummary(
        name=model.name,
        description=model.description,
        stable_version=str(model.stable_version) if model.stable_version else "",
        created_at_unix_ms=int(model.created_at.timestamp() * 1000),
    )


def rung_quality_info(q: RungQuality) -> controlplane_pb2.RungQualityInfo:
    return controlplane_pb2.RungQualityInfo(
        precision=q.precision.value,
        set_name=q.set_name,
        set_sha256=q.set_sha256,
        items=q.items,
        score=q.score,
        ci_low=q.ci_low,
        ci_high=q.ci_high,
        reference_precision=q.reference_precision.value,
        reference_score=q.reference_score,
        recorded_at_unix_ms=int(q.recorded_at.timestamp() * 1000) if q.recorded_at else 0,
    )


def _precision(value: str) -> Precision:
    try:
        return Precision(value)
    except ValueError:
        raise RegistryError(f"{value!r} is not a precision a rung can have") from None


def rung_quality_from_pb(pb: controlplane_pb2.RungQualityInfo) -> RungQuality:
    """Raises :class:`RegistryError` for an unknown precision or broken figures."""
    return RungQuality(
        precision=_precision(pb.precision),
        set_name=pb.set_name,
        set_sha256=pb.set_sha256,
        items=pb.items,
        score=pb.score,
        ci_low=pb.ci_low,
        ci_high=pb.ci_high,
        reference_precision=_precision(pb.reference_precision),
        reference_score=pb.reference_score,
    )


def variant_info(
    a: ArtifactInfo, quality: RungQuality | None = None
) -> controlplane_pb2.VariantInfo:
    out = controlplane_pb2.VariantInfo(
        artifact=str(a.name),
        precision=a.precision.value,
        backend=a.backend.value,
        backend_version=a.name.backend_version,
        target=a.target,
        servable=a.servable,
        forced=a.forced,
    )
    if a.endpoint is not None:
        out.endpoint.CopyFrom(
            controlplane_pb2.EngineEndpointInfo(
                url=a.endpoint.url,
                model_sha256=a.endpoint.model_sha256 or "",
                ladder_rank=a.endpoint.ladder_rank,
            )
        )
    v = a.validation
    if v is not None:
        out.validation.CopyFrom(
            controlplane_pb2.ValidationStatus(
                validated=True,
                passed=v.passed,
                max_abs=v.max_abs or 0.0,
                mean_rel=v.mean_rel or 0.0,
                cosine=v.cosine or 0.0,
                top1_agreement=v.top1_agreement or 0.0,
                token_agreement=v.token_agreement or 0.0,
                failures=list(v.failures),
            )
        )
    if quality is not None:
        out.quality.CopyFrom(rung_quality_info(quality))
    return out


def version_summary(
    registry: Registry, model: str, version: str
) -> controlplane_pb2.VersionSummary:
    info = registry.get_version(model, version)
    stable = registry.get_stable(model)
    quality = registry.rung_quality(model, info.version)
    return controlplane_pb2.VersionSummary(
        model=model,
        version=str(info.version),
        status=info.status.value,
        source_sha256=info.source_sha256,
        created_at_unix_ms=int(info.created_at.timestamp() * 1000),
        stable=stable is not None and stable.version == info.version,
        variants=[
            variant_info(a, quality.get(a.precision))
            for a in registry.list_artifacts(model, info.version)
        ],
    )


def receipt(
    command: rollout_pb2.RolloutCommand,
    state: rollout_pb2.RolloutState | None,
    target_version: str = "",
) -> controlplane_pb2.CommandReceipt:
    """What a caller gets back for a command it sent: the command and the rollout it touched."""
    return controlplane_pb2.CommandReceipt(
        command_id=command.command_id,
        rollout_id=command.rollout_id,
        model=command.model,
        kind=command.kind,
        issued_at_unix_ms=command.issued_at_unix_ms,
        issued_by=command.issued_by,
        state=state,
        target_version=target_version,
    )


def new_command(
    kind: rollout_pb2.CommandKind,
    *,
    model: str,
    issued_by: str,
    reason: str,
    at_ms: int,
    rollout_id: str = "",
    **payload: Any,
) -> rollout_pb2.RolloutCommand:
    """A command with a fresh id; ``payload`` sets what its kind carries (``spec=`` ...)."""
    return rollout_pb2.RolloutCommand(
        command_id=uuid.uuid4().hex,
        rollout_id=rollout_id,
        model=model,
        kind=kind,
        issued_by=issued_by,
        reason=reason,
        issued_at_unix_ms=at_ms,
        **payload,
    )


def qos_policy_view(
    stored: StoredPolicy, latest_change: audit_pb2.AuditRecord | None
) -> controlplane_pb2.QosPolicyView:
    """A stored policy with the variant its latest precision change made active."""
    view = controlplane_pb2.QosPolicyView(
        policy=stored.policy,
        updated_by=stored.updated_by,
        updated_at_unix_ms=stored.updated_at_ms,
    )
    if latest_change is not None:
        view.active_variant = latest_change.qos_after.active_variant
        view.active_since_unix_ms = latest_change.decided_at_unix_ms
        view.last_reason = latest_change.reason
    return view


_APPLY_OUTCOMES: dict[ApplyAction, controlplane_pb2.ApplyOutcome] = {
    ApplyAction.CREATE: controlplane_pb2.APPLY_CREATED,
    ApplyAction.UNCHANGED: controlplane_pb2.APPLY_UNCHANGED,
    ApplyAction.UPDATE: controlplane_pb2.APPLY_UPDATED,
    ApplyAction.REFUSE: controlplane_pb2.APPLY_REFUSED,
}


def apply_response(
    plan: ApplyPlan, state: rollout_pb2.RolloutState | None, command_id: str = ""
) -> controlplane_pb2.ApplyRolloutResponse:
    """The answer of Apply and Diff: what was (or would be) done, field by field."""
    return controlplane_pb2.ApplyRolloutResponse(
        outcome=_APPLY_OUTCOMES[plan.action],
        changes=[
            controlplane_pb2.SpecChange(
                field=c.field, live=c.live, applied=c.applied, allowed=c.allowed
            )
            for c in plan.changes
        ],
        state=state,
        command_id=command_id,
    )


def transition_of(record: audit_pb2.AuditRecord) -> Transition | None:
    """The rollout transition an audit record is (see ``graylane.notifications``), or None."""
    after = record.rollout_after
    if not record.rollout_id or not after.rollout_id:
        return None
    kind = decision_kind_from_pb(record.kind)
    phase = phase_from_pb(after.phase)
    if kind is None or phase is None:
        return None
    before = phase_from_pb(record.rollout_before.phase)
    what = transition_kind(kind, decision_rule_from_pb(record.rule), phase, before)
    if what is None:
        return None
    try:
        webhooks = webhooks_from_pb(after.spec)
    except InvalidSpec:
        return None
    return Transition(
        kind=what,
        decision_id=record.decision_id,
        rollout_id=record.rollout_id,
        model=record.model,
        baseline=after.spec.baseline_version,
        candidate=after.spec.candidate_version,
        phase=phase,
        step=after.step_index + 1,
        steps=len(after.spec.steps),
        candidate_weight_percent=after.candidate_weight_percent,
        rule=record.rule,
        reason=record.reason,
        actor=record.actor,
        at_ms=record.decided_at_unix_ms,
        document_digest=after.spec.document_digest,
        webhooks=webhooks,
    )


def dead_letter_of(
    transition: Transition, url: str, body: bytes, reason: str, *, source_topic: str, at_ms: int
) -> dlq_pb2.DeadLetter:
    """An undelivered webhook body, kept on the dead-letter topic (key: the rollout id)."""
    return dlq_pb2.DeadLetter(
        original_key=transition.rollout_id.encode(),
        original_value=body,
        original_length=len(body),
        source_topic=source_topic,
        error_code=inference_pb2.INTERNAL,
        reason=f"webhook {url} {transition.kind.value} ({transition.decision_id}): {reason}",
        service="controlplane-notifier",
        failed_at_unix_ms=at_ms,
    )


def stable_history(revisions: list[StableRevision]) -> controlplane_pb2.StableHistoryResponse:
    """A model's last stable revisions, newest (the current one) first."""
    return controlplane_pb2.StableHistoryResponse(
        revisions=[
            controlplane_pb2.StableRevisionView(
                revision=r.revision,
                version=str(r.version),
                set_at_unix_ms=int(r.set_at.timestamp() * 1000),
                current=i == 0,
            )
            for i, r in enumerate(revisions)
        ]
    )


# -- the HTTP verdict (JSON) -------------------------------------------------------------

ROLLOUT_DECISION_KINDS = (
    audit_pb2.DECISION_ROLLOUT_STARTED,
    audit_pb2.DECISION_ADVANCE,
    audit_pb2.DECISION_HOLD,
    audit_pb2.DECISION_GATE_FAILED,
    audit_pb2.DECISION_ROLLBACK,
    audit_pb2.DECISION_PROMOTE,
    audit_pb2.DECISION_MANUAL_COMMAND,
)
"""The audit kinds of a rollout's own decisions (not QoS or scale)."""


def verdict_facts(
    rollout: StoredRollout, version: str, newest: audit_pb2.AuditRecord | None
) -> VerdictFacts | None:
    """The facts of a stored rollout and its newest decision record; None when its phase
    is one this build does not know."""
    state = rollout.state
    phase = phase_from_pb(state.phase)
    if phase is None:
        return None
    kind = None if newest is None else decision_kind_from_pb(newest.kind)
    last = (
        None
        if newest is None or kind is None
        else LastDecision(
            kind=kind,
            rule=newest.rule,
            reason=newest.reason,
            decided_at_ms=newest.decided_at_unix_ms,
            epoch=newest.epoch,
        )
    )
    return VerdictFacts(
        model=state.model,
        version=version,
        rollout_id=state.rollout_id,
        phase=phase,
        step_index=state.step_index,
        candidate_weight_percent=state.candidate_weight_percent,
        last=last,
    )


def verdict_json(v: VersionVerdict) -> dict[str, Any]:
    """The answer Argo's ``web`` provider and Flagger's webhooks read (``result.verdict``)."""
    f, last = v.facts, v.facts.last
    return {
        "model": f.model,
        "version": f.version,
        "rollout_id": f.rollout_id,
        "phase": f.phase.value,
        "step_index": f.step_index,
        "candidate_weight_percent": f.candidate_weight_percent,
        "verdict": v.verdict.value,
        "why": v.why,
        "decision": None
        if last is None
        else {
            "kind": last.kind.value,
            "rule": last.rule,
            "reason": last.reason,
            "decided_at_unix_ms": last.decided_at_ms,
            "epoch": last.epoch,
            "age_ms": v.age_ms,
        },
    }
