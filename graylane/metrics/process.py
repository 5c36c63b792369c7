"""One observability set-up per service process: registry, build info, readiness, and one
HTTP port serving ``/metrics``, ``/healthz`` (alive) and ``/readyz`` (ready).

Alive means every service loop of the process still makes progress: each loop beats a
:class:`LoopHeartbeats` entry once per turn (see :func:`loop_heartbeat`), and
``/healthz`` answers 503 once one has not beaten for ``GRAYLANE_HEALTHZ_STALE_S``
seconds (default 120: longer than a send can wait on the broker). A loop counts from
its first beat until it ends; a process with no loop running is alive."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from graylane.metrics.units import build_info

__all__ = [
    "CONTROL_CAUGHT_UP",
    "ENGINE_UP",
    "GROUP_JOINED",
    "BuildLabels",
    "LoopHeartbeats",
    "MetricsAddress",
    "ObservabilityServer",
    "Readiness",
    "ServiceObservability",
    "loop_heartbeat",
    "process_heartbeats",
    "serve_observability",
]


log = logging.getLogger(__name__)

GROUP_JOINED = "group_joined"
"""The service's consumer has partitions assigned."""
CONTROL_CAUGHT_UP = "control_caught_up"
"""The service has read its control topics (routing, precision, rollouts) to their end."""
ENGINE_UP = "engine_up"
"""An engine-server worker: the engine server of its active variant answers."""


DEFAULT_STALE_S = 120.0


class LoopHeartbeats:
    """When each running loop of the process last made progress (one turn)."""

    def __init__(
        self, stale_after_s: float = DEFAULT_STALE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if stale_after_s <= 0:
            raise ValueError("the staleness bound must be positive")
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._last: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._next = 0

    @classmethod
    def from_env(cls) -> LoopHeartbeats:
        raw = os.environ.get("GRAYLANE_HEALTHZ_STALE_S", "")
        try:
            return cls(float(raw) if raw else DEFAULT_STALE_S)
        except ValueError:
            raise ValueError(f"GRAYLANE_HEALTHZ_STALE_S={raw!r} is not a positive number") from None

    @contextlib.contextmanager
    def loop(self, name: str) -> Iterator[Callable[[], None]]:
        """Register loop ``name`` for its lifetime; yields the beat to call once per turn."""
        with self._lock:
            key, self._next = self._next, self._next + 1

        def beat() -> None:
            with self._lock:
                self._last[key] = (name, self.clock())

        try:
            yield beat
        finally:
            with self._lock:
                self._last.pop(key, None)

    def stalled(self) -> list[tuple[str, float]]:
        """The loops that have not beaten within the bound, with their silence in seconds."""
        now = self.clock()
        with self._lock:
            beats = list(self._last.values())
        return [(n, now - at) for n, at in beats if now - at > self.stale_after_s]

    def __call__(self) -> bool:
        return not self.stalled()


@functools.cache
def process_heartbeats() -> LoopHeartbeats:
    """The heartbeats ``/healthz`` of this process reads (configured from the environment)."""
    return LoopHeartbeats.from_env()


def loop_heartbeat(name: str) -> contextlib.AbstractContextManager[Callable[[], None]]:
    """Register a service loop with this process's ``/healthz`` (see :class:`LoopHeartbeats`)."""
    return process_heartbeats().loop(name)


@dataclass(frozen=True, kw_only=True)
class BuildLabels:
    """What ``graylane_build_info`` and every log line say about the running build."""

    version: str = "unknown"
    git_sha: str = "unknown"
    build_time: str = "unknown"


@dataclass
class ServiceObservability:
    """The registry a service's metrics live in, and the port that serves them once started."""

    service: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    readiness: Readiness = field(
        default_factory=lambda: Readiness((GROUP_JOINED, CONTROL_CAUGHT_UP))
    )
    heartbeats: LoopHeartbeats = field(default_factory=process_heartbeats)
    server: ObservabilityServer | None = None

    def start(self, address: MetricsAddress | None, build: BuildLabels) -> int:
        """Export build info and serve; the bound port (0 when ``address`` is None = off)."""
        if self.server is not None:
            return self.server.port
        build_info(
            self.registry,
            service=self.service,
            version=build.version,
            git_sha=build.git_sha,
            build_time=build.build_time,
        )
        if address is None:
            return 0
        self.server = serve_observability(
            self.registry, address, self.readiness, alive=self.heartbeats
        )
        log.info(
            "%s metrics on http://%s:%d/metrics (/healthz, /readyz)",
            self.service,
            address.host,
            self.server.port,
        )
        return self.server.port

    @property
    def port(self) -> int:
        return 0 if self.server is None else self.server.port

    def mark(self, condition: str, met: bool = True) -> None:
        self.readiness.mark(condition, met)

    def note_assignment(self, assigned: Collection[object]) -> None:
        """Ready on ``group_joined`` while the consumer holds partitions."""
        self.readiness.mark(GROUP_JOINED, bool(assigned))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


# -- the HTTP port ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MetricsAddress:
    """Where to listen; ``host="0.0.0.0"`` in containers, ``port=0`` picks a free port."""

    host: str = "127.0.0.1"
    port: int = 9100

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"metrics port {self.port} is out of range")


@dataclass
class Readiness:
    """Named start-up conditions (``group_joined``, ``control_caught_up``); ready when all hold."""

    required: tuple[str, ...]
    _met: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if len(set(self.required)) != len(self.required):
            raise ValueError(f"readiness conditions repeat: {self.required}")

    def mark(self, condition: str, met: bool = True) -> None:
        if condition not in self.required:
            raise KeyError(f"unknown readiness condition {condition!r}")
        with self._lock:
            if met:
                self._met.add(condition)
            else:
                self._met.discard(condition)

    def missing(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(c for c in self.required if c not in self._met)

    def __call__(self) -> bool:
        return not self.missing()


@dataclass
class ObservabilityServer:
    """A running server; ``port`` is the bound one, ``close()`` stops it."""

    httpd: ThreadingHTTPServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def _handler(
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    why_not: Callable[[], Iterable[str]],
    alive: LoopHeartbeats | None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                stalled = alive.stalled() if alive is not None else []
                if stalled:
                    quiet = ", ".join(f"{n} (no progress for {s:.0f} s)" for n, s in stalled)
                    self._send(503, f"stalled: {quiet}\n".encode())
                else:
                    self._send(200, b"ok\n")
            elif path == "/readyz":
                if ready():
                    self._send(200, b"ready\n")
                else:
                    body = "not ready: " + ", ".join(why_not()) + "\n"
                    self._send(503, body.encode())
            else:
                self._send(404, b"not found\n")

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
            return

    return Handler


def serve_observability(
    registry: CollectorRegistry,
    address: MetricsAddress,
    ready: Callable[[], bool] = lambda: True,
    *,
    alive: LoopHeartbeats | None = None,
) -> ObservabilityServer:
    """Serve in a daemon thread; a :class:`Readiness` passed as ``ready`` explains a 503;
    ``/healthz`` fails while a loop of ``alive`` is stalled (None: always alive)."""
    why_not: Callable[[], Iterable[str]] = (
        ready.missing if isinstance(ready, Readiness) else lambda: ("readiness check failed",)
    )
    httpd = ThreadingHTTPServer(
        (address.host, address.port), _handler(registry, ready, why_not, alive)
    )
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return ObservabilityServer(httpd, thread)
