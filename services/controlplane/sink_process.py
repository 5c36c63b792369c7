"""``graylane audit-sink``: the audit sink alone (its own pod), with its own metrics port.

The control plane runs one too (it feeds Watch streams); both store each record once
(by ``decision_id``), so running both is safe.
"""

from __future__ import annotations

import asyncio
import contextlib

from graylane.kafka.seam import KafkaFactory
from graylane.metrics.controlside import AuditSinkMetrics
from graylane.metrics.process import CONTROL_CAUGHT_UP, GROUP_JOINED, ServiceObservability
from graylane.registry.migrate import create_db_engine, upgrade
from graylane.services.controlplane.audit_sink import AuditSink, RolloutHub
from graylane.services.controlplane.state import ControlStore

__all__ = ["serve_audit_sink"]


async def serve_audit_sink(
    factory: KafkaFactory, stop: asyncio.Event, metrics_port: int | None = None
) -> None:
    """Copy audit records and rollout states into SQL until ``stop``."""
    settings = factory.settings
    engine = create_db_engine(settings.db_url)
    upgrade(engine)
    observability = ServiceObservability("audit-sink")
    sink = AuditSink(
        factory,
        ControlStore(engine),
        RolloutHub(),
        AuditSinkMetrics.create(observability.registry),
    )
    observability.start(settings.metrics_address(metrics_port), settings.build_labels())
    task = asyncio.create_task(sink.run(stop), name="audit-sink")
    try:
        ready = asyncio.create_task(sink.ready.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if sink.ready.is_set():
            observability.mark(GROUP_JOINED)  # it reads without a group: its partitions
            observability.mark(CONTROL_CAUGHT_UP)
        await task
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await task
        observability.close()
        engine.dispose()
