"""The Kafka seam: the few client operations Graylane's services use, as ``Protocol``s.

Services are written against these, never against aiokafka classes, so a test
can put an in-memory double behind them (``tests/support/memory_kafka.py``) and
the broker tests exercise the real clients (:class:`~aiokafka.AIOKafkaProducer`
and :class:`~aiokafka.AIOKafkaConsumer` satisfy them structurally).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.structs import OffsetAndMetadata, RecordMetadata

__all__ = ["BatchConsumer", "Headers", "Producer", "Record"]

Headers: TypeAlias = Sequence[tuple[str, bytes]]
Record: TypeAlias = ConsumerRecord[bytes, bytes]


@runtime_checkable
class Producer(Protocol):
    """Sends records; ``send`` returns a future resolved when the broker acknowledges."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> asyncio.Future[RecordMetadata]: ...

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> RecordMetadata: ...


@runtime_checkable
class BatchConsumer(Protocol):
    """Fetches batches of records and commits offsets explicitly."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def subscribe(self, topics: Iterable[str], listener: Any = None) -> None: ...

    def assign(self, partitions: Iterable[TopicPartition]) -> None: ...

    def assignment(self) -> set[TopicPartition]: ...

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]: ...

    async def commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None
    ) -> None: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...

    async def seek_to_beginning(self, *partitions: TopicPartition) -> bool: ...

    async def seek_to_end(self, *partitions: TopicPartition) -> bool: ...

    async def position(self, partition: TopicPartition) -> int: ...

    async def end_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]: ...

    def partitions_for_topic(self, topic: str) -> set[int] | None: ...
