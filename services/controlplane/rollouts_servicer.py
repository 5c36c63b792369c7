"""gRPC ``Rollouts``: start a rollout, read and watch its state, send manual commands."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc

from graylane.rollouts.pb import (
    manual_command_to_pb,
    phase_from_pb,
    rollout_spec_from_pb,
    rollout_spec_to_pb,
)
from graylane.rollouts.vocabulary import ManualCommand, Phase
from graylane.services.controlplane import domain
from graylane.services.controlplane.candidates import CandidateCheck
from graylane.services.controlplane.facts import model_facts
from graylane.services.controlplane.limits import check_limit
from graylane.services.controlplane.plane import Context, ControlPlane, mapped, send_or_unavailable
from graylane.services.controlplane.store import StoredRollout
from graylane.v1 import controlplane_pb2, controlplane_pb2_grpc, rollout_pb2

__all__ = ["RolloutsServicer"]


def _phase(stored: StoredRollout) -> Phase:
    return phase_from_pb(stored.state.phase) or Phase.PENDING


class RolloutsServicer(controlplane_pb2_grpc.RolloutsServicer):
    def __init__(self, cp: ControlPlane, candidate_check: CandidateCheck | None = None) -> None:
        self._cp = cp
        self._candidate_check = candidate_check
        """Refuses a start whose candidate has no topic or no worker (None: no check)."""

    async def _stored(self, rollout_id: str) -> StoredRollout:
        if not rollout_id:
            raise domain.InvalidArgument("rollout_id is empty; `graylane rollout list` shows ids")
        stored = await asyncio.to_thread(self._cp.store.get_rollout, rollout_id)
        if stored is None:
            raise domain.NotFound(
                f"no rollout {rollout_id!r}; `graylane rollout list` shows the known ones"
            )
        return stored

    @mapped
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
            if self._candidate_check is not None:
                problem = await self._candidate_check(request.model, candidate)
                if problem is not None:
                    raise domain.FailedPrecondition(problem)
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
        await send_or_unavailable(cp, command, context)
        return state

    @mapped
    async def Get(
        self, request: controlplane_pb2.GetRolloutRequest, context: Context
    ) -> rollout_pb2.RolloutState:
        return (await self._stored(request.rollout_id)).state

    @mapped
    async def List(
        self, request: controlplane_pb2.ListRolloutsRequest, context: Context
    ) -> controlplane_pb2.ListRolloutsResponse:
        found = await asyncio.to_thread(
            self._cp.store.list_rollouts,
            request.model,
            active_only=request.active_only,
            limit=check_limit(
                request.limit, default=100, maximum=self._cp.limits.max_list_limit, what="rollouts"
            ),
        )
        return controlplane_pb2.ListRolloutsResponse(rollouts=[s.state for s in found])

    async def Watch(
        self, request: controlplane_pb2.WatchRolloutsRequest, context: Context
    ) -> AsyncIterator[rollout_pb2.RolloutState]:
        slots = self._cp.watch_slots
        if not slots.acquire():
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{slots.open} Watch streams are open, the maximum (--max-watch-streams); "
                "close one or poll with `rollout get`",
            )
            return
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
            slots.release()

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
        await send_or_unavailable(cp, command, context)
        return controlplane_pb2.CommandReceipt(
            command_id=command.command_id,
            rollout_id=command.rollout_id,
            model=command.model,
            kind=command.kind,
            issued_at_unix_ms=command.issued_at_unix_ms,
            issued_by=command.issued_by,
            state=stored.state,
        )

    @mapped
    async def Pause(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.PAUSE, request, context)

    @mapped
    async def Resume(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.RESUME, request, context)

    @mapped
    async def Promote(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.PROMOTE, request, context)

    @mapped
    async def Rollback(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.ROLLBACK, request, context)

    @mapped
    async def Abort(self, request: Any, context: Context) -> controlplane_pb2.CommandReceipt:
        return await self._command(ManualCommand.ABORT, request, context)

    @mapped
    async def Revert(
        self, request: controlplane_pb2.RevertRequest, context: Context
    ) -> controlplane_pb2.CommandReceipt:
        """100 % back to the previous stable version: the active rollout's baseline, or
        (no rollout) the stable version before the last promotion, made stable again."""
        cp = self._cp
        principal = cp.principal(context)

        def target() -> tuple[str, StoredRollout | None]:
            facts = model_facts(cp.registry, cp.store, request.model)
            if facts is None:
                raise domain.NotFound(f"model {request.model!r} is not registered")
            active = cp.store.active_rollout(request.model)
            if active is not None:
                return active.state.spec.baseline_version, active
            previous = cp.registry.get_previous_stable(request.model)
            if previous is None:
                raise domain.FailedPrecondition(
                    f"{request.model} has no previous stable version to revert to "
                    f"(stable: {facts.stable_version or 'none'})"
                )
            cp.registry.set_stable(request.model, previous.version)
            return str(previous.version), None

        async with cp.start_lock:
            version, active = await asyncio.to_thread(target)
            command = rollout_pb2.RolloutCommand(
                command_id=uuid.uuid4().hex,
                rollout_id=active.state.rollout_id if active else "",
                model=request.model,
                kind=rollout_pb2.COMMAND_REVERT,
                target_version=version,
                issued_by=principal.name,
                reason=request.reason or f"revert to {version}",
                issued_at_unix_ms=cp.clock(),
            )
            await asyncio.to_thread(cp.store.add_command, command)
        await send_or_unavailable(cp, command, context)
        return controlplane_pb2.CommandReceipt(
            command_id=command.command_id,
            rollout_id=command.rollout_id,
            model=command.model,
            kind=command.kind,
            issued_at_unix_ms=command.issued_at_unix_ms,
            issued_by=command.issued_by,
            state=active.state if active else None,
            target_version=version,
        )
