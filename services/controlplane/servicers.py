"""gRPC servicers: protobuf in, domain checks, store + command bus, protobuf out.

Thin on purpose: rules live in :mod:`graylane.services.controlplane.domain`, persistence in
:mod:`graylane.services.controlplane.store`. Typed errors become status codes here, and
only here. SQL calls run in a worker thread so the event loop keeps serving
Watch streams.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc import aio

from graylane.clock import Clock, now_ms
from graylane.registry import (
    DuplicateVersion,
    ModelNotRegistered,
    Registry,
    RegistryError,
    UnknownVersion,
)
from graylane.rollouts.errors import PolicyError
from graylane.rollouts.pb import (
    manual_command_to_pb,
    phase_from_pb,
    qos_policy_from_pb,
    qos_policy_to_pb,
    rollout_spec_from_pb,
    rollout_spec_to_pb,
)
from graylane.rollouts.vocabulary import ManualCommand, Phase
from graylane.services.controlplane import domain
from graylane.services.controlplane.audit_sink import RolloutHub
from graylane.services.controlplane.auth import Principal, Role, TokenTable
from graylane.services.controlplane.bus import CommandPublisher
from graylane.services.controlplane.facts import model_facts, version_summary
from graylane.services.controlplane.store import ControlStore, StoredRollout
from graylane.v1 import audit_pb2, controlplane_pb2, controlplane_pb2_grpc, rollout_pb2

__all__ = ["ControlPlane", "add_servicers"]

Context = Any  # grpc.aio.ServicerContext; grpc ships no type hints
R = TypeVar("R")


def _status_of(exc: Exception) -> grpc.StatusCode | None:
    if isinstance(exc, domain.NotFound | ModelNotRegistered | UnknownVersion):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, domain.FailedPrecondition):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, DuplicateVersion):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(exc, domain.InvalidArgument | RegistryError | PolicyError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return None


def _mapped(
    method: Callable[..., Awaitable[R]],
) -> Callable[..., Awaitable[R]]:
    """Turn the domain's and registry's typed errors into gRPC status codes."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> R:
        try:
            return await method(self, request, context)
        except (domain.ControlError, RegistryError, PolicyError) as exc:
            code = _status_of(exc) or grpc.StatusCode.INTERNAL
            await context.abort(code, str(exc))
            raise  # unreachable: abort raises

    return wrapper


class ControlPlane:
    """What every servicer shares: registry, store, command bus, watch hub, tokens."""

    def __init__(
        self,
        *,
        registry: Registry,
        store: ControlStore,
        bus: CommandPublisher,
        hub: RolloutHub,
        tokens: TokenTable,
        clock: Clock = now_ms,
    ) -> None:
        self.registry = registry
        self.store = store
        self.bus = bus
        self.hub = hub
        self.tokens = tokens
        self.clock = clock
        # One start at a time per process, so two starts cannot both pass the
        # "no active rollout" check.
        self.start_lock = asyncio.Lock()

    def principal(self, context: Context) -> Principal:
        found = self.tokens.principal_of(context.invocation_metadata())
        # The interceptor already refused calls without a valid token.
        return found if found is not None else Principal("unknown", Role.READ_ONLY)

    async def send(self, command: rollout_pb2.RolloutCommand) -> None:
        """Publish a stored command and mark it sent; failures leave it for :meth:`resend`."""
        await self.bus.publish(command)
        await asyncio.to_thread(self.store.mark_sent, command.command_id)

    async def resend_unsent(self) -> int:
        """Publish commands stored but never acknowledged (the outbox); returns how many."""
        sent = 0
        for command in await asyncio.to_thread(self.store.unsent_commands):
            await self.send(command)
            sent += 1
        return sent


async def _send_or_unavailable(
    cp: ControlPlane, command: rollout_pb2.RolloutCommand, context: Context
) -> None:
    try:
        await cp.send(command)
    except Exception as exc:  # the bus's errors vary by client; the command is stored
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"command {command.command_id} is stored but the bus refused it ({exc}); "
            "the control plane resends it when the bus is back",
        )


# -- registry -----------------------------------------------------------------------


def _model_summary(cp: ControlPlane, name: str) -> controlplane_pb2.ModelSummary:
    info = cp.registry.get_model(name)
    return controlplane_pb2.ModelSummary(
        name=info.name,
        description=info.description,
        stable_version=str(info.stable_version) if info.stable_version else "",
        created_at_unix_ms=int(info.created_at.timestamp() * 1000),
    )


class ModelRegistryServicer(controlplane_pb2_grpc.ModelRegistryServicer):
    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    @_mapped
    async def RegisterModel(
        self, request: controlplane_pb2.RegisterModelRequest, context: Context
    ) -> controlplane_pb2.ModelSummary:
        await asyncio.to_thread(self._cp.registry.register_model, request.name, request.description)
        return await asyncio.to_thread(_model_summary, self._cp, request.name)

    @_mapped
    async def ListModels(
        self, request: controlplane_pb2.ListModelsRequest, context: Context
    ) -> controlplane_pb2.ListModelsResponse:
        models = await asyncio.to_thread(self._cp.registry.list_models)
        return controlplane_pb2.ListModelsResponse(
            models=[
                controlplane_pb2.ModelSummary(
                    name=m.name,
                    description=m.description,
                    stable_version=str(m.stable_version) if m.stable_version else "",
                    created_at_unix_ms=int(m.created_at.timestamp() * 1000),
                )
                for m in models
            ]
        )

    @_mapped
    async def RegisterVersion(
        self, request: controlplane_pb2.RegisterVersionRequest, context: Context
    ) -> controlplane_pb2.VersionSummary:
        reg = self._cp.registry
        await asyncio.to_thread(
            reg.register_version, request.model, request.version, request.source_sha256
        )
        return await asyncio.to_thread(version_summary, reg, request.model, request.version)

    @_mapped
    async def ListVersions(
        self, request: controlplane_pb2.ListVersionsRequest, context: Context
    ) -> controlplane_pb2.ListVersionsResponse:
        reg = self._cp.registry

        def load() -> controlplane_pb2.ListVersionsResponse:
            model = _model_summary(self._cp, request.model)
            versions = [
                version_summary(reg, request.model, str(v.version))
                for v in reg.list_versions(request.model)
            ]
            return controlplane_pb2.ListVersionsResponse(model=model, versions=versions)

        return await asyncio.to_thread(load)

    @_mapped
    async def SetStable(
        self, request: controlplane_pb2.SetStableRequest, context: Context
    ) -> controlplane_pb2.VersionSummary:
        reg = self._cp.registry
        await asyncio.to_thread(reg.set_stable, request.model, request.version)
        return await asyncio.to_thread(version_summary, reg, request.model, request.version)


# -- rollouts -----------------------------------------------------------------------


def _phase(stored: StoredRollout) -> Phase:
    return phase_from_pb(stored.state.phase) or Phase.PENDING


class RolloutsServicer(controlplane_pb2_grpc.RolloutsServicer):
    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    async def _stored(self, rollout_id: str) -> StoredRollout:
        if not rollout_id:
            raise domain.InvalidArgument("rollout_id is empty; `graylane rollout list` shows ids")
        stored = await asyncio.to_thread(self._cp.store.get_rollout, rollout_id)
        if stored is None:
            raise domain.NotFound(
                f"no rollout {rollout_id!r}; `graylane rollout list` shows the known ones"
            )
        return stored

    @_mapped
    async def Start(
        self, request: rollout_pb2.RolloutSpec, context: Context
    ) -> rollout_pb2.RolloutState:
        cp = self._cp
        principal = cp.principal(context)
        ask = domain.StartRequest(
            model=request.model,
            baseline=request.baseline_version,
            candidate=request.candidate_version,
            step_weights=tuple(s.weight_percent for s in request.steps),
        )
        async with cp.start_lock:
            facts = await asyncio.to_thread(model_facts, cp.registry, cp.store, request.model)
            baseline, candidate = domain.check_start(ask, facts)
            now = cp.clock()
            wire = rollout_pb2.RolloutSpec()
            wire.CopyFrom(request)
            wire.rollout_id = domain.new_rollout_id(request.model, now)
            wire.baseline_version = baseline
            wire.candidate_version = candidate
            wire.created_at_unix_ms = now
            wire.created_by = principal.name
            # Defaults filled in, so what is stored is what the policy engine runs.
            spec = rollout_spec_to_pb(rollout_spec_from_pb(wire))
            state = rollout_pb2.RolloutState(
                rollout_id=spec.rollout_id,
                model=spec.model,
                phase=rollout_pb2.PENDING,
                last_reason="waiting for the policy engine to take the start command",
                spec=spec,
            )
            command = rollout_pb2.RolloutCommand(
                command_id=uuid.uuid4().hex,
                rollout_id=spec.rollout_id,
                model=spec.model,
                kind=rollout_pb2.COMMAND_START,
                spec=spec,
                issued_by=principal.name,
                reason="start",
                issued_at_unix_ms=now,
            )
            await asyncio.to_thread(cp.store.create_rollout, state, command)
        cp.hub.publish(state)
        await _send_or_unavailable(cp, command, context)
        return state

    @_mapped
    async def Get(
        self, request: controlplane_pb2.GetRolloutRequest, context: Context
    ) -> rollout_pb2.RolloutState:
        return (await self._stored(request.rollout_id)).state

    @_mapped
    async def List(
        self, request: controlplane_pb2.ListRolloutsRequest, context: Context
    ) -> controlplane_pb2.ListRolloutsResponse:
        found = await asyncio.to_thread(
            self._cp.store.list_rollouts,
            request.model,
            active_only=request.active_only,
            limit=request.limit or 100,
        )
        return controlplane_pb2.ListRolloutsResponse(rollouts=[s.state for s in found])

    async def Watch(
        self, request: controlplane_pb2.WatchRolloutsRequest, context: Context
    ) -> AsyncIterator[rollout_pb2.RolloutState]:
        sub = self._cp.hub.subscribe(request.model, request.rollout_id)
        try:
            if request.initial:
                if request.rollout_id:
                    one = await asyncio.to_thread(self._cp.store.get_rollout, request.rollout_id)
                    current = [one] if one is not None else []
                else:
                    current = await asyncio.to_thread(
                        self._cp.store.list_rollouts, request.model, active_only=True
                    )
                for stored in current:
                    yield stored.state
            while True:
                yield await sub.queue.get()
        finally:
            self._cp.hub.unsubscribe(sub)

    async def _command(
        self,
        check: ManualCommand,
        request: controlplane_pb2.RolloutActionRequest,
        context: Context,
    ) -> controlplane_pb2.CommandReceipt:
        cp = self._cp
        principal = cp.principal(context)
        stored = await self._stored(request.rollout_id)
        domain.check_command(check, request.rollout_id, _phase(stored))
        command = rollout_pb2.RolloutCommand(
            command_id=uuid.uuid4().hex,
            rollout_id=stored.state.rollout_id,
            model=stored.state.model,
            kind=manual_command_to_pb(check),
            issued_by=principal.name,
            reason=request.reason or check.value,
            issued_at_unix_ms=cp.clock(),
        )
        await asyncio.to_thread(cp.store.add_command, command)
        await _send_or_unavailable(cp, command, context)
        return controlplane_pb2.CommandReceipt(
            command_id=command.command_id,
            rollout_id=command.rollout_id,
            model=command.model,
            kind=command.kind,
            issued_at_unix_ms=command.issued_at_unix_ms,
            issued_by=command.issued_by,
            state=stored.state,
        )

    @_mapped
    async def Pause(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.PAUSE, request, context)

    @_mapped
    async def Resume(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.RESUME, request, context)

    @_mapped
    async def Promote(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.PROMOTE, request, context)

    @_mapped
    async def Rollback(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.ROLLBACK, request, context)

    @_mapped
    async def Abort(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.ABORT, request, context)


# -- QoS ------------------------------------------------------------------------------


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

    @_mapped
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
        await _send_or_unavailable(cp, command, context)
        view = await asyncio.to_thread(self._view, policy.model, policy.version)
        view.command_id = command.command_id
        return view

    @_mapped
    async def GetPolicy(
        self, request: controlplane_pb2.GetQosPolicyRequest, context: Context
    ) -> controlplane_pb2.QosPolicyView:
        return await asyncio.to_thread(self._view, request.model, request.version)


# -- audit ----------------------------------------------------------------------------


class AuditServicer(controlplane_pb2_grpc.AuditServicer):
    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    @_mapped
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
            limit=request.limit or 1000,
        )
        return controlplane_pb2.AuditQueryResponse(records=records)


def add_servicers(server: aio.Server, cp: ControlPlane) -> None:
    controlplane_pb2_grpc.add_ModelRegistryServicer_to_server(ModelRegistryServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_RolloutsServicer_to_server(RolloutsServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_QosServicer_to_server(QosServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_AuditServicer_to_server(AuditServicer(cp), server)  # type: ignore[no-untyped-call]
