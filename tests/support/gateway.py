"""A gateway replica served by uvicorn on a free port inside the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from graylane.kafka.seam import KafkaFactory
from graylane.services.gateway.logic.admission import GatewayLimits, KeyRing
from graylane.services.gateway.service import Gateway, GatewayConfig


@contextlib.asynccontextmanager
async def running_gateway(
    factory: KafkaFactory,
    *,
    keys: KeyRing | None,
    limits: GatewayLimits | None = None,
    signatures: Mapping[tuple[str, str], Path] | None = None,
    replica: str = "test",
) -> AsyncIterator[Gateway]:
    """Start a gateway on 127.0.0.1 (a free port); stop it on exit."""
    gateway = Gateway(
        factory,
        GatewayConfig(
            port=0,
            replica=replica,
            limits=limits or GatewayLimits(),
            signatures=dict(signatures or {}),
            metrics_port=-1,
        ),
        keys,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(gateway.run(stop))
    ready = asyncio.create_task(gateway.ready.wait())
    await asyncio.wait({task, ready}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        task.result()
        raise RuntimeError("the gateway stopped before it was ready")
    if not ready.done():
        ready.cancel()
        raise TimeoutError("the gateway was not ready within 60 s")
    try:
        yield gateway
    finally:
        stop.set()
        await task
