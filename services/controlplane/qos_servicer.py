"""gRPC ``Qos`` and ``Audit``: QoS policies with their active variant; decisions on record."""

from __future__ import annotations

import asyncio
import uuid

from graylane.rollouts.pb import qos_policy_from_pb, qos_policy_to_pb
from graylane.services.controlplane import domain
from graylane.services.controlplane.facts import model_facts
from graylane.services.controlplane.limits import check_limit
from graylane.services.controlplane.plane import Context, ControlPlane, mapped, send_or_unavailable
from graylane.v1 import audit_pb2, controlplane_pb2, controlplane_pb2_grpc, rollout_pb2

__all__ = ["AuditServicer", "QosServicer"]


class QosServicer(controlplane_pb2_grpc.QosServicer):
    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    def _view(self, model: str, version: str) -> controlplane_pb2.QosPolicyView:
        stored = self._cp.store.get_policy(model, version)
        if stored is None:
            raise domain.NotFound(
                f"no QoS policy for {model} {version}; set one with `graylane qos set`"
            )
        view = controlplane_pb2.QosPolicyView(
            policy=stored.policy,
            updated_by=stored.updated_by,
            updated_at_unix_ms=stored.updated_at_ms,
        )
        latest = self._cp.store.query_audit(
            model=model,
            version=version,
            kinds=[audit_pb2.DECISION_PRECISION_CHANGE],
            limit=1,
            newest_first=True,
        )
        if latest:
            view.active_variant = latest[0].qos_after.active_variant
            view.active_since_unix_ms = latest[0].decided_at_unix_ms
            view.last_reason = latest[0].reason
        return view

    @mapped
    async def SetPolicy(
        self, request: rollout_pb2.QosPolicy, context: Context
    ) -> controlplane_pb2.QosPolicyView:
        cp = self._cp
        principal = cp.principal(context)
        facts = await asyncio.to_thread(model_facts, cp.registry, cp.store, request.model)
        domain.check_qos_policy(facts, request.model, request.version, list(request.ladder))
        policy = qos_policy_to_pb(qos_policy_from_pb(request))
        command = rollout_pb2.RolloutCommand(
            command_id=uuid.uuid4().hex,
            model=policy.model,
            kind=rollout_pb2.COMMAND_SET_QOS_POLICY,
            qos_policy=policy,
            issued_by=principal.name,
            reason="set QoS policy",
            issued_at_unix_ms=cp.clock(),
        )

        def save() -> None:
            cp.store.put_policy(policy, principal.name)
            cp.store.add_command(command)

        await asyncio.to_thread(save)
        await send_or_unavailable(cp, command, context)
        view = await asyncio.to_thread(self._view, policy.model, policy.version)
        view.command_id = command.command_id
        return view

    @mapped
    async def GetPolicy(
        self, request: controlplane_pb2.GetQosPolicyRequest, context: Context
    ) -> controlplane_pb2.QosPolicyView:
        return await asyncio.to_thread(self._view, request.model, request.version)


class AuditServicer(controlplane_pb2_grpc.AuditServicer):
    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    @mapped
    async def Query(
        self, request: controlplane_pb2.AuditQuery, context: Context
    ) -> controlplane_pb2.AuditQueryResponse:
        if request.to_unix_ms and request.from_unix_ms >= request.to_unix_ms:
            raise domain.InvalidArgument("the time range is empty: --from must be before --to")
        records = await asyncio.to_thread(
            self._cp.store.query_audit,
            model=request.model,
            rollout_id=request.rollout_id,
            from_ms=request.from_unix_ms,
            to_ms=request.to_unix_ms,
            limit=check_limit(
                request.limit,
                default=1000,
                maximum=self._cp.limits.max_audit_limit,
                what="audit records",
            ),
        )
        return controlplane_pb2.AuditQueryResponse(records=records)
