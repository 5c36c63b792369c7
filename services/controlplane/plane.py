"""What every servicer shares: the :class:`ControlPlane` and the mapping of typed errors.

Typed errors become gRPC status codes here, and only here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from graylane.clock import Clock, now_ms
from graylane.registry import (
    DuplicateVersion,
    ModelNotRegistered,
    Registry,
    RegistryError,
    UnknownVersion,
)
from graylane.rollouts.errors import PolicyError
from graylane.services.controlplane import domain
from graylane.services.controlplane.audit_sink import RolloutHub
from graylane.services.controlplane.auth import ApiRole, Principal, TokenTable
from graylane.services.controlplane.bus import CommandPublisher
from graylane.services.controlplane.limits import ApiLimits, WatchSlots
from graylane.services.controlplane.store import ControlStore
from graylane.v1 import rollout_pb2

__all__ = ["Context", "ControlPlane", "mapped", "send_or_unavailable"]

log = logging.getLogger(__name__)

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


def mapped(
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
        limits: ApiLimits | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.bus = bus
        self.hub = hub
        self.tokens = tokens
        self.clock = clock
        self.limits = limits or ApiLimits()
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
