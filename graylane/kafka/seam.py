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
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.structs import OffsetAndMetadata, OffsetAndTimestamp, RecordMetadata

from graylane.kafka.options import ConsumerOptions, ProducerOptions
from graylane.settings import Settings
from graylane.topics import TopicLayout, TopicSpec

__all__ = [
    "BatchConsumer",
    "ClientFactory",
    "ClusterView",
    "Headers",
    "MetadataClient",
    "Producer",
    "Record",
    "known_topics",
]

Headers: TypeAlias = Sequence[tuple[str, bytes]]
Record: TypeAlias = ConsumerRecord[bytes, bytes]


class ClusterView(Protocol):
    """A snapshot of cluster metadata (aiokafka's ``ClusterMetadata``)."""

    def topics(self, exclude_internal_topics: bool = True) -> set[str]: ...


class MetadataClient(Protocol):
    """The producer's connection to the cluster, asked only for metadata."""

    async def fetch_all_metadata(self) -> ClusterView: ...


@runtime_checkable
class Producer(Protocol):
    """Sends records; ``send`` returns a future resolved when the broker acknowledges."""

    @property
    def client(self) -> MetadataClient: ...

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

    async def flush(self) -> None: ...


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

    def highwater(self, partition: TopicPartition) -> int | None:
        """The partition's end offset as of the last fetch (None before one)."""
        ...

    async def end_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]: ...

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]: ...

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]: ...

    async def committed(self, partition: TopicPartition) -> int | None: ...

    def partitions_for_topic(self, topic: str) -> set[int] | None: ...


@runtime_checkable
class ClientFactory(Protocol):
    """Builds the clients of one deployment (:class:`~graylane.kafka.factory.KafkaFactory`)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def layout(self) -> TopicLayout: ...

    def producer(
        self, options: ProducerOptions | None = None, *, client_suffix: str = "producer"
    ) -> Producer: ...

    def consumer(
        self,
        *topics: str,
        options: ConsumerOptions | None = None,
        client_suffix: str = "consumer",
    ) -> BatchConsumer: ...

    async def ensure_topics(self, specs: Sequence[TopicSpec]) -> object:
        """Create missing topics and bring existing ones to their configs (idempotent)."""
        ...


async def known_topics(producer: Producer) -> set[str]:
    """Every topic the cluster knows now (a metadata request on the producer's connection).

    aiokafka reports "no broker answered" as a bare ``KafkaError``; it is raised here as
    ``KafkaConnectionError`` so callers treat it as the outage it is (retry, not crash).
    """
    try:
        cluster = await producer.client.fetch_all_metadata()
    except KafkaError as exc:
        if type(exc) is not KafkaError:
            raise
        raise KafkaConnectionError(f"cluster metadata unavailable: {exc}") from exc
    return set(cluster.topics())
