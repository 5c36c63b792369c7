"""An ASGI app served on one listening socket until a stop event: the HTTP edges' one loop.

The gateway and the control plane's verdict endpoint both serve a FastAPI app inside a
service that already owns its signals and its stop event. This module holds what they
share: the listening socket (bound before serving, so ``port=0`` yields a free port the
caller can read at once) and uvicorn run without its own signal handling, started, then
told to exit when ``stop`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

log = logging.getLogger(__name__)


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the service's stop event ends it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 = a free port), inheritable, with TCP_NODELAY.

    ``IPPROTO_TCP`` is named: asyncio sets TCP_NODELAY only on sockets that say they are
    TCP, and an accepted socket inherits the listener's; without it every answer written
    in two parts waits out the peer's delayed ACK (about 40 ms).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class TlsFiles:
    """PEM files a server presents; both or neither."""

    cert: Path
    key: Path


async def serve_asgi(
    app: Any,
    sock: socket.socket,
    stop: asyncio.Event,
    *,
    name: str,
    on_started: Callable[[], None],
    tls: TlsFiles | None = None,
    graceful_shutdown_s: int | None = None,
) -> None:
    """Serve ``app`` on ``sock`` until ``stop`` is set; ``on_started`` once it accepts calls.

    Raises why the server could not start (before ``on_started``); closes ``sock`` at the
    end whatever happened.
    """
    server = _QuietServer(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=graceful_shutdown_s,
            ssl_certfile=str(tls.cert) if tls else None,
            ssl_keyfile=str(tls.key) if tls else None,
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]), name=name)
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if serving.done():
            serving.result()  # raises why it could not start
        on_started()
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await serving
        sock.close()
