"""Reading topics: to their end offsets as of now, or following them from a point on.

Three shapes cover every reader in Graylane that is not a consume loop
(:mod:`graylane.kafka.consume_loop`):

* :func:`read_to_end` — a topic (or some of its partitions) from the beginning,
  given offsets or a timestamp, up to the end offsets taken when the read starts
  (optionally only records before a timestamp). Records written meanwhile are
  not waited for. :func:`read_latest_per_key` folds a compacted topic.
* :class:`TopicFollower` / :func:`follow` — every record from now on (or from
  the beginning), applied to a handler in a background task until stopped.
* :class:`CompactedFollower` — a single-partition compacted control topic: caught
  up to its end before a service serves (the router's routing tables, the workers'
  precision commands), then tailed while it runs.

How far a reader is behind: :func:`consumer_lag` from what a consumer already
knows (no extra broker round trip), :func:`group_lag` from a group's committed
offsets (the broker's view, with no consumer of the group).

All of it works on the seam protocols, so it runs over aiokafka or the in-memory double.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from graylane.errors import BusError, TopicSetupError
from graylane.kafka.seam import BatchConsumer, ClientFactory, ConsumerOptions, Record

__all__ = [
    "CompactedFollower",
    "FollowFrom",
    "GroupTopic",
    "LagSource",
    "ReadTimeout",
    "RecordHandler",
    "TopicFollower",
    "TopicOffsets",
    "consumer_lag",
    "drain_to_end",
    "follow",
    "group_lag",
    "group_lags",
    "pump",
    "read_latest_per_key",
    "read_to_end",
    "wait_for_assignment",
]

RecordHandler = Callable[[Record], None]

log = logging.getLogger(__name__)

_POLL_MS = 200


class ReadTimeout(BusError, TimeoutError):
    """A topic could not be read to its end offsets in time."""


class FollowFrom(Enum):
    """Where a follower starts in each partition."""

    END = "end"  # only records written after the follower started
    BEGINNING = "beginning"  # everything still on the log, then every new record
    COMMITTED = "committed"  # the consumer's own reset policy / committed offsets


async def wait_for_assignment(
    consumer: BatchConsumer, *, timeout_s: float = 30.0
) -> list[TopicPartition]:
    """Partitions of a subscribed consumer without a group, once metadata arrived."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not consumer.assignment():
        if asyncio.get_running_loop().time() > deadline:
            raise TopicSetupError(f"no partitions assigned after {timeout_s}s")
        await asyncio.sleep(0.05)
    return sorted(consumer.assignment())


async def drain_to_end(
    consumer: BatchConsumer,
    partitions: Iterable[TopicPartition],
    handle: RecordHandler,
    *,
    from_ms: int = 0,
    from_offsets: Mapping[int, int] | None = None,
    to_ms: int = 0,
    timeout_s: float | None = 30.0,
) -> None:
    """Position ``consumer`` and apply every record up to the current end offsets.

    Each partition starts at its first record at or after ``from_ms`` (a partition
    without one is skipped), else at ``from_offsets[partition]``, else at its
    beginning; it ends at the end offset taken now, or at its first record at or
    after ``to_ms``. ``timeout_s`` None waits as long as it takes. The consumer
    stays open, positioned after the last record applied.
    """
    tps = sorted(set(partitions))
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    end = await consumer.end_offsets(tps)
    starts = await consumer.offsets_for_times(dict.fromkeys(tps, from_ms)) if from_ms else {}
    remaining: set[TopicPartition] = set()
    for tp in tps:
        if from_ms:
            found = starts.get(tp)
            if found is None:
                continue  # nothing at or after from_ms
            consumer.seek(tp, found.offset)
        elif from_offsets is not None and tp.partition in from_offsets:
            consumer.seek(tp, from_offsets[tp.partition])
        else:
            await consumer.seek_to_beginning(tp)
        remaining.add(tp)
    while remaining:
        for tp in sorted(remaining):
            if await consumer.position(tp) >= end[tp]:
                remaining.discard(tp)
        if not remaining:
            return
        if deadline is not None and loop.time() >= deadline:
            names = sorted({tp.topic for tp in remaining})
            raise ReadTimeout(f"timed out reading {', '.join(names)} to the end")
        batches = await consumer.getmany(*sorted(remaining), timeout_ms=_POLL_MS)
        for tp, records in sorted(batches.items()):
            for record in records:
                if record.offset >= end[tp] or (to_ms and record.timestamp >= to_ms):
                    consumer.seek(tp, record.offset)  # a later pump() starts here
                    remaining.discard(tp)
                    break
                handle(record)


async def _open(
    factory: ClientFactory,
    topic: str,
    partitions: Iterable[int] | None,
    options: ConsumerOptions | None,
    client_suffix: str,
    timeout_s: float | None,
) -> tuple[BatchConsumer, list[TopicPartition]]:
    """A started consumer on ``topic`` (subscribed) or on some of its partitions (assigned)."""
    options = options or ConsumerOptions(group_id=None)
    if partitions is None:
        consumer = factory.consumer(topic, options=options, client_suffix=client_suffix)
    else:
        consumer = factory.consumer(options=options, client_suffix=client_suffix)
    await consumer.start()
    try:
        if partitions is None:
            wait_s = 30.0 if timeout_s is None else timeout_s
            return consumer, await wait_for_assignment(consumer, timeout_s=wait_s)
        tps = sorted(TopicPartition(topic, p) for p in partitions)
        consumer.assign(tps)
        return consumer, tps
    except BaseException:
        await consumer.stop()
        raise


async def read_to_end(
    factory: ClientFactory,
    topic: str,
    *,
    partitions: Iterable[int] | None = None,
    from_ms: int = 0,
    from_offsets: Mapping[int, int] | None = None,
    to_ms: int = 0,
    timeout_s: float | None = 30.0,
    client_suffix: str = "reader",
) -> list[Record]:
    """Records of ``topic`` (all partitions, or ``partitions``) up to its end offsets now.

    See :func:`drain_to_end` for the start and stop rules. Records come partition
    by partition, in offset order within each.
    """
    consumer, tps = await _open(factory, topic, partitions, None, client_suffix, timeout_s)
    by_partition: dict[int, list[Record]] = {}
    try:
        await drain_to_end(
            consumer,
            tps,
            lambda r: by_partition.setdefault(r.partition, []).append(r),
            from_ms=from_ms,
            from_offsets=from_offsets,
            to_ms=to_ms,
            timeout_s=timeout_s,
        )
    finally:
        await consumer.stop()
    return [r for p in sorted(by_partition) for r in by_partition[p]]


async def read_latest_per_key(
    factory: ClientFactory, topic: str, *, timeout_s: float = 30.0
) -> dict[bytes, bytes | None]:
    """Read a (compacted) topic from the beginning to its current end.

    Returns the latest value per key; a tombstone maps to ``None``; keyless records are ignored.
    """
    latest: dict[bytes, bytes | None] = {}
    for record in await read_to_end(factory, topic, timeout_s=timeout_s):
        if record.key is not None:
            latest[record.key] = record.value
    return latest


async def pump(
    consumer: BatchConsumer, handle: RecordHandler, stop: asyncio.Event, *, poll_ms: int = _POLL_MS
) -> None:
    """Apply every record ``consumer`` fetches, in order, until ``stop`` is set."""
    while not stop.is_set():
        for _, records in sorted((await consumer.getmany(timeout_ms=poll_ms)).items()):
            for record in records:
                handle(record)


class TopicFollower:
    """Applies every record of a topic from a start point on to ``handle``, in a task.

    ``await follower.start()`` returns once the consumer is positioned, so nothing
    written afterwards is missed; ``await follower.stop()`` ends the task and
    re-raises what the handler raised, if anything.
    """

    def __init__(
        self,
        factory: ClientFactory,
        topic: str,
        handle: RecordHandler,
        *,
        start_at: FollowFrom = FollowFrom.END,
        partitions: Iterable[int] | None = None,
        options: ConsumerOptions | None = None,
        client_suffix: str = "follower",
        poll_ms: int = _POLL_MS,
    ) -> None:
        self._factory = factory
        self._topic = topic
        self._handle = handle
        self._start_at = start_at
        self._partitions = None if partitions is None else tuple(partitions)
        self._options = options
        self._suffix = client_suffix
        self._poll_ms = poll_ms
        self._stop = asyncio.Event()
        self._consumer: BatchConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        consumer, tps = await _open(
            self._factory, self._topic, self._partitions, self._options, self._suffix, 30.0
        )
        try:
            if self._start_at is FollowFrom.END:
                await consumer.seek_to_end(*tps)
            elif self._start_at is FollowFrom.BEGINNING:
                await consumer.seek_to_beginning(*tps)
            for tp in tps:
                await consumer.position(tp)  # resolve now, so nothing sent later is missed
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._task = asyncio.create_task(
            pump(consumer, self._handle, self._stop, poll_ms=self._poll_ms)
        )

    async def run_until(self, stop: asyncio.Event) -> None:
        """Return when ``stop`` is set or the task ended (the handler raised)."""
        if self._task is None:
            raise RuntimeError("start() must run before run_until()")
        waiter = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([waiter, self._task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def stop(self) -> None:
        self._stop.set()
        try:
            if self._task is not None:
                if not self._task.done():
                    self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        finally:
            self._task = None
            if self._consumer is not None:
                await self._consumer.stop()
                self._consumer = None

    async def __aenter__(self) -> TopicFollower:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def follow(
    factory: ClientFactory,
    topic: str,
    handle: RecordHandler,
    stop: asyncio.Event,
    *,
    start_at: FollowFrom = FollowFrom.END,
    ready: asyncio.Event | None = None,
    client_suffix: str = "follower",
) -> None:
    """Apply every record of ``topic`` from ``start_at`` on until ``stop`` is set.

    ``ready`` is set once the consumer is positioned.
    """
    async with TopicFollower(
        factory, topic, handle, start_at=start_at, client_suffix=client_suffix
    ) as follower:
        if ready is not None:
            ready.set()
        await follower.run_until(stop)


# -- a compacted control topic --------------------------------------------------------


class CompactedFollower:
    """Applies every record of ``topic`` (partition 0) to ``handle``, in order: all of
    it up to its current end (:meth:`catch_up`), then each new one (:meth:`follow`).

    A record ``handle`` raises on (one this build cannot interpret) is logged, counted
    in :attr:`passed_over` and passed over: a compacted topic is read again from its
    beginning at every start, so one such record must not end the service.
    """

    def __init__(
        self, factory: ClientFactory, topic: str, handle: RecordHandler, *, client_suffix: str
    ) -> None:
        self._factory = factory
        self._tp = TopicPartition(topic, 0)
        self._apply = handle
        self._suffix = client_suffix
        self._consumer: BatchConsumer | None = None
        self.passed_over = 0

    def _handle(self, record: Record) -> None:
        try:
            self._apply(record)
        except Exception:
            self.passed_over += 1
            log.exception(
                "%s: record at offset %d passed over (the handler failed on it)",
                self._tp.topic,
                record.offset,
            )

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


# -- lag -------------------------------------------------------------------------------


class LagSource(Protocol):
    def assignment(self) -> set[TopicPartition]: ...

    def highwater(self, partition: TopicPartition) -> int | None: ...

    async def position(self, partition: TopicPartition) -> int: ...


async def consumer_lag(consumer: LagSource) -> dict[str, int]:
    """Records not yet consumed per topic: high watermark minus position, over assigned
    partitions whose watermark a fetch has reported (others count 0 until then)."""
    lag: dict[str, int] = {}
    for tp in consumer.assignment():
        high = consumer.highwater(tp)
        behind = 0 if high is None else max(0, high - await consumer.position(tp))
        lag[tp.topic] = lag.get(tp.topic, 0) + behind
    return lag


@dataclass(frozen=True)
class TopicOffsets:
    """A topic's end offsets and a group's committed offsets on it, summed over partitions.

    ``committed`` is None when the group has committed nothing on some partition
    (never consumed it); ``lag`` then counts those partitions from offset 0.
    """

    end: int
    committed: int | None
    lag: int


class EndOffsets(Protocol):
    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...


class GroupOffsets(Protocol):
    async def list_consumer_group_offsets(
        self, group_id: str, group_coordinator_id: int | None = None, partitions: Any = None
    ) -> dict[TopicPartition, OffsetAndMetadata]: ...


async def group_lag(
    ends: EndOffsets, groups: GroupOffsets, group_id: str, topic: str, partitions: int
) -> TopicOffsets:
    """The lag of ``group_id`` on ``topic`` from the broker's view (its committed offsets),
    so it is known whether or not the group's consumers are alive."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    end = await ends.end_offsets(tps)
    committed = await groups.list_consumer_group_offsets(group_id, partitions=tps)
    return _offsets_of(tps, end, committed)


@dataclass(frozen=True)
class GroupTopic:
    """One group on one topic of ``partitions`` partitions: what :func:`group_lags` reads."""

    group_id: str
    topic: str
    partitions: int


async def group_lags(
    ends: EndOffsets,
    groups: GroupOffsets,
    wanted: Sequence[GroupTopic],
    *,
    concurrency: int = 32,
) -> list[TopicOffsets | KafkaError]:
    """:func:`group_lag` for many groups at once: one end-offsets request for every
    partition, and the groups' committed offsets asked ``concurrency`` at a time, so a
    thousand versions cost a few round trips, not two thousand. A group whose offsets
    could not be read gets its error in its place; an end-offsets failure raises."""
    tps = [TopicPartition(w.topic, p) for w in wanted for p in range(w.partitions)]
    end = await ends.end_offsets(tps) if tps else {}
    gate = asyncio.Semaphore(concurrency)

    async def one(w: GroupTopic) -> TopicOffsets | KafkaError:
        parts = [TopicPartition(w.topic, p) for p in range(w.partitions)]
        async with gate:
            try:
                committed = await groups.list_consumer_group_offsets(w.group_id, partitions=parts)
            except KafkaError as exc:
                return exc
        return _offsets_of(parts, end, committed)

    return list(await asyncio.gather(*(one(w) for w in wanted)))


def _offsets_of(
    tps: list[TopicPartition],
    end: Mapping[TopicPartition, int],
    committed: Mapping[TopicPartition, OffsetAndMetadata],
) -> TopicOffsets:
    offsets = [committed.get(tp) for tp in tps]
    known = [o.offset if o is not None and o.offset >= 0 else None for o in offsets]
    highs = [end.get(tp, 0) for tp in tps]
    return TopicOffsets(
        end=sum(highs),
        committed=None if None in known else sum(k or 0 for k in known),
        lag=sum(max(0, e - (k or 0)) for e, k in zip(highs, known, strict=True)),
    )
