"""The wire edge of :class:`~graylane.policy_engine.core.PolicyCore`: commands in, records out.

:func:`records_of` turns the core's outputs into ``(topic, key, value)``
records with the keys of the contract (routing: model; precision and scale:
``model/version``; rollouts: rollout id; audit: model). :func:`command_from_pb`
decodes a ``RolloutCommand``; a command that cannot be decoded (broken spec or
policy, unknown kind) comes back as a :class:`CommandRejected` to audit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

from graylane import serde
from graylane.policy_engine import convert
from graylane.policy_engine.convert_scale import scale_request_of, scale_to_audit
from graylane.policy_engine.logic.agreement import OutputField, ShadowOutput
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    CommandRejected,
    Output,
    PrecisionAck,
    PrecisionPublication,
    QosAudit,
    QosPolicySet,
    RolloutAudit,
    RolloutPublication,
    RoutingAudit,
    RoutingPublication,
    ScaleAudit,
    ScalePublication,
)
from graylane.rollouts.errors import PolicyError
from graylane.rollouts.pb import decision_kind_to_pb, manual_command_from_pb
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule
from graylane.routing.cohorts import InvalidRouteRule
from graylane.routing.convert import route_config_from_pb
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2, inference_pb2, rollout_pb2, tensor_pb2

__all__ = [
    "Record",
    "command_from_pb",
    "records_of",
    "shadow_output_of",
]


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes
    value: bytes


def command_from_pb(pb: rollout_pb2.RolloutCommand) -> Command | CommandRejected:
    """The core's command of ``pb``, or why it is refused."""
    base = Command(
        kind=CommandKind.MANUAL,
        model=pb.model or pb.spec.model or pb.qos_policy.model,
        command_id=pb.command_id,
        rollout_id=pb.rollout_id or pb.spec.rollout_id,
        issued_by=pb.issued_by,
        note=pb.reason,
    )
    if pb.kind == rollout_pb2.COMMAND_START:
        base = replace(base, kind=CommandKind.START)
    try:
        if pb.kind == rollout_pb2.COMMAND_START:
            spec = convert.rollout_spec_from_pb(pb.spec)
            return replace(base, kind=CommandKind.START, spec=spec)
        if pb.kind == rollout_pb2.COMMAND_REVERT:
            return replace(base, kind=CommandKind.REVERT, target_version=pb.target_version)
        if pb.kind == rollout_pb2.COMMAND_SET_ROUTE_CONFIG:
            config = route_config_from_pb(pb.route_config)
            return replace(
                base,
                kind=CommandKind.SET_ROUTE_CONFIG,
                route_config=config,
                target_version=pb.target_version,
            )
        if pb.kind == rollout_pb2.COMMAND_SET_QOS_POLICY:
            policy = convert.qos_policy_from_pb(pb.qos_policy)
            return replace(base, kind=CommandKind.SET_QOS_POLICY, qos_policy=policy)
    except (PolicyError, InvalidRouteRule) as exc:
        return CommandRejected(command=base, reason=str(exc), at_ms=pb.issued_at_unix_ms)
    manual = manual_command_from_pb(pb.kind)
    command = replace(base, manual=manual)
    if manual is None:
        return CommandRejected(
            command=command, reason=f"unknown command kind {pb.kind}", at_ms=pb.issued_at_unix_ms
        )
    return command


def shadow_output_of(pb: inference_pb2.InferenceResult, at_ms: int) -> ShadowOutput:
    """A result on the shadow topic, reduced for comparison.

    Generations compare by token ids; other results by a digest of their
    output bytes (exact agreement; a tolerance needs the decoded tensors).
    """
    error = pb.status != inference_pb2.OK
    tokens = tuple(pb.generated_token_ids) if pb.generated_token_ids else None
    label: int | None = None
    if tokens is None and not error:
        digest = hashlib.blake2b(digest_size=8)
        for t in pb.outputs:
            digest.update(t.data)
        label = int.from_bytes(digest.digest(), "big")
    schema = tuple(
        OutputField(t.name, tensor_pb2.DType.Name(t.dtype).lower(), tuple(t.shape))
        for t in pb.outputs
    )
    return ShadowOutput(
        request_id=pb.request_id,
        version=pb.version,
        at_ms=at_ms,
        tokens=tokens,
        label=label,
        error=error,
        schema=schema if tokens is None else None,
    )


def records_of(outputs: Iterable[Output], layout: TopicLayout) -> list[Record]:
    return [_record(o, layout) for o in outputs]


def _record(o: Output, layout: TopicLayout) -> Record:
    if isinstance(o, RoutingPublication):
        table = convert.routing_table_of(o.plan, now_ms=o.at_ms, reason=o.reason, config=o.config)
        return Record(layout.routing(), o.plan.model.encode(), serde.encode(table))
    if isinstance(o, PrecisionPublication):
        after = o.decision.after
        precision = convert.precision_command_of(o.decision, epoch=o.epoch)
        key = layout.precision_key(after.model, after.version)
        return Record(layout.precision(), key.encode(), serde.encode(precision))
    if isinstance(o, ScalePublication):
        scaled = o.decision.after
        key = layout.scale_key(scaled.model, scaled.version)
        request = scale_request_of(o.decision, epoch=o.epoch)
        return Record(layout.scale(), key.encode(), serde.encode(request))
    if isinstance(o, ScaleAudit):
        rec = scale_to_audit(o.decision, epoch=o.epoch)
        return Record(layout.audit(), o.decision.after.model.encode(), serde.encode(rec))
    if isinstance(o, RolloutPublication):
        pb = convert.rollout_state_to_pb(o.state, o.spec)
        return Record(layout.rollouts(), o.state.rollout_id.encode(), serde.encode(pb))
    if isinstance(o, RolloutAudit):
        rec = convert.decision_to_audit(o.decision, o.spec, command_id=o.command_id, actor=o.actor)
        return Record(layout.audit(), o.spec.model.encode(), serde.encode(rec))
    if isinstance(o, QosAudit):
        rec = convert.qos_decision_to_audit(
            o.decision, epoch=o.epoch, rollout_id=o.rollout_id, policy=o.policy
        )
        return Record(layout.audit(), o.decision.after.model.encode(), serde.encode(rec))
    if isinstance(o, QosPolicySet):
        rec = audit_pb2.AuditRecord(
            decision_id=f"qos-policy-{o.command_id or o.at_ms}",
            decided_at_unix_ms=o.at_ms,
            model=o.policy.model,
            version=o.policy.version,
            kind=decision_kind_to_pb(DecisionKind.MANUAL),
            rule=DecisionRule.SET_QOS_POLICY,
            reason=f"QoS policy set: SLO p99 {o.policy.slo_p99_ms:g} ms, "
            f"ladder {' > '.join(o.policy.ladder)}",
            qos_before=convert.qos_state_to_pb(o.before) if o.before else None,
            qos_after=convert.qos_state_to_pb(o.after),
            actor=o.actor or "control-plane",
            command_id=o.command_id,
        )
        return Record(layout.audit(), o.policy.model.encode(), serde.encode(rec))
    if isinstance(o, PrecisionAck):
        rec = audit_pb2.AuditRecord(
            decision_id=f"precision-ack-{o.model}-{o.version}-{o.epoch}",
            decided_at_unix_ms=o.at_ms,
            model=o.model,
            version=o.version,
            kind=decision_kind_to_pb(DecisionKind.HOLD),
            rule=o.rule,
            reason=o.reason,
            actor="policy-engine",
            epoch=o.epoch,
        )
        return Record(layout.audit(), o.model.encode(), serde.encode(rec))
    if isinstance(o, RoutingAudit):
        rec = audit_pb2.AuditRecord(
            decision_id=f"routing-{o.model}-{o.epoch}",
            decided_at_unix_ms=o.at_ms,
            model=o.model,
            version=o.version,
            kind=decision_kind_to_pb(DecisionKind.MANUAL),
            rule=o.rule,
            reason=o.reason,
            actor=o.actor or "control-plane",
            epoch=o.epoch,
            command_id=o.command_id,
        )
        return Record(layout.audit(), o.model.encode(), serde.encode(rec))
    cmd = o.command
    rec = audit_pb2.AuditRecord(
        decision_id=f"rejected-{cmd.command_id or o.at_ms}",
        decided_at_unix_ms=o.at_ms,
        model=cmd.model,
        rollout_id=cmd.rollout_id,
        kind=decision_kind_to_pb(DecisionKind.MANUAL),
        rule=DecisionRule.COMMAND_REJECTED,
        reason=f"{cmd.kind.value}"
        f"{'/' + cmd.manual.value if cmd.manual else ''} rejected: {o.reason}",
        actor=cmd.issued_by or "control-plane",
        command_id=cmd.command_id,
        note=cmd.note,
    )
    return Record(layout.audit(), cmd.model.encode(), serde.encode(rec))
