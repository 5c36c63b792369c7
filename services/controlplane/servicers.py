"""The control plane's gRPC API: the servicers and what they share.

Room: the control plane's API, called by ``service.py``'s server. The servicers are thin:
protobuf in, the facts the rules need gathered from the registry and the store
(:func:`model_facts`), the rules of :mod:`graylane.services.controlplane.logic.rules`, the
store and the command bus, protobuf out (built in
:mod:`graylane.services.controlplane.wire`). Typed errors become gRPC status codes in
:func:`mapped`, and only there: each error's ``ErrorCode`` names its status
(``graylane.errors``). SQL calls run in a worker thread so the event loop keeps serving
Watch streams.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc import aio

from graylane.clock import Clock, now_ms
from graylane.errors import ErrorCode, GraylaneError
from graylane.registry.records import (
    ModelNotRegistered,
    RegistryError,
    UnknownVersion,
)
from graylane.registry.repository import Registry
from graylane.rollouts.pb import (
    manual_command_to_pb,
    phase_from_pb,
    qos_policy_from_pb,
    qos_policy_to_pb,
    rollout_spec_from_pb,
    rollout_spec_to_pb,
)
from graylane.rollouts.vocabulary import ManualCommand, Phase
from graylane.routing.convert import route_config_rules, route_config_to_pb, rule_from_pb
from graylane.routing.table import (
    RoutingRule,
    with_rule,
    without_rule,
)
from graylane.services.controlplane.audit_sink import RolloutHub
from graylane.services.controlplane.auth import ApiRole, Principal, TokenTable
from graylane.services.controlplane.bus import (
    CandidateCheck,
    CommandPublisher,
)
from graylane.services.controlplane.limits import ApiLimits, WatchSlots, check_limit
from graylane.services.controlplane.logic import rules
from graylane.services.controlplane.logic.apply import ApplyAction, ApplyPlan, plan_apply
from graylane.services.controlplane.logic.rung_quality import ladder_quality_drops
from graylane.services.controlplane.state import ControlStore, StoredRollout
from graylane.services.controlplane.wire import (
    apply_response,
    grpc_status,
    model_summary,
    new_command,
    qos_policy_view,
    receipt,
    rung_quality_from_pb,
    rung_quality_info,
    stable_history,
    version_summary,
)
from graylane.v1 import audit_pb2, controlplane_pb2, controlplane_pb2_grpc, rollout_pb2

__all__ = [
    "AuditServicer",
    "ControlPlane",
    "ModelRegistryServicer",
    "QosServicer",
    "RolloutsServicer",
    "RoutingServicer",
    "add_servicers",
    "grpc_status_of",
    "mapped",
    "model_facts",
]

log = logging.getLogger(__name__)

# -- what every servicer shares: the control plane, typed errors to status codes ---------------


Context = Any  # grpc.aio.ServicerContext; grpc ships no type hints
RulesChange = Callable[[tuple[RoutingRule, ...], bool], tuple[tuple[RoutingRule, ...], bool]]
"""A change of a model's cohort routing: (rules, pins allowed) -> (rules, pins allowed)."""
R = TypeVar("R")


def grpc_status_of(exc: GraylaneError) -> grpc.StatusCode:
    """The gRPC status of an error: its code's."""
    return grpc_status(exc.code)


def mapped(
    method: Callable[..., Awaitable[R]],
) -> Callable[..., Awaitable[R]]:
    """Answer every typed error (the control plane's rules, the registry's, the rollout
    policy's, the routing rules') with its code's gRPC status."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> R:
        try:
            return await method(self, request, context)
        except GraylaneError as exc:
            await context.abort(grpc_status_of(exc), str(exc))
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
        limits: ApiLimits | None = None,
        rollback_window: int = 10,
    ) -> None:
        self.registry = registry
        self.store = store
        self.bus = bus
        self.hub = hub
        self.tokens = tokens
        self.clock = clock
        self.limits = limits or ApiLimits()
        if rollback_window < 1:
            raise ValueError(f"rollback window {rollback_window} must be at least 1")
        self.rollback_window = rollback_window
        """How many of a model's last stable revisions ``undo --to-revision`` may go back to."""
        self.watch_slots = WatchSlots(self.limits.max_watch_streams)
        # One start at a time per process, so two starts cannot both pass the
        # "no active rollout" check.
        self.start_lock = asyncio.Lock()
        # One publication at a time, so the outbox and a request never both
        # publish the same command (each checks "sent" under the lock).
        self._send_lock = asyncio.Lock()

    def record_promotion(self, state: rollout_pb2.RolloutState) -> None:
        """A promoted candidate becomes the registry's stable version (the previous one is kept).

        Called from the audit sink's thread when the store records the promotion;
        the policy engine's table already routes everything to it.
        """
        model, candidate = state.model, state.spec.candidate_version
        try:
            self.registry.set_stable(model, candidate)
        except RegistryError as exc:
            log.error("promotion of %s %s not recorded as stable: %s", model, candidate, exc)
            return
        log.info("%s: %s is the stable version (rollout %s)", model, candidate, state.rollout_id)

    def record_rollback(self, state: rollout_pb2.RolloutState) -> None:
        """A rolled-back candidate that was the registry's stable version (its rollout was
        rolled back during its bake) gives the stable version back to the baseline.

        Any other rollback leaves the registry alone: its stable version is the baseline.
        """
        model, spec = state.model, state.spec
        try:
            stable = self.registry.get_stable(model)
            if stable is None or str(stable.version) != spec.candidate_version:
                return
            self.registry.set_stable(model, spec.baseline_version)
        except RegistryError as exc:
            log.error(
                "rollback of %s %s not recorded in the registry: %s",
                model,
                spec.candidate_version,
                exc,
            )
            return
        log.info(
            "%s: %s is the stable version again (rollout %s rolled back during its bake)",
            model,
            spec.baseline_version,
            state.rollout_id,
        )

    def principal(self, context: Context) -> Principal:
        found = self.tokens.principal_of(context.invocation_metadata())
        # The interceptor already refused calls without a valid token.
        return found if found is not None else Principal("unknown", ApiRole.READ_ONLY)

    async def send(self, command: rollout_pb2.RolloutCommand) -> bool:
        """Publish a stored command and mark it sent; False when it was sent already.

        A failure leaves it for :meth:`resend_unsent`.
        """
        async with self._send_lock:
            if await asyncio.to_thread(self.store.is_sent, command.command_id):
                return False
            await self.bus.publish(command)
            await asyncio.to_thread(self.store.mark_sent, command.command_id)
            return True

    async def resend_unsent(self) -> int:
        """Publish commands stored but never acknowledged (the outbox); returns how many."""
        sent = 0
        for command in await asyncio.to_thread(self.store.unsent_commands):
            sent += await self.send(command)
        return sent


async def send_or_unavailable(
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


# -- the servicers -----------------------------------------------------------------------------


def add_servicers(
    server: aio.Server, cp: ControlPlane, candidate_check: CandidateCheck | None = None
) -> None:
    controlplane_pb2_grpc.add_ModelRegistryServicer_to_server(ModelRegistryServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_RolloutsServicer_to_server(
        RolloutsServicer(cp, candidate_check), server
    )  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_QosServicer_to_server(QosServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_AuditServicer_to_server(AuditServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_RoutingServicer_to_server(RoutingServicer(cp), server)  # type: ignore[no-untyped-call]


class ModelRegistryServicer(controlplane_pb2_grpc.ModelRegistryServicer):
    """gRPC ``ModelRegistry``: register models and versions, list them, set the stable version."""

    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    @mapped
    async def RegisterModel(
        self, request: controlplane_pb2.RegisterModelRequest, context: Context
    ) -> controlplane_pb2.ModelSummary:
        await asyncio.to_thread(self._cp.registry.register_model, request.name, request.description)
        model = await asyncio.to_thread(self._cp.registry.get_model, request.name)
        return model_summary(model)

    @mapped
    async def ListModels(
        self, request: controlplane_pb2.ListModelsRequest, context: Context
    ) -> controlplane_pb2.ListModelsResponse:
        models = await asyncio.to_thread(self._cp.registry.list_models)
        return controlplane_pb2.ListModelsResponse(models=[model_summary(m) for m in models])

    @mapped
    async def RegisterVersion(
        self, request: controlplane_pb2.RegisterVersionRequest, context: Context
    ) -> controlplane_pb2.VersionSummary:
        reg = self._cp.registry
        await asyncio.to_thread(
            reg.register_version, request.model, request.version, request.source_sha256
        )
        return await asyncio.to_thread(version_summary, reg, request.model, request.version)

    @mapped
    async def ListVersions(
        self, request: controlplane_pb2.ListVersionsRequest, context: Context
    ) -> controlplane_pb2.ListVersionsResponse:
        reg = self._cp.registry

        def load() -> controlplane_pb2.ListVersionsResponse:
            model = model_summary(reg.get_model(request.model))
            versions = [
                version_summary(reg, request.model, str(v.version))
                for v in reg.list_versions(request.model)
            ]
            return controlplane_pb2.ListVersionsResponse(model=model, versions=versions)

        return await asyncio.to_thread(load)

    @mapped
    async def SetStable(
        self, request: controlplane_pb2.SetStableRequest, context: Context
    ) -> controlplane_pb2.VersionSummary:
        reg = self._cp.registry
        await asyncio.to_thread(reg.set_stable, request.model, request.version)
        return await asyncio.to_thread(version_summary, reg, request.model, request.version)

    @mapped
    async def RecordRungQuality(
        self, request: controlplane_pb2.RecordRungQualityRequest, context: Context
    ) -> controlplane_pb2.RecordRungQualityResponse:
        cp = self._cp
        principal = cp.principal(context)
        records = [rung_quality_from_pb(r) for r in request.rungs]
        if not records:
            raise rules.InvalidArgument("no rung to record")
        stored = await asyncio.to_thread(
            cp.registry.record_rung_quality, request.model, request.version, records
        )
        response = controlplane_pb2.RecordRungQualityResponse(
            recorded=[rung_quality_info(r) for r in stored]
        )
        existing = await asyncio.to_thread(cp.store.get_policy, request.model, request.version)
        if existing is not None:
            # the policy engine learns the rungs' new costs with the policy, sent again
            policy = rollout_pb2.QosPolicy()
            policy.CopyFrom(existing.policy)
            command = await publish_qos_policy(
                cp, policy, principal.name, "rung quality recorded", context
            )
            response.command_id = command.command_id
        return response


async def publish_qos_policy(
    cp: ControlPlane,
    policy: rollout_pb2.QosPolicy,
    issued_by: str,
    reason: str,
    context: Context,
) -> rollout_pb2.RolloutCommand:
    """Store ``policy`` with its ladder's measured quality costs and send it to the
    policy engine."""

    def measured() -> dict[str, float]:
        try:
            quality = cp.registry.rung_quality(policy.model, policy.version)
        except (ModelNotRegistered, UnknownVersion):
            return {}
        return {p.value: q.quality_drop for p, q in quality.items()}

    drops = ladder_quality_drops(
        list(policy.ladder), await asyncio.to_thread(measured), dict(policy.rung_quality_drop)
    )
    policy.rung_quality_drop.clear()
    policy.rung_quality_drop.update(drops)
    policy = qos_policy_to_pb(qos_policy_from_pb(policy))
    command = new_command(
        rollout_pb2.COMMAND_SET_QOS_POLICY,
        model=policy.model,
        issued_by=issued_by,
        reason=reason,
        at_ms=cp.clock(),
        qos_policy=policy,
    )

    def save() -> None:
        cp.store.put_policy(policy, issued_by)
        cp.store.add_command(command)

    await asyncio.to_thread(save)
    await send_or_unavailable(cp, command, context)
    return command


def _phase(stored: StoredRollout) -> Phase:
    return phase_from_pb(stored.state.phase) or Phase.PENDING


class RolloutsServicer(controlplane_pb2_grpc.RolloutsServicer):
    """gRPC ``Rollouts``: start a rollout, read and watch its state, send manual commands."""

    def __init__(self, cp: ControlPlane, candidate_check: CandidateCheck | None = None) -> None:
        self._cp = cp
        self._candidate_check = candidate_check
        """Refuses a start whose candidate has no topic or no worker (None: no check)."""

    async def _stored(self, rollout_id: str) -> StoredRollout:
        if not rollout_id:
            raise rules.InvalidArgument("rollout_id is empty; `graylane rollout list` shows ids")
        stored = await asyncio.to_thread(self._cp.store.get_rollout, rollout_id)
        if stored is None:
            raise rules.NotFound(
                f"no rollout {rollout_id!r}; `graylane rollout list` shows the known ones"
            )
        return stored

    @mapped
    async def Start(
        self, request: rollout_pb2.RolloutSpec, context: Context
    ) -> rollout_pb2.RolloutState:
        return await self._start(request, context)

    async def _start(
        self, request: rollout_pb2.RolloutSpec, context: Context, *, rollout_id: str = ""
    ) -> rollout_pb2.RolloutState:
        """Start ``request``; ``rollout_id`` (an applied document's name) or a fresh id."""
        cp = self._cp
        principal = cp.principal(context)
        ask = rules.StartRequest(
            model=request.model,
            baseline=request.baseline_version,
            candidate=request.candidate_version,
            step_weights=tuple(s.weight_percent for s in request.steps),
        )
        async with cp.start_lock:
            facts = await asyncio.to_thread(model_facts, cp.registry, cp.store, request.model)
            baseline, candidate = rules.check_start(ask, facts)
            if self._candidate_check is not None:
                problem = await self._candidate_check(request.model, candidate)
                if problem is not None:
                    raise rules.FailedPrecondition(problem)
            now = cp.clock()
            wire = rollout_pb2.RolloutSpec()
            wire.CopyFrom(request)
            if rollout_id:
                exists = await asyncio.to_thread(cp.store.get_rollout, rollout_id)
                if exists is not None:
                    raise rules.FailedPrecondition(f"rollout {rollout_id!r} exists already")
            wire.rollout_id = rollout_id or rules.new_rollout_id(request.model, now)
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
            command = new_command(
                rollout_pb2.COMMAND_START,
                model=spec.model,
                rollout_id=spec.rollout_id,
                issued_by=principal.name,
                reason=f"apply {spec.document_digest}" if spec.document_digest else "start",
                at_ms=now,
                spec=spec,
            )
            await asyncio.to_thread(cp.store.create_rollout, state, command)
        cp.hub.publish(state)
        await send_or_unavailable(cp, command, context)
        return state

    async def _plan(
        self, request: controlplane_pb2.ApplyRolloutRequest
    ) -> tuple[ApplyPlan, StoredRollout | None]:
        if not request.spec.rollout_id:
            raise rules.InvalidArgument("the document has no metadata.name")
        applied = rollout_spec_from_pb(request.spec)
        stored = await asyncio.to_thread(self._cp.store.get_rollout, applied.rollout_id)
        live = rollout_spec_from_pb(stored.state.spec) if stored is not None else None
        phase = _phase(stored) if stored is not None else None
        return plan_apply(live, phase, applied), stored

    @mapped
    async def Diff(
        self, request: controlplane_pb2.ApplyRolloutRequest, context: Context
    ) -> controlplane_pb2.ApplyRolloutResponse:
        plan, stored = await self._plan(request)
        return apply_response(plan, stored.state if stored is not None else None)

    @mapped
    async def Apply(
        self, request: controlplane_pb2.ApplyRolloutRequest, context: Context
    ) -> controlplane_pb2.ApplyRolloutResponse:
        """Start, update or leave alone the rollout of the document's name (idempotent)."""
        cp = self._cp
        plan, stored = await self._plan(request)
        if plan.action is ApplyAction.REFUSE:
            raise rules.FailedPrecondition(plan.problem)
        if plan.action is ApplyAction.CREATE:
            state = await self._start(request.spec, context, rollout_id=request.spec.rollout_id)
            return apply_response(plan, state)
        if stored is None or plan.action is ApplyAction.UNCHANGED:
            return apply_response(plan, stored.state if stored is not None else None)
        spec = rollout_pb2.RolloutSpec()
        spec.CopyFrom(request.spec)
        live = stored.state.spec
        spec.created_at_unix_ms, spec.created_by = live.created_at_unix_ms, live.created_by
        spec.model = live.model
        command = new_command(
            rollout_pb2.COMMAND_UPDATE_SPEC,
            model=live.model,
            rollout_id=live.rollout_id,
            issued_by=cp.principal(context).name,
            reason=f"apply {spec.document_digest}" if spec.document_digest else "apply",
            at_ms=cp.clock(),
            spec=spec,
        )
        await asyncio.to_thread(cp.store.add_command, command)
        await send_or_unavailable(cp, command, context)
        return apply_response(plan, stored.state, command.command_id)

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
                grpc_status(ErrorCode.RATE_LIMITED),
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
        rules.check_command(check, request.rollout_id, _phase(stored))
        command = new_command(
            manual_command_to_pb(check),
            model=stored.state.model,
            rollout_id=stored.state.rollout_id,
            issued_by=principal.name,
            reason=request.reason or check.value,
            at_ms=cp.clock(),
        )
        await asyncio.to_thread(cp.store.add_command, command)
        await send_or_unavailable(cp, command, context)
        return receipt(command, stored.state)

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
    async def History(
        self, request: controlplane_pb2.StableHistoryRequest, context: Context
    ) -> controlplane_pb2.StableHistoryResponse:
        cp = self._cp
        revisions = await asyncio.to_thread(
            cp.registry.stable_revisions, request.model, cp.rollback_window
        )
        return stable_history(revisions)

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
                raise rules.NotFound(f"model {request.model!r} is not registered")
            active = cp.store.active_rollout(request.model)
            if request.to_revision:
                revisions = cp.registry.stable_revisions(request.model, cp.rollback_window)
                version = rules.revision_target(
                    request.model,
                    request.to_revision,
                    [(r.revision, str(r.version)) for r in revisions],
                    active.state.rollout_id if active is not None else None,
                )
                cp.registry.set_stable(request.model, version)
                return version, None
            if active is not None:
                return active.state.spec.baseline_version, active
            previous = cp.registry.get_previous_stable(request.model)
            if previous is None:
                raise rules.FailedPrecondition(
                    f"{request.model} has no previous stable version to revert to "
                    f"(stable: {facts.stable_version or 'none'})"
                )
            cp.registry.set_stable(request.model, previous.version)
            return str(previous.version), None

        async with cp.start_lock:
            version, active = await asyncio.to_thread(target)
            command = new_command(
                rollout_pb2.COMMAND_REVERT,
                model=request.model,
                rollout_id=active.state.rollout_id if active else "",
                issued_by=principal.name,
                reason=request.reason
                or (
                    f"undo to revision {request.to_revision} ({version})"
                    if request.to_revision
                    else f"revert to {version}"
                ),
                at_ms=cp.clock(),
                target_version=version,
            )
            await asyncio.to_thread(cp.store.add_command, command)
        await send_or_unavailable(cp, command, context)
        return receipt(command, active.state if active else None, version)


class RoutingServicer(controlplane_pb2_grpc.RoutingServicer):
    """gRPC ``Routing``: a model's cohort routing (tag rules to a version, pins allowed or not).

    The configuration is stored here and sent to the policy engine as a
    ``COMMAND_SET_ROUTE_CONFIG``; the engine carries it into every routing table it
    publishes for the model (the router applies it).
    """

    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    def _current(self, model: str) -> tuple[rollout_pb2.RouteConfig, str, int]:
        """The model's stored cohort routing (none stored: no rules, pins refused)."""
        stored = self._cp.store.get_route_config(model)
        if stored is None:
            return route_config_to_pb(model, (), False), "", 0
        pb, by, at = stored
        return route_config_to_pb(pb.model, route_config_rules(pb), pb.allow_pinning), by, at

    async def _change(
        self, model: str, change: RulesChange, context: Context
    ) -> controlplane_pb2.RouteConfigView:
        """Store ``change`` applied to the model's rules and pinning, and send it on."""
        cp = self._cp
        principal = cp.principal(context)

        def save() -> tuple[rollout_pb2.RouteConfig, rollout_pb2.RolloutCommand, int]:
            facts = model_facts(cp.registry, cp.store, model)
            if facts is None:
                raise rules.NotFound(f"model {model!r} is not registered")
            current = self._current(model)[0]
            # a bad or unknown rule raises its own typed error (BAD_REQUEST, NOT_FOUND)
            cohort, allow_pinning = change(route_config_rules(current), current.allow_pinning)
            unknown = sorted({r.version for r in cohort} - set(facts.versions))
            if unknown:
                raise rules.InvalidArgument(
                    f"{model} has no version {', '.join(unknown)}; "
                    f"registered: {', '.join(sorted(facts.versions)) or 'none'}"
                )
            pb = route_config_to_pb(current.model, cohort, allow_pinning)
            command = new_command(
                rollout_pb2.COMMAND_SET_ROUTE_CONFIG,
                model=model,
                issued_by=principal.name,
                reason="set cohort routing",
                at_ms=cp.clock(),
                route_config=pb,
                target_version=facts.stable_version or "",
            )
            at = cp.store.put_route_config(pb, principal.name)
            cp.store.add_command(command)
            return pb, command, at

        async with cp.start_lock:
            pb, command, at = await asyncio.to_thread(save)
        await send_or_unavailable(cp, command, context)
        return controlplane_pb2.RouteConfigView(
            config=pb,
            updated_by=principal.name,
            updated_at_unix_ms=at,
            command_id=command.command_id,
        )

    @mapped
    async def AddRule(
        self, request: controlplane_pb2.AddRouteRuleRequest, context: Context
    ) -> controlplane_pb2.RouteConfigView:
        rule = rule_from_pb(request.rule)
        return await self._change(
            request.model, lambda cohort, pins: (with_rule(cohort, rule), pins), context
        )

    @mapped
    async def RemoveRule(
        self, request: controlplane_pb2.RemoveRouteRuleRequest, context: Context
    ) -> controlplane_pb2.RouteConfigView:
        model, name = request.model, request.name
        return await self._change(
            model, lambda cohort, pins: (without_rule(cohort, name, model=model), pins), context
        )

    @mapped
    async def SetPinning(
        self, request: controlplane_pb2.SetPinningRequest, context: Context
    ) -> controlplane_pb2.RouteConfigView:
        allow = request.allow_pinning
        return await self._change(request.model, lambda cohort, _: (cohort, allow), context)

    @mapped
    async def GetConfig(
        self, request: controlplane_pb2.GetRouteConfigRequest, context: Context
    ) -> controlplane_pb2.RouteConfigView:
        config, by, at = await asyncio.to_thread(self._current, request.model)
        return controlplane_pb2.RouteConfigView(config=config, updated_by=by, updated_at_unix_ms=at)


class QosServicer(controlplane_pb2_grpc.QosServicer):
    """gRPC ``Qos``: QoS policies with their active variant."""

    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    def _view(self, model: str, version: str) -> controlplane_pb2.QosPolicyView:
        stored = self._cp.store.get_policy(model, version)
        if stored is None:
            raise rules.NotFound(
                f"no QoS policy for {model} {version}; set one with `graylane qos set`"
            )
        latest = self._cp.store.query_audit(
            model=model,
            version=version,
            kinds=[audit_pb2.DECISION_PRECISION_CHANGE],
            limit=1,
            newest_first=True,
        )
        return qos_policy_view(stored, latest[0] if latest else None)

    @mapped
    async def SetPolicy(
        self, request: rollout_pb2.QosPolicy, context: Context
    ) -> controlplane_pb2.QosPolicyView:
        cp = self._cp
        principal = cp.principal(context)
        facts = await asyncio.to_thread(model_facts, cp.registry, cp.store, request.model)
        rules.check_qos_policy(facts, request.model, request.version, list(request.ladder))
        policy = qos_policy_to_pb(qos_policy_from_pb(request))
        command = await publish_qos_policy(cp, policy, principal.name, "set QoS policy", context)
        view = await asyncio.to_thread(self._view, policy.model, policy.version)
        view.command_id = command.command_id
        return view

    @mapped
    async def GetPolicy(
        self, request: controlplane_pb2.GetQosPolicyRequest, context: Context
    ) -> controlplane_pb2.QosPolicyView:
        return await asyncio.to_thread(self._view, request.model, request.version)


class AuditServicer(controlplane_pb2_grpc.AuditServicer):
    """gRPC ``Audit``: the policy engine's decisions on record."""

    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    @mapped
    async def Query(
        self, request: controlplane_pb2.AuditQuery, context: Context
    ) -> controlplane_pb2.AuditQueryResponse:
        if request.to_unix_ms and request.from_unix_ms >= request.to_unix_ms:
            raise rules.InvalidArgument("the time range is empty: --from must be before --to")
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


# -- facts for the domain checks, from the registry and the store ------------------------------


def model_facts(registry: Registry, store: ControlStore, name: str) -> rules.ModelFacts | None:
    """None when the model is not registered."""
    if not name:
        return None
    try:
        info = registry.get_model(name)
    except ModelNotRegistered:
        return None
    versions: dict[str, rules.VersionFacts] = {}
    for v in registry.list_versions(name):
        artifacts = tuple(
            rules.ArtifactFacts(
                name=str(a.name),
                precision=a.precision.value,
                servable=a.servable,
                failures=a.validation.failures if a.validation is not None else (),
            )
            for a in registry.list_artifacts(name, v.version)
        )
        versions[str(v.version)] = rules.VersionFacts(str(v.version), v.status.value, artifacts)
    active = store.active_rollout(name)
    return rules.ModelFacts(
        name=info.name,
        versions=versions,
        stable_version=str(info.stable_version) if info.stable_version else None,
        active_rollout_id=active.state.rollout_id if active else None,
        active_rollout_phase=phase_from_pb(active.state.phase) if active else None,
    )
