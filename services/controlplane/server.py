"""The control-plane process: gRPC server, audit sink and command outbox.

Configuration is read once (:meth:`ServerConfig.from_env` plus CLI flags): port,
optional server TLS from PEM files, and the bearer tokens
(``GRAYLANE_CP_TOKENS="<token>:operator,<token>:read_only"`` and/or a file of
such entries, one per line). It refuses weak tokens and a plaintext bind beyond
loopback (see :mod:`graylane.services.controlplane.limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from grpc import aio, ssl_server_credentials

from graylane.kafka.seam import KafkaFactory
from graylane.metrics import (
    CONTROL_CAUGHT_UP,
    GROUP_JOINED,
    AuditSinkMetrics,
    ControlPlaneMetrics,
    ServiceObservability,
)
from graylane.registry import Registry
from graylane.registry.migrate import create_db_engine, upgrade
from graylane.services.controlplane.audit_sink import AuditSink, RolloutHub
from graylane.services.controlplane.auth import AuthInterceptor, TokenTable
from graylane.services.controlplane.bus import KafkaCommandBus
from graylane.services.controlplane.candidates import KafkaCandidateCheck
from graylane.services.controlplane.limits import ApiLimits, check_startup
from graylane.services.controlplane.observe import (
    HealthServicer,
    MetricsInterceptor,
    add_health,
    set_serving,
)
from graylane.services.controlplane.servicers import ControlPlane, add_servicers
from graylane.services.controlplane.store import ControlStore
from graylane.supervision import BackgroundTasks

__all__ = ["ControlPlaneServer", "ServerConfig"]

log = logging.getLogger(__name__)


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
        )
        # A promotion the sink records makes the candidate the registry's stable version.
        self.store.on_promoted(self.control.record_promotion)
        self.observability = ServiceObservability("controlplane")
        self.metrics = ControlPlaneMetrics.create(self.observability.registry)
        self.metrics.watch_streams.set_function(lambda: self.control.watch_slots.open)
        self.sink = AuditSink(
            factory, self.store, self.hub, AuditSinkMetrics.create(self.observability.registry)
        )
        self._server: aio.Server | None = None
        self._stop = asyncio.Event()
        self._background = BackgroundTasks()
        self.port = 0

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
            KafkaCandidateCheck(
                self._factory, self._factory.layout, self._factory.settings.topic_prefix
            )
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

    async def stop(self, grace_s: float = 1.0) -> None:
        self._stop.set()
        if self._server is not None:
            await self._server.stop(grace_s)
        await self._background.close()
        await self._bus.stop()
        self.store.engine.dispose()
        self.observability.close()

    async def serve(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await self._background.wait(stop)  # raises if a background task died
        finally:
            await self.stop()
