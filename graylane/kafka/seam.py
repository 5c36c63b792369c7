"""The Kafka seam: the few client operations Graylane's services use, and their factory.

Services are written against the ``Protocol``s here, never against aiokafka classes,
so a test can put an in-memory double behind them (``tests/support/memory_kafka.py``)
and the broker tests exercise the real clients (:class:`~aiokafka.AIOKafkaProducer`
and :class:`~aiokafka.AIOKafkaConsumer` satisfy them structurally).

Consumers built here read every fetched batch through :class:`TolerantRecords`: a
record whose header key is not UTF-8 (aiokafka decodes header keys strictly, inside
``getmany``) reaches its service with the key's raw bytes kept (``surrogateescape``),
and :func:`header_damage` says which records carry one, so the consume loop can
dead-letter exactly those instead of failing every fetch of the partition.

What a service asks of a client is said broker-agnostically (:class:`ProducerOptions`,
:class:`ConsumerOptions`); :class:`KafkaFactory` turns that and one
:class:`~graylane.settings.Settings` into real clients. Services receive a factory
(never a module-level client), typed as :class:`ClientFactory`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, TypeAlias, runtime_checkable

import aiokafka.consumer.fetcher
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CorruptRecordException, KafkaConnectionError, KafkaError
from aiokafka.record.default_records import DefaultRecordBatch, _DefaultRecordBatchPy
from aiokafka.record.memory_records import _MemoryRecordsPy
from aiokafka.record.util import decode_varint
from aiokafka.structs import OffsetAndMetadata, OffsetAndTimestamp, RecordMetadata

from graylane.kafka.admin import TopicSetupReport, ensure_topics
from graylane.kafka.recovering import RecoveringProducer
from graylane.settings import Settings
from graylane.topics import TopicLayout, TopicSpec

__all__ = [
    "BatchConsumer",
    "ClientFactory",
    "ClusterView",
    "ConsumerOptions",
    "Headers",
    "Isolation",
    "KafkaFactory",
    "MetadataClient",
    "OffsetReset",
    "Producer",
    "ProducerOptions",
    "Record",
    "TolerantRecords",
    "header_damage",
    "known_topics",
    "readable",
]

Headers: TypeAlias = Sequence[tuple[str, bytes]]
Record: TypeAlias = ConsumerRecord[bytes, bytes]


# -- what a service asks of a client ---------------------------------------------


class OffsetReset(Enum):
    EARLIEST = "earliest"
    LATEST = "latest"


class Isolation(Enum):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


@dataclass(frozen=True, kw_only=True)
class ProducerOptions:
    """Producer tuning; idempotent with acks=all by default."""

    idempotent: bool = True
    linger_ms: int = 2
    max_batch_size: int = 256 * 1024
    compression: str | None = None
    transactional_id: str | None = None
    request_timeout_ms: int = 30_000


@dataclass(frozen=True, kw_only=True)
class ConsumerOptions:
    """Consumer tuning; offsets are always committed explicitly by the caller."""

    group_id: str | None = None
    offset_reset: OffsetReset = OffsetReset.EARLIEST
    max_poll_records: int = 500
    fetch_max_wait_ms: int = 50
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    """A member learns of a rebalance (a replica joining or leaving) at its next
    heartbeat, and the partitions that change hands wait for it: 1 s (not Kafka's
    3 s) keeps a scale change's pause near a second."""
    max_poll_interval_ms: int = 300_000
    isolation: Isolation = Isolation.READ_UNCOMMITTED
    rebalance_timeout_ms: int | None = None
    group_instance_id: str | None = None
    """Static membership (see :func:`graylane.kafka.membership.claim_instance`); None = dynamic."""


# -- the clients -------------------------------------------------------------------


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
    """Builds the clients of one deployment (:class:`KafkaFactory`, or a test double)."""

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


# -- record-level damage -------------------------------------------------------------


def header_damage(record: Record) -> str | None:
    """Why ``record``'s headers cannot be read as Kafka defines them (None: they can)."""
    for key, _ in record.headers or ():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            return "a header key is not valid UTF-8"
    return None


def readable(record: Record) -> Record:
    """``record`` with every header key valid UTF-8 (undecodable bytes replaced), for a
    dead letter or a log line; the record itself when nothing needs replacing."""
    if header_damage(record) is None:
        return record
    headers = tuple(
        (k.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), v)
        for k, v in record.headers
    )
    return dataclasses.replace(record, headers=headers)


class _TolerantBatchReader(_DefaultRecordBatchPy):  # type: ignore[misc]
    """aiokafka's pure-Python batch reader, with header keys decoded ``surrogateescape``."""

    def _read_msg(self, decode_varint: Any = decode_varint) -> Any:
        buffer: bytearray = self._buffer
        pos: int = self._pos  # type: ignore[has-type]
        length, pos = decode_varint(buffer, pos)
        start = pos
        _, pos = decode_varint(buffer, pos)  # attributes
        ts_delta, pos = decode_varint(buffer, pos)
        timestamp = (
            self.max_timestamp
            if self.timestamp_type == self.LOG_APPEND_TIME
            else self.first_timestamp + ts_delta
        )
        offset_delta, pos = decode_varint(buffer, pos)
        key, pos = _nullable_bytes(buffer, pos)
        value, pos = _nullable_bytes(buffer, pos)
        count, pos = decode_varint(buffer, pos)
        if count < 0:
            raise CorruptRecordException(f"invalid number of record headers {count}")
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(count):
            key_len, pos = decode_varint(buffer, pos)
            if key_len < 0:
                raise CorruptRecordException(f"invalid negative header key size {key_len}")
            h_key = bytes(buffer[pos : pos + key_len]).decode("utf-8", "surrogateescape")
            h_value, pos = _nullable_bytes(buffer, pos + key_len)
            headers.append((h_key, h_value))
        if pos - start != length:
            raise CorruptRecordException(f"record of {length} bytes read as {pos - start}")
        self._pos = pos
        return _Decoded(
            self.base_offset + offset_delta, timestamp, self.timestamp_type, key, value, headers
        )


@dataclass(frozen=True)
class _Decoded:
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    checksum: None = None


def _nullable_bytes(buffer: bytearray, pos: int) -> tuple[bytes | None, int]:
    size, pos = decode_varint(buffer, pos)
    if size < 0:
        return None, pos
    return bytes(buffer[pos : pos + size]), pos + size


class _TolerantBatch:
    """One v2 record batch: read by aiokafka's compiled reader; read again by
    :class:`_TolerantBatchReader` from the first record that reader refused for a
    header key (the records already read are not repeated)."""

    def __init__(self, batch: Any, view: memoryview) -> None:
        self._view = view
        self._batch = batch
        self._records: Iterator[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> _TolerantBatch:
        return self

    def __next__(self) -> Any:
        if self._records is None:
            self._records = self._read()
        return next(self._records)

    def _read(self) -> Iterator[Any]:
        last = -1
        try:
            for record in self._batch:
                last = record.offset
                yield record
        except (UnicodeDecodeError, CorruptRecordException):
            for record in _TolerantBatchReader(self._view):
                if record.offset > last:
                    yield record


class TolerantRecords(_MemoryRecordsPy):  # type: ignore[misc]
    """A fetched message set whose v2 batches are read by :class:`_TolerantBatch`."""

    def next_batch(self, *args: Any, **kwargs: Any) -> Any:
        view: memoryview | None = self._next_slice
        batch = super().next_batch(*args, **kwargs)
        if view is None or not isinstance(batch, DefaultRecordBatch) or batch.is_control_batch:
            return batch
        return _TolerantBatch(batch, view)


def tolerate_header_damage() -> None:
    """Make every aiokafka consumer of this process read fetches through
    :class:`TolerantRecords` (aiokafka has no option for it; idempotent)."""
    aiokafka.consumer.fetcher.MemoryRecords = TolerantRecords


# -- the real clients ---------------------------------------------------------------


@dataclass(frozen=True)
class KafkaFactory:
    """Builds producers, consumers and admin clients from one :class:`Settings`."""

    settings: Settings
    layout: TopicLayout = field(init=False)

    def __post_init__(self) -> None:
        # Every consumer of the process, faust's included, reads header keys tolerantly.
        tolerate_header_damage()
        s = self.settings
        object.__setattr__(
            self,
            "layout",
            TopicLayout(
                prefix=s.topic_prefix,
                partitions=s.partitions,
                replication_factor=s.replication_factor,
                data_retention_ms=s.data_retention_ms,
                audit_retention_ms=s.audit_retention_ms,
                max_message_bytes=s.max_message_bytes,
            ),
        )

    def _common(self, client_suffix: str) -> dict[str, object]:
        s = self.settings
        options: dict[str, object] = {
            "bootstrap_servers": s.bootstrap_servers,
            "client_id": f"{s.client_id}-{client_suffix}" if client_suffix else s.client_id,
        }
        options.update(s.security.client_options())
        return options

    def producer(
        self, options: ProducerOptions | None = None, *, client_suffix: str = "producer"
    ) -> Producer:
        o = options or ProducerOptions()
        kwargs = self._common(client_suffix)
        kwargs.update(
            acks="all",
            enable_idempotence=o.idempotent or o.transactional_id is not None,
            linger_ms=o.linger_ms,
            max_batch_size=o.max_batch_size,
            max_request_size=self.settings.max_message_bytes,
            request_timeout_ms=o.request_timeout_ms,
        )
        if o.compression:
            kwargs["compression_type"] = o.compression
        if o.transactional_id:
            kwargs["transactional_id"] = o.transactional_id
            transactional: Producer = AIOKafkaProducer(**kwargs)
            return transactional
        # Rebuilt with a new producer id after a fatal error (a long outage's sequence gap).
        # A record the broker has not acknowledged within two request timeouts (plus the
        # linger) is given up on that producer: an in-flight request on a connection that
        # died with the broker can otherwise wait for ever.
        return RecoveringProducer(
            lambda: AIOKafkaProducer(**kwargs),
            start_timeout_s=o.request_timeout_ms / 1000,
            delivery_timeout_s=2 * o.request_timeout_ms / 1000 + o.linger_ms / 1000 + 1.0,
        )

    def consumer(
        self,
        *topics: str,
        options: ConsumerOptions | None = None,
        client_suffix: str = "consumer",
    ) -> BatchConsumer:
        o = options or ConsumerOptions()
        kwargs = self._common(client_suffix)
        kwargs.update(
            group_id=o.group_id,
            enable_auto_commit=False,
            auto_offset_reset=o.offset_reset.value,
            max_poll_records=o.max_poll_records,
            fetch_max_wait_ms=o.fetch_max_wait_ms,
            session_timeout_ms=o.session_timeout_ms,
            heartbeat_interval_ms=o.heartbeat_interval_ms,
            max_poll_interval_ms=o.max_poll_interval_ms,
            isolation_level=o.isolation.value,
            max_partition_fetch_bytes=self.settings.max_message_bytes,
        )
        if o.rebalance_timeout_ms is not None:
            kwargs["rebalance_timeout_ms"] = o.rebalance_timeout_ms
        if o.group_instance_id and o.group_id:
            kwargs["group_instance_id"] = o.group_instance_id
        tolerate_header_damage()
        consumer: BatchConsumer = AIOKafkaConsumer(*topics, **kwargs)
        return consumer

    def admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self._common("admin"))

    async def ensure_topics(self, specs: Sequence[TopicSpec]) -> TopicSetupReport:
        """Create or reconfigure ``specs`` (see :func:`graylane.kafka.admin.ensure_topics`)."""
        return await ensure_topics(self, specs)
