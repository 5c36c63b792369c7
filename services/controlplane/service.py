"""The control plane's process: configuration, the gRPC server, health and metrics.

Room: ``service.py`` of the control plane: lifecycle. Its gRPC API is
:mod:`~graylane.services.controlplane.servicers`, its state
:mod:`~graylane.services.controlplane.state` (the SQL store), its rules
:mod:`~graylane.services.controlplane.logic`, its protobuf answers
:mod:`~graylane.services.controlplane.wire`.

:class:`ControlPlaneServer` is the process: configuration read once
(:meth:`ServerConfig.from_env` plus CLI flags: port, optional server TLS from PEM
files, and the bearer tokens, ``GRAYLANE_CP_TOKENS="<token>:operator,<token>:read_only"``
and/or a file of such entries, one per line), the gRPC server with its interceptors
(request metrics, then bearer tokens), standard gRPC health, the audit sink and the
command outbox. It refuses weak tokens and a plaintext bind beyond loopback (see
:mod:`graylane.services.controlplane.limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc import aio, ssl_server_credentials
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from graylane.clock import now_ms
from graylane.kafka.seam import KafkaFactory
from graylane.metrics.controlside import AuditSinkMetrics, ControlPlaneMetrics
from graylane.metrics.process import CONTROL_CAUGHT_UP, GROUP_JOINED, ServiceObservability
from graylane.notifications.sender import SenderPolicy, WebhookDelivery, WebhookSender
from graylane.registry.migrate import create_db_engine, upgrade
from graylane.registry.repository import Registry
from graylane.services.controlplane.audit_sink import AuditSink, RolloutHub
from graylane.services.controlplane.auth import AuthInterceptor, TokenTable
from graylane.services.controlplane.bus import (
    KafkaCandidateCheck,
    KafkaCommandBus,
)
from graylane.services.controlplane.limits import ApiLimits, check_startup
from graylane.services.controlplane.notifier import RolloutNotifier
from graylane.services.controlplane.servicers import ControlPlane, add_servicers
from graylane.services.controlplane.state import ControlStore
from graylane.services.controlplane.verdict_http import VerdictServer, verdict_app
from graylane.services.controlplane.wire import (
    dead_letter_of,
)
from graylane.supervision import BackgroundTasks

__all__ = ["ControlPlaneServer", "ServerConfig", "add_health", "set_serving"]


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051  # 0 picks a free port
    tokens: TokenTable
    tls_cert: Path | None = None
    tls_key: Path | None = None
    insecure: bool = False  # allow a plaintext bind beyond loopback, on purpose
    limits: ApiLimits = field(default_factory=ApiLimits)
    outbox_interval_s: float = 5.0
    check_candidates: bool = True  # refuse a start whose candidate has no topic or worker
    metrics_port: int | None = None
    """Overrides ``GRAYLANE_METRICS_PORT`` (0 = a free port, below 0 = off)."""
    http_port: int | None = None
    """The HTTP verdict endpoint for Argo Rollouts and Flagger (``GRAYLANE_CP_HTTP_PORT``;
    None = off, 0 = a free port), on the same host and TLS as the gRPC port."""
    rollback_window: int = 10
    """How many of a model's last stable revisions ``undo --to-revision`` may go back to."""
    webhooks: SenderPolicy = field(default_factory=SenderPolicy)
    """Queues, tries and backoff of rollout notifications."""

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        tokens_file: Path | None = None,
        **overrides: object,
    ) -> ServerConfig:
        e = os.environ if env is None else env
        file = tokens_file or (
            Path(e["GRAYLANE_CP_TOKENS_FILE"]) if e.get("GRAYLANE_CP_TOKENS_FILE") else None
        )
        tokens = TokenTable.from_sources(e.get("GRAYLANE_CP_TOKENS"), file)
        values: dict[str, object] = {"tokens": tokens}
        if e.get("GRAYLANE_CP_PORT"):
            values["port"] = int(e["GRAYLANE_CP_PORT"])
        if e.get("GRAYLANE_CP_TLS_CERT"):
            values["tls_cert"] = Path(e["GRAYLANE_CP_TLS_CERT"])
        if e.get("GRAYLANE_CP_TLS_KEY"):
            values["tls_key"] = Path(e["GRAYLANE_CP_TLS_KEY"])
        if e.get("GRAYLANE_CP_HTTP_PORT"):
            values["http_port"] = int(e["GRAYLANE_CP_HTTP_PORT"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


class ControlPlaneServer:
    """Start with :meth:`start`, stop with :meth:`stop`; :attr:`port` is the bound port."""

    def __init__(self, config: ServerConfig, factory: KafkaFactory) -> None:
        check_startup(
            tokens=config.tokens,
            host=config.host,
            tls_cert=config.tls_cert,
            tls_key=config.tls_key,
            insecure=config.insecure,
        )
        self._config = config
        self._factory = factory
        engine = create_db_engine(factory.settings.db_url)
        upgrade(engine)
        self.store = ControlStore(engine)
        self.hub = RolloutHub()
        self._bus = KafkaCommandBus(factory)
        self.control = ControlPlane(
            registry=Registry(engine),
            store=self.store,
            bus=self._bus,
            hub=self.hub,
            tokens=config.tokens,
            limits=config.limits,
            rollback_window=config.rollback_window,
        )
        # A promotion the sink records makes the candidate the registry's stable version.
        self.store.on_promoted(self.control.record_promotion)
        self.store.on_rolled_back(self.control.record_rollback)
        self.observability = ServiceObservability("controlplane")
        self.metrics = ControlPlaneMetrics.create(self.observability.registry)
        self.metrics.watch_streams.set_function(lambda: self.control.watch_slots.open)
        self.webhooks = WebhookSender(self._dead_letter, config.webhooks)
        self.notifier = RolloutNotifier(self.webhooks)
        self.sink = AuditSink(
            factory,
            self.store,
            self.hub,
            AuditSinkMetrics.create(self.observability.registry),
            on_audits=self.notifier.on_audits,
        )
        self._server: aio.Server | None = None
        self._stop = asyncio.Event()
        self._background = BackgroundTasks()
        self.port = 0
        self.verdicts: VerdictServer | None = None
        """The HTTP verdict endpoint, when configured; its ``port`` once started."""

    async def start(self) -> None:
        layout = self._factory.layout
        specs = [
            s
            for s in layout.shared_specs()
            if s.name in {layout.commands(), layout.audit(), layout.rollouts()}
        ]
        await self._factory.ensure_topics(specs)
        settings = self._factory.settings
        self.observability.start(
            settings.metrics_address(self._config.metrics_port), settings.build_labels()
        )
        await self._bus.start()
        server = aio.server(
            interceptors=[MetricsInterceptor(self.metrics), AuthInterceptor(self._config.tokens)]
        )
        check = (
            KafkaCandidateCheck(self._factory, self._factory.layout)
            if self._config.check_candidates
            else None
        )
        add_servicers(server, self.control, check)
        health = add_health(server)
        address = f"{self._config.host}:{self._config.port}"
        if self._config.tls_cert is not None and self._config.tls_key is not None:
            creds = ssl_server_credentials(
                [(self._config.tls_key.read_bytes(), self._config.tls_cert.read_bytes())]
            )
            self.port = server.add_secure_port(address, creds)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        # crash-only: a dead audit sink or outbox ends serve() with the reason
        self._background.spawn(self.sink.run(self._stop), name="cp-audit-sink")
        self._background.spawn(self._outbox(), name="cp-outbox")
        self._background.spawn(self._ready_when_caught_up(health), name="cp-ready")
        if self._config.http_port is not None:
            self.verdicts = VerdictServer(
                verdict_app(self.store, self._config.tokens),
                self._config.host,
                self._config.http_port,
                tls_cert=self._config.tls_cert,
                tls_key=self._config.tls_key,
            )
            self._background.spawn(self.verdicts.serve(self._stop), name="cp-verdicts")
            await self.verdicts.started.wait()
        log.info("control plane listening on %s (port %d)", address, self.port)

    async def _ready_when_caught_up(self, health: HealthServicer) -> None:
        """Ready (``/readyz``, gRPC health SERVING) once the audit sink holds its partitions."""
        stopping = asyncio.create_task(self._stop.wait())
        ready = asyncio.create_task(self.sink.ready.wait())
        await asyncio.wait({stopping, ready}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopping, ready):
            task.cancel()
        if self.sink.ready.is_set() and not self._stop.is_set():
            self.observability.mark(GROUP_JOINED)
            self.observability.mark(CONTROL_CAUGHT_UP)
            await set_serving(health, True)

    async def _outbox(self) -> None:
        """Resend commands the bus refused earlier, until stopped."""
        while not self._stop.is_set():
            try:
                sent = await self.control.resend_unsent()
                if sent:
                    log.info("resent %d stored command(s)", sent)
            except Exception as exc:  # the bus is down; try again later
                log.warning("outbox: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._config.outbox_interval_s)

    async def _dead_letter(self, delivery: WebhookDelivery, body: bytes, reason: str) -> None:
        letter = dead_letter_of(
            delivery.transition,
            delivery.target.url,
            body,
            reason,
            source_topic=self._factory.layout.audit(),
            at_ms=now_ms(),
        )
        await self._bus.dead_letter(letter)

    async def stop(self, grace_s: float = 1.0) -> None:
        self._stop.set()
        if self._server is not None:
            await self._server.stop(grace_s)
        await self._background.close()
        await self.webhooks.close()
        await self._bus.stop()
        self.store.engine.dispose()
        self.observability.close()

    async def serve(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await self._background.wait(stop)  # raises if a background task died
        finally:
            await self.stop()


log = logging.getLogger(__name__)


# -- gRPC health and request metrics -----------------------------------------------------------


class HealthServicer(Protocol):
    """The part of ``grpc_health``'s aio servicer we use."""

    async def set(self, service: str, status: int) -> None: ...


HEALTH_SERVICES = (
    "",  # the whole server
    "graylane.v1.ModelRegistry",
    "graylane.v1.Rollouts",
    "graylane.v1.Qos",
    "graylane.v1.Audit",
    "graylane.v1.Routing",
)


def add_health(server: aio.Server) -> HealthServicer:
    """The standard ``grpc.health.v1.Health`` service, NOT_SERVING until :func:`set_serving`."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    typed: HealthServicer = servicer
    return typed


async def set_serving(servicer: HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in HEALTH_SERVICES:
        await servicer.set(name, status)


def _code(context: aio.ServicerContext[Any, Any], failed: bool) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "UNKNOWN" if failed else "OK"


class MetricsInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Counts every call by method and status code and times it (outermost interceptor)."""

    def __init__(self, metrics: ControlPlaneMetrics) -> None:
        self._metrics = metrics

    def _done(self, method: str, code: str, started: float) -> None:
        self._metrics.rpcs.labels(method, code).inc()
        self._metrics.rpc_seconds.labels(method).observe(time.perf_counter() - started)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        deserializer, serializer = handler.request_deserializer, handler.response_serializer
        if handler.response_streaming:
            inner_stream = handler.unary_stream

            async def streaming(
                request: Any, context: aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                started, failed = time.perf_counter(), True
                try:
                    async for item in inner_stream(request, context):
                        yield item
                    failed = False
                finally:
                    self._done(method, _code(context, failed), started)

            return grpc.unary_stream_rpc_method_handler(streaming, deserializer, serializer)
        inner = handler.unary_unary

        async def unary(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            started, failed = time.perf_counter(), True
            try:
                response = await inner(request, context)
                failed = False
                return response
            finally:
                self._done(method, _code(context, failed), started)

        return grpc.unary_unary_rpc_method_handler(unary, deserializer, serializer)
