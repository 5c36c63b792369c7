"""Following a single-partition compacted control topic: catch up, then tail it.

The router (routing tables) and the workers (precision commands) both need the
latest value per key before they serve, and every later update while they run.
"""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from graylane.kafka.options import ConsumerOptions
from graylane.kafka.reading import RecordHandler, drain_to_end, pump
from graylane.kafka.seam import BatchConsumer, ClientFactory

__all__ = ["CompactedFollower", "RecordHandler"]


class CompactedFollower:
    """Applies every record of ``topic`` (partition 0) to ``handle``, in order."""

    def __init__(
        self, factory: ClientFactory, topic: str, handle: RecordHandler, *, client_suffix: str
    ) -> None:
        self._factory = factory
        self._tp = TopicPartition(topic, 0)
        self._handle = handle
        self._suffix = client_suffix
        self._consumer: BatchConsumer | None = None

    async def catch_up(self) -> None:
        """Start, and apply everything up to the topic's current end."""
        consumer = self._factory.consumer(
            options=ConsumerOptions(group_id=None, fetch_max_wait_ms=100),
            client_suffix=self._suffix,
        )
        await consumer.start()
        consumer.assign([self._tp])
        self._consumer = consumer
        await drain_to_end(consumer, [self._tp], self._handle, timeout_s=None)

    async def follow(self, stop: asyncio.Event) -> None:
        """Apply new records until ``stop`` is set (call after :meth:`catch_up`)."""
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("catch_up() must run before follow()")
        await pump(consumer, self._handle, stop)

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
