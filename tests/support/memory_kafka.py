"""An in-memory Kafka behind the seam protocols (``graylane.kafka.seam``), for unit tests.

One module (about 600 lines) on purpose: broker, producer and consumer share the
broker's partition logs and group offsets, and tests copy it as one piece.

    broker = MemoryBroker()
    factory = MemoryFactory(broker, Settings())   # a ClientFactory
    producer = factory.producer()                 # a Producer
    consumer = factory.consumer("t", options=ConsumerOptions(group_id="g"))  # a BatchConsumer

What it models: topics with N partitions; offsets, keys, headers and timestamps;
partitioning by key hash (aiokafka's murmur2 partitioner; round robin without a key);
sends acknowledged at once (``send`` returns an already-resolved future, unless
:meth:`MemoryBroker.hold_acks` keeps them in flight); consumers
that subscribe (partitions shared by range among the started members of a group) or
assign; committed offsets per group; ``getmany`` that waits up to ``timeout_ms`` for
new records. What it does not: replication, compaction, transactions, rebalance
listeners, real time (it never sleeps beyond ``timeout_ms``).

Failure injection: :meth:`MemoryBroker.fail_next_sends` makes the next sends'
futures fail with a given error (the record is not written), as a broker would;
:meth:`MemoryBroker.hold_acks` / :meth:`~MemoryBroker.release_acks` keep sends in
flight, to check that nothing is committed before its sends are acknowledged.
Offset-commit *protocol* behaviour stays tested against a real broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalOperation, IllegalStateError, UnknownTopicOrPartitionError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import OffsetAndMetadata, OffsetAndTimestamp, RecordMetadata

from graylane.kafka.admin import TopicSetupReport
from graylane.kafka.seam import ConsumerOptions, Headers, OffsetReset, ProducerOptions, Record
from graylane.settings import Settings
from graylane.topics import TopicLayout, TopicSpec

__all__ = [
    "MemoryBroker",
    "MemoryCluster",
    "MemoryConsumer",
    "MemoryFactory",
    "MemoryProducer",
]

CREATE_TIME = 0


def _wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Partition:
    records: list[Record] = field(default_factory=list)


class MemoryBroker:
    """Topics, partitions, records and committed offsets, in this process."""

    def __init__(
        self,
        *,
        default_partitions: int = 1,
        auto_create_topics: bool = False,
        clock_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.default_partitions = default_partitions
        self.auto_create_topics = auto_create_topics
        self.clock_ms = clock_ms
        self._topics: dict[str, list[_Partition]] = {}
        self._committed: dict[tuple[str, TopicPartition], int] = {}
        self._groups: dict[str, list[MemoryConsumer]] = {}
        self._send_failures: list[BaseException] = []
        self._in_flight: list[tuple[asyncio.Future[RecordMetadata], Callable[[], RecordMetadata]]]
        self._in_flight = []
        self._holding = False
        self._round_robin = itertools.count()
        self._partitioner = DefaultPartitioner()
        self._changed: asyncio.Event | None = None

    # -- topics ----------------------------------------------------------------
    def create_topic(self, name: str, partitions: int | None = None) -> bool:
        """Create ``name`` unless it exists; True when it was created."""
        if name in self._topics:
            return False
        count = partitions if partitions is not None else self.default_partitions
        if count < 1:
            raise ValueError(f"a topic needs at least one partition, got {count}")
        self._topics[name] = [_Partition() for _ in range(count)]
        self._notify()
        return True

    def topics(self) -> set[str]:
        return set(self._topics)

    def partitions(self, topic: str) -> set[int] | None:
        parts = self._topics.get(topic)
        return None if parts is None else set(range(len(parts)))

    def _partition(self, tp: TopicPartition) -> _Partition:
        parts = self._topics.get(tp.topic)
        if parts is None or not 0 <= tp.partition < len(parts):
            raise UnknownTopicOrPartitionError(f"{tp.topic}[{tp.partition}]")
        partition: _Partition = parts[tp.partition]
        return partition

    def records(self, topic: str, partition: int | None = None) -> list[Record]:
        """Every record of a topic (one partition, or all in partition order)."""
        parts = range(len(self._topics[topic])) if partition is None else [partition]
        return [r for p in parts for r in self._partition(TopicPartition(topic, p)).records]

    def values(self, topic: str) -> list[bytes | None]:
        return [r.value for r in self.records(topic)]

    def end_offset(self, tp: TopicPartition) -> int:
        return len(self._partition(tp).records)

    # -- writing ---------------------------------------------------------------
    def fail_next_sends(self, *errors: BaseException) -> None:
        """The next ``len(errors)`` sends fail with these errors, in order."""
        self._send_failures.extend(errors)

    def take_send_failure(self) -> BaseException | None:
        return self._send_failures.pop(0) if self._send_failures else None

    @property
    def pending_send_failures(self) -> int:
        return len(self._send_failures)

    @property
    def sends_in_flight(self) -> int:
        return len(self._in_flight)

    def hold_acks(self) -> None:
        """Keep later sends in flight (unwritten, their futures pending) until released."""
        self._holding = True

    def release_acks(self) -> int:
        """Write every send held in flight, in order, and resolve its future."""
        self._holding = False
        held, self._in_flight = self._in_flight, []
        for future, write in held:
            if future.done():
                continue
            try:
                future.set_result(write())
            except Exception as exc:  # e.g. the topic is gone: the send fails
                future.set_exception(exc)
        return len(held)

    def _ack(
        self, future: asyncio.Future[RecordMetadata], write: Callable[[], RecordMetadata]
    ) -> None:
        if self._holding:
            self._in_flight.append((future, write))
        else:
            future.set_result(write())

    def append(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> RecordMetadata:
        """Write one record and return its metadata, as the broker's acknowledgement."""
        if topic not in self._topics:
            if not self.auto_create_topics:
                raise UnknownTopicOrPartitionError(topic)
            self.create_topic(topic)
        count = len(self._topics[topic])
        if partition is None:
            if key is None:
                partition = next(self._round_robin) % count
            else:
                all_partitions = list(range(count))
                partition = self._partitioner(key, all_partitions, all_partitions)
        tp = TopicPartition(topic, partition)
        log = self._partition(tp).records
        timestamp = timestamp_ms if timestamp_ms is not None else self.clock_ms()
        log.append(
            ConsumerRecord(
                topic=topic,
                partition=partition,
                offset=len(log),
                timestamp=timestamp,
                timestamp_type=CREATE_TIME,
                key=key,
                value=value,
                checksum=None,
                serialized_key_size=len(key) if key is not None else -1,
                serialized_value_size=len(value) if value is not None else -1,
                headers=tuple(headers or ()),
            )
        )
        self._notify()
        return RecordMetadata(topic, partition, tp, len(log) - 1, timestamp, CREATE_TIME, 0)

    # -- groups ----------------------------------------------------------------
    def committed(self, group_id: str, tp: TopicPartition) -> int | None:
        return self._committed.get((group_id, tp))

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            self._partition(tp)
            self._committed[(group_id, tp)] = offset

    def _join(self, group_id: str, member: MemoryConsumer) -> None:
        self._groups.setdefault(group_id, []).append(member)
        self._notify()

    def _leave(self, group_id: str, member: MemoryConsumer) -> None:
        members = self._groups.get(group_id, [])
        if member in members:
            members.remove(member)
        self._notify()

    def group_share(
        self, group_id: str, member: MemoryConsumer, topics: set[str]
    ) -> tuple[int, int] | None:
        """(this member's index, the member count) among the group's members on ``topics``."""
        members = [m for m in self._groups.get(group_id, []) if m.subscription() == topics]
        if member not in members:
            return None
        return members.index(member), len(members)

    # -- waiting ---------------------------------------------------------------
    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_for_change(self, timeout_s: float) -> None:
        """Return when anything is written or created, or after ``timeout_s``."""
        if timeout_s <= 0:
            await asyncio.sleep(0)
            return
        if self._changed is None:
            self._changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)


@dataclass(frozen=True)
class MemoryCluster:
    """A metadata snapshot (the seam's ``ClusterView``)."""

    names: frozenset[str]

    def topics(self, exclude_internal_topics: bool = True) -> set[str]:
        return set(self.names)


class _MetadataClient:
    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker

    async def fetch_all_metadata(self) -> MemoryCluster:
        return MemoryCluster(frozenset(self._broker.topics()))


class MemoryProducer:
    """The seam's ``Producer``: every send is acknowledged at once (or fails, if injected)."""

    def __init__(self, broker: MemoryBroker, *, client_id: str = "producer") -> None:
        self.broker = broker
        self.client_id = client_id
        self._client = _MetadataClient(broker)
        self.started = False
        self.stopped = False

    @property
    def client(self) -> _MetadataClient:
        return self._client

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def flush(self) -> None:
        return None

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        if not self.started or self.stopped:
            raise IllegalStateError("producer is not running")
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        failure = self.broker.take_send_failure()
        if failure is not None:
            future.set_exception(failure)
            return future
        self.broker._ack(
            future,
            functools.partial(
                self.broker.append,
                topic,
                value,
                key=key,
                partition=partition,
                timestamp_ms=timestamp_ms,
                headers=headers,
            ),
        )
        return future

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> RecordMetadata:
        future = await self.send(topic, value, key, partition, timestamp_ms, headers)
        return await future


class MemoryConsumer:
    """The seam's ``BatchConsumer`` over a :class:`MemoryBroker`."""

    def __init__(
        self,
        broker: MemoryBroker,
        *topics: str,
        options: ConsumerOptions | None = None,
        client_id: str = "consumer",
    ) -> None:
        self.broker = broker
        self.options = options or ConsumerOptions()
        self.client_id = client_id
        self._subscription: set[str] = set(topics)
        self._assigned: set[TopicPartition] | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._running = False
        self._joined = False

    @property
    def group_id(self) -> str | None:
        return self.options.group_id

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._running

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        self._running = True
        self._join_if_subscribed()

    async def stop(self) -> None:
        self._running = False
        if self._joined and self.group_id is not None:
            self.broker._leave(self.group_id, self)
        self._joined = False

    def _join_if_subscribed(self) -> None:
        if self._running and self._subscription and self.group_id and not self._joined:
            self.broker._join(self.group_id, self)
            self._joined = True

    def _require_running(self) -> None:
        if not self._running:
            raise IllegalStateError("consumer is not running")

    # -- assignment ------------------------------------------------------------
    def subscription(self) -> set[str]:
        return set(self._subscription)

    def subscribe(self, topics: Iterable[str], listener: Any = None) -> None:
        self._subscription = set(topics)
        self._assigned = None
        self._positions.clear()
        self._join_if_subscribed()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        if self._joined and self.group_id is not None:
            self.broker._leave(self.group_id, self)
            self._joined = False
        self._subscription = set()
        self._assigned = set(partitions)
        self._positions = {tp: o for tp, o in self._positions.items() if tp in self._assigned}

    def assignment(self) -> set[TopicPartition]:
        if self._assigned is not None:
            return set(self._assigned)
        if not self._running:
            return set()
        owned = sorted(
            TopicPartition(t, p)
            for t in self._subscription
            for p in sorted(self.broker.partitions(t) or ())
        )
        if self.group_id is not None:
            share = self.broker.group_share(self.group_id, self, self._subscription)
            if share is None:
                return set()
            index, members = share
            if members > 1:
                owned = [tp for i, tp in enumerate(owned) if i % members == index]
        current = set(owned)
        for tp in list(self._positions):
            if tp not in current:
                del self._positions[tp]  # revoked: its position is forgotten
        return current

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.broker.partitions(topic)

    # -- positions -------------------------------------------------------------
    def _check_assigned(self, tp: TopicPartition) -> None:
        if tp not in self.assignment():
            raise IllegalStateError(f"{tp} is not assigned to this consumer")

    def _position(self, tp: TopicPartition) -> int:
        if tp not in self._positions:
            committed = (
                self.broker.committed(self.group_id, tp) if self.group_id is not None else None
            )
            if committed is not None:
                self._positions[tp] = committed
            elif self.options.offset_reset is OffsetReset.LATEST:
                self._positions[tp] = self.broker.end_offset(tp)
            else:
                self._positions[tp] = 0
        return self._positions[tp]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self._check_assigned(partition)
        self._positions[partition] = offset

    async def seek_to_beginning(self, *partitions: TopicPartition) -> bool:
        for tp in partitions or tuple(self.assignment()):
            self.seek(tp, 0)
        return True

    async def seek_to_end(self, *partitions: TopicPartition) -> bool:
        for tp in partitions or tuple(self.assignment()):
            self.seek(tp, self.broker.end_offset(tp))
        return True

    async def position(self, partition: TopicPartition) -> int:
        self._require_running()
        self._check_assigned(partition)
        return self._position(partition)

    def highwater(self, partition: TopicPartition) -> int | None:
        return self.broker.end_offset(partition) if partition in self.assignment() else None

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.broker.end_offset(tp) for tp in partitions}

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        tps = list(partitions)
        for tp in tps:
            self.broker.end_offset(tp)  # raises for an unknown partition
        return dict.fromkeys(tps, 0)

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        found: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, at_ms in timestamps.items():
            found[tp] = next(
                (
                    OffsetAndTimestamp(r.offset, r.timestamp)
                    for r in self.broker.records(tp.topic, tp.partition)
                    if r.timestamp >= at_ms
                ),
                None,
            )
        return found

    # -- fetching and committing -----------------------------------------------
    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        self._require_running()
        limit = max_records if max_records is not None else self.options.max_poll_records
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        while True:
            batch = self._fetch(partitions, limit)
            left = deadline - asyncio.get_running_loop().time()
            if batch or left <= 0:
                return batch
            await self.broker.wait_for_change(left)
            if not self._running:
                return {}

    def _fetch(
        self, partitions: Sequence[TopicPartition], limit: int
    ) -> dict[TopicPartition, list[Record]]:
        assigned = self.assignment()
        wanted = [tp for tp in partitions if tp in assigned] if partitions else sorted(assigned)
        batch: dict[TopicPartition, list[Record]] = {}
        for tp in wanted:
            if limit <= 0:
                break
            position = self._position(tp)
            records = self.broker.records(tp.topic, tp.partition)[position : position + limit]
            if records:
                batch[tp] = records
                self._positions[tp] = position + len(records)
                limit -= len(records)
        return batch

    async def commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None
    ) -> None:
        self._require_running()
        if self.group_id is None:
            raise IllegalOperation("commit needs a group_id")
        if offsets is None:
            plain = {tp: self._position(tp) for tp in self.assignment()}
        else:
            plain = {
                tp: o.offset if isinstance(o, OffsetAndMetadata) else o for tp, o in offsets.items()
            }
        self.broker.commit(self.group_id, plain)

    async def committed(self, partition: TopicPartition) -> int | None:
        if self.group_id is None:
            raise IllegalOperation("committed offsets need a group_id")
        return self.broker.committed(self.group_id, partition)


@dataclass
class MemoryFactory:
    """The seam's ``ClientFactory`` over a :class:`MemoryBroker` (no admin client)."""

    broker: MemoryBroker
    settings: Settings = field(default_factory=Settings)
    layout: TopicLayout = field(init=False)
    producers: list[MemoryProducer] = field(default_factory=list, init=False)
    consumers: list[MemoryConsumer] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.layout = TopicLayout(
            prefix=s.topic_prefix,
            partitions=s.partitions,
            replication_factor=s.replication_factor,
            data_retention_ms=s.data_retention_ms,
            audit_retention_ms=s.audit_retention_ms,
        )

    def producer(
        self, options: ProducerOptions | None = None, *, client_suffix: str = "producer"
    ) -> MemoryProducer:
        producer = MemoryProducer(self.broker, client_id=client_suffix)
        self.producers.append(producer)
        return producer

    def consumer(
        self,
        *topics: str,
        options: ConsumerOptions | None = None,
        client_suffix: str = "consumer",
    ) -> MemoryConsumer:
        consumer = MemoryConsumer(self.broker, *topics, options=options, client_id=client_suffix)
        self.consumers.append(consumer)
        return consumer

    async def ensure_topics(self, specs: Sequence[TopicSpec]) -> TopicSetupReport:
        created = [s.name for s in specs if self.broker.create_topic(s.name, s.partitions)]
        unchanged = [s.name for s in specs if s.name not in created]
        return TopicSetupReport(tuple(created), (), tuple(unchanged))
