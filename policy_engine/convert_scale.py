"""Replica decisions <-> the wire: ``ScaleRequest`` and its audit record."""

from __future__ import annotations

import hashlib

from graylane.policy_engine.logic.scale import ScaleDecision, ScaleReason
from graylane.v1 import audit_pb2, control_pb2

__all__ = [
    "scale_decision_id_of",
    "scale_reason_from_pb",
    "scale_reason_to_pb",
    "scale_request_of",
    "scale_to_audit",
]

_REASON_TO_PB = {
    ScaleReason.FLOOR_BREACH: control_pb2.SCALE_REASON_FLOOR_BREACH,
    ScaleReason.LAG_GROWING: control_pb2.SCALE_REASON_LAG_GROWING,
    ScaleReason.LOW_LOAD: control_pb2.SCALE_REASON_LOW_LOAD,
    ScaleReason.OVERLOAD: control_pb2.SCALE_REASON_OVERLOAD,
}
_REASON_FROM_PB: dict[int, ScaleReason] = {v: k for k, v in _REASON_TO_PB.items()}


def scale_reason_to_pb(reason: ScaleReason | None) -> int:
    return _REASON_TO_PB[reason] if reason is not None else control_pb2.SCALE_REASON_UNSPECIFIED


def scale_reason_from_pb(value: int) -> ScaleReason | None:
    return _REASON_FROM_PB.get(value)


def scale_decision_id_of(decision: ScaleDecision) -> str:
    """A stable id: the same decision replayed gets the same id."""
    parts = (
        decision.after.model,
        decision.after.version,
        decision.at_ms,
        decision.kind.value,
        decision.rule,
        decision.after.desired,
    )
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:24]


def scale_request_of(decision: ScaleDecision, *, epoch: int) -> control_pb2.ScaleRequest:
    after = decision.after
    return control_pb2.ScaleRequest(
        model=after.model,
        version=after.version,
        desired_replicas=after.desired,
        current_replicas=decision.signals.replicas,
        reason=scale_reason_to_pb(decision.reason),  # type: ignore[arg-type]
        detail=decision.detail,
        decided_at_unix_ms=decision.at_ms,
        decision_id=scale_decision_id_of(decision),
        epoch=epoch,
    )


def scale_to_audit(decision: ScaleDecision, *, epoch: int) -> audit_pb2.AuditRecord:
    """DECISION_SCALE_CHANGE with the request it published."""
    after = decision.after
    return audit_pb2.AuditRecord(
        decision_id=scale_decision_id_of(decision),
        decided_at_unix_ms=decision.at_ms,
        model=after.model,
        version=after.version,
        kind=audit_pb2.DECISION_SCALE_CHANGE,
        rule=decision.rule,
        reason=decision.detail,
        actor="policy-engine",
        epoch=epoch,
        scale=scale_request_of(decision, epoch=epoch),
    )
