"""Following a single-partition compacted control topic: catch up, then tail it.

The router (routing tables) and the workers (precision commands) both need the
latest value per key before they serve, and every later update while they run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from graylane.kafka.factory import ConsumerOptions, KafkaFactory

RecordHandler = Callable[[ConsumerRecord[bytes, bytes]], None]


class CompactedFollower:
    """Applies every record of ``topic`` (partition 0) to ``handle``, in order."""

    def __init__(
        self, factory: KafkaFactory, topic: str, handle: RecordHandler, *, client_suffix: str
    ) -> None:
        self._factory = factory
        self._tp = TopicPartition(topic, 0)
        self._handle = handle
        self._suffix = client_suffix
        self._consumer: AIOKafkaConsumer | None = None

    async def catch_up(self) -> None:
        """Start, and apply everything up to the topic's current end."""
        consumer = self._factory.consumer(
            options=ConsumerOptions(group_id=None, fetch_max_wait_ms=100),
            client_suffix=self._suffix,
        )
        await consumer.start()
        consumer.assign([self._tp])
        await consumer.seek_to_beginning(self._tp)
        end = (await consumer.end_offsets([self._tp]))[self._tp]
        self._consumer = consumer
        while await consumer.position(self._tp) < end:
            self._apply(await consumer.getmany(self._tp, timeout_ms=500))

    async def follow(self, stop: asyncio.Event) -> None:
        """Apply new records until ``stop`` is set (call after :meth:`catch_up`)."""
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("catch_up() must run before follow()")
        while not stop.is_set():
            self._apply(await consumer.getmany(timeout_ms=200))

    def _apply(self, batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        for records in batches.values():
            for record in records:
                self._handle(record)

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
