"""gRPC ``Routing``: a model's cohort routing (tag rules to a version, pins allowed or not).

The configuration is stored here and sent to the policy engine as a
``COMMAND_SET_ROUTE_CONFIG``; the engine carries it into every routing table
it publishes for the model (the router applies it).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from graylane.routing.cohorts import InvalidRouteRule, RouteConfig, UnknownRouteRule
from graylane.routing.convert import route_config_from_pb, route_config_to_pb, rule_from_pb
from graylane.services.controlplane import domain
from graylane.services.controlplane.facts import model_facts
from graylane.services.controlplane.plane import Context, ControlPlane, mapped, send_or_unavailable
from graylane.v1 import controlplane_pb2, controlplane_pb2_grpc, rollout_pb2

__all__ = ["RoutingServicer"]


class RoutingServicer(controlplane_pb2_grpc.RoutingServicer):
    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    def _current(self, model: str) -> tuple[RouteConfig, str, int]:
        stored = self._cp.store.get_route_config(model)
        if stored is None:
            return RouteConfig(model=model), "", 0
        pb, by, at = stored
        return route_config_from_pb(pb), by, at

    async def _change(
        self, model: str, change: Callable[[RouteConfig], RouteConfig], context: Context
    ) -> controlplane_pb2.RouteConfigView:
        cp = self._cp
        principal = cp.principal(context)

        def save() -> tuple[rollout_pb2.RouteConfig, rollout_pb2.RolloutCommand, int]:
            facts = model_facts(cp.registry, cp.store, model)
            if facts is None:
                raise domain.NotFound(f"model {model!r} is not registered")
            try:
                config = change(self._current(model)[0])
            except InvalidRouteRule as exc:
                raise domain.InvalidArgument(str(exc)) from None
            except UnknownRouteRule as exc:
                raise domain.NotFound(str(exc)) from None
            unknown = sorted({r.version for r in config.rules} - set(facts.versions))
            if unknown:
                raise domain.InvalidArgument(
                    f"{model} has no version {', '.join(unknown)}; "
                    f"registered: {', '.join(sorted(facts.versions)) or 'none'}"
                )
            pb = route_config_to_pb(config)
            command = rollout_pb2.RolloutCommand(
                command_id=uuid.uuid4().hex,
                model=model,
                kind=rollout_pb2.COMMAND_SET_ROUTE_CONFIG,
                route_config=pb,
                target_version=facts.stable_version or "",
                issued_by=principal.name,
                reason="set cohort routing",
                issued_at_unix_ms=cp.clock(),
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
        return await self._change(request.model, lambda c: c.with_rule(rule), context)

    @mapped
    async def RemoveRule(
        self, request: controlplane_pb2.RemoveRouteRuleRequest, context: Context
    ) -> controlplane_pb2.RouteConfigView:
        return await self._change(request.model, lambda c: c.without_rule(request.name), context)

    @mapped
    async def SetPinning(
        self, request: controlplane_pb2.SetPinningRequest, context: Context
    ) -> controlplane_pb2.RouteConfigView:
        allow = request.allow_pinning
        return await self._change(request.model, lambda c: c.with_pinning(allow), context)

    @mapped
    async def GetConfig(
        self, request: controlplane_pb2.GetRouteConfigRequest, context: Context
    ) -> controlplane_pb2.RouteConfigView:
        config, by, at = await asyncio.to_thread(self._current, request.model)
        return controlplane_pb2.RouteConfigView(
            config=route_config_to_pb(config), updated_by=by, updated_at_unix_ms=at
        )
