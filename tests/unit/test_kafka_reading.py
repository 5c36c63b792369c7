"""read_to_end / read_latest_per_key / TopicFollower / follow (graylane/kafka/reading.py)
over the in-memory double: start at the beginning, offsets or a time; stop at the end
offsets taken when the read starts or at a time; follow from now on until stopped."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from graylane.kafka.reading import (
    CompactedFollower,
    FollowFrom,
    ReadTimeout,
    TopicFollower,
    drain_to_end,
    follow,
    read_latest_per_key,
    read_to_end,
)
from graylane.kafka.seam import Record
from tests.support.memory_kafka import MemoryBroker, MemoryFactory


@pytest.fixture
def factory() -> MemoryFactory:
    broker = MemoryBroker()
    broker.create_topic("t", 2)
    for i in range(10):  # partition i % 2, timestamps 1000, 1010, ...
        broker.append(
            "t", b"%d" % i, key=b"k%d" % (i % 3), partition=i % 2, timestamp_ms=1000 + 10 * i
        )
    return MemoryFactory(broker)


def values(records: list[Record]) -> list[bytes | None]:
    return [r.value for r in records]


async def test_read_to_end_reads_every_partition_from_the_beginning(factory: MemoryFactory) -> None:
    records = await read_to_end(factory, "t")
    assert values(records) == [b"0", b"2", b"4", b"6", b"8", b"1", b"3", b"5", b"7", b"9"]
    assert not any(c.running for c in factory.consumers)


async def test_read_to_end_from_a_time_to_a_time(factory: MemoryFactory) -> None:
    records = await read_to_end(factory, "t", from_ms=1025, to_ms=1065)
    assert sorted(r.timestamp for r in records) == [1030, 1040, 1050, 1060]


async def test_a_partition_with_nothing_after_from_ms_is_skipped(factory: MemoryFactory) -> None:
    records = await read_to_end(factory, "t", from_ms=1085)
    assert values(records) == [b"9"]


async def test_read_to_end_of_some_partitions_from_offsets(factory: MemoryFactory) -> None:
    assert values(await read_to_end(factory, "t", partitions=[1], from_offsets={1: 3})) == [
        b"7",
        b"9",
    ]
    assert values(await read_to_end(factory, "t", partitions=[0], from_offsets={1: 3})) == [
        b"0",
        b"2",
        b"4",
        b"6",
        b"8",
    ]


async def test_records_written_after_the_read_started_are_not_waited_for(
    factory: MemoryFactory,
) -> None:
    consumer = factory.consumer("t")
    await consumer.start()
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    seen: list[Record] = []

    def handle(record: Record) -> None:
        seen.append(record)
        if len(seen) == 1:  # a write while the read is under way
            factory.broker.append("t", b"late", partition=0)

    await drain_to_end(consumer, tps, handle)
    assert b"late" not in values(seen) and len(seen) == 10
    # The consumer is left right after the last record applied: "late" comes next.
    batch = await consumer.getmany(timeout_ms=0)
    assert values(batch[TopicPartition("t", 0)]) == [b"late"]


async def test_an_empty_topic_reads_as_empty_and_a_slow_one_times_out(
    factory: MemoryFactory,
) -> None:
    factory.broker.create_topic("empty", 3)
    assert await read_to_end(factory, "empty") == []
    with pytest.raises(ReadTimeout):
        await read_to_end(factory, "t", timeout_s=0.0)


async def test_read_latest_per_key_folds_a_compacted_topic(factory: MemoryFactory) -> None:
    factory.broker.create_topic("c", 1)
    for key, value in [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"b", None), (None, b"x")]:
        factory.broker.append("c", value, key=key)
    assert await read_latest_per_key(factory, "c") == {b"a": b"2", b"b": None}


async def test_a_follower_sees_only_what_is_written_after_it_started(
    factory: MemoryFactory,
) -> None:
    seen: list[bytes | None] = []
    arrived = asyncio.Event()

    def handle(record: Record) -> None:
        seen.append(record.value)
        arrived.set()

    async with TopicFollower(factory, "t", handle, start_at=FollowFrom.END):
        factory.broker.append("t", b"new", partition=1)
        await asyncio.wait_for(arrived.wait(), 5)
    assert seen == [b"new"]


async def test_follow_from_the_beginning_until_stopped(factory: MemoryFactory) -> None:
    seen: list[bytes | None] = []
    stop = asyncio.Event()
    ready = asyncio.Event()

    def handle(record: Record) -> None:
        seen.append(record.value)
        if record.value == b"last":
            stop.set()

    task = asyncio.create_task(
        follow(factory, "t", handle, stop, start_at=FollowFrom.BEGINNING, ready=ready)
    )
    await asyncio.wait_for(ready.wait(), 5)
    factory.broker.append("t", b"last", partition=0)
    await asyncio.wait_for(task, 5)
    assert sorted(v for v in seen if v is not None) == sorted(
        [b"%d" % i for i in range(10)] + [b"last"]
    )
    assert not any(c.running for c in factory.consumers)


async def test_a_handler_error_ends_follow_and_is_raised(factory: MemoryFactory) -> None:
    def handle(record: Record) -> None:
        raise ValueError(f"bad record {record.offset}")

    with pytest.raises(ValueError, match="bad record"):
        await asyncio.wait_for(
            follow(factory, "t", handle, asyncio.Event(), start_at=FollowFrom.BEGINNING), 5
        )
    assert not any(c.running for c in factory.consumers)


async def test_compacted_follower_catches_up_then_applies_updates(
    factory: MemoryFactory,
) -> None:
    broker = factory.broker
    broker.create_topic("ctl", 1)
    broker.append("ctl", b"1", key=b"m")
    broker.append("ctl", b"2", key=b"m")
    seen: list[bytes | None] = []
    follower = CompactedFollower(factory, "ctl", lambda r: seen.append(r.value), client_suffix="x")
    await follower.catch_up()
    assert seen == [b"1", b"2"]
    stop = asyncio.Event()
    task = asyncio.create_task(follower.follow(stop))
    broker.append("ctl", b"3", key=b"m")
    while seen != [b"1", b"2", b"3"]:
        await asyncio.sleep(0.005)
    stop.set()
    await asyncio.wait_for(task, 5)
    await follower.stop()
