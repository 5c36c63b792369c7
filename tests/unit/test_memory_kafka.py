"""The in-memory Kafka double (tests/support/memory_kafka.py) keeps the promises the
services rely on: per-partition order, key partitioning, explicit commits per group,
seeks, end offsets, and a getmany that waits for new records only up to its timeout."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import (
    IllegalOperation,
    IllegalStateError,
    NotLeaderForPartitionError,
    UnknownTopicOrPartitionError,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import OffsetAndMetadata

from graylane.kafka.seam import (
    BatchConsumer,
    ClientFactory,
    ConsumerOptions,
    KafkaFactory,
    OffsetReset,
    Producer,
    known_topics,
)
from graylane.settings import Settings
from tests.support.memory_kafka import MemoryBroker, MemoryFactory, MemoryProducer


def _broker(**topics: int) -> MemoryBroker:
    broker = MemoryBroker()
    for name, partitions in topics.items():
        broker.create_topic(name, partitions)
    return broker


async def _started(producer: MemoryProducer) -> MemoryProducer:
    await producer.start()
    return producer


def test_the_doubles_implement_the_seam_protocols() -> None:
    factory = MemoryFactory(MemoryBroker())
    assert isinstance(factory, ClientFactory)
    assert isinstance(factory.producer(), Producer)
    assert isinstance(factory.consumer("t"), BatchConsumer)


async def test_the_real_factory_builds_clients_that_satisfy_the_same_protocols() -> None:
    factory = KafkaFactory(Settings(bootstrap_servers="127.0.0.1:1"))
    assert isinstance(factory, ClientFactory)
    producer, consumer = factory.producer(), factory.consumer("t")
    try:
        assert isinstance(producer, Producer)
        assert isinstance(consumer, BatchConsumer)
    finally:
        await producer.stop()
        await consumer.stop()


async def test_send_returns_a_resolved_future_with_record_metadata() -> None:
    broker = _broker(t=3)
    producer = await _started(MemoryProducer(broker))
    future = await producer.send(
        "t", b"v", key=b"k", timestamp_ms=1234, headers=[("h", b"x")], partition=2
    )
    assert future.done()
    meta = future.result()
    assert (meta.topic, meta.partition, meta.offset, meta.timestamp) == ("t", 2, 0, 1234)
    assert meta.topic_partition == TopicPartition("t", 2)
    again = await producer.send_and_wait("t", b"w", partition=2)
    assert again.offset == 1
    [first, second] = broker.records("t", 2)
    assert isinstance(first, ConsumerRecord)
    assert (first.key, first.value, first.headers, first.timestamp) == (
        b"k",
        b"v",
        (("h", b"x"),),
        1234,
    )
    assert second.offset == 1


async def test_keys_are_partitioned_like_the_java_client_and_stay_together() -> None:
    broker = _broker(t=4)
    producer = await _started(MemoryProducer(broker))
    for i in range(40):
        await producer.send("t", b"%d" % i, key=b"user-%d" % (i % 5))
    partitioner = DefaultPartitioner()
    for p in range(4):
        for record in broker.records("t", p):
            assert record.key is not None
            assert partitioner(record.key, [0, 1, 2, 3], [0, 1, 2, 3]) == p
    assert len({r.partition for r in broker.records("t")}) > 1
    user0 = [r.value for r in broker.records("t") if r.key == b"user-0"]
    assert user0 == [b"%d" % i for i in range(0, 40, 5)]  # one partition: in order


async def test_keyless_records_spread_round_robin() -> None:
    broker = _broker(t=3)
    producer = await _started(MemoryProducer(broker))
    for _ in range(6):
        await producer.send("t", b"x")
    assert [len(broker.records("t", p)) for p in range(3)] == [2, 2, 2]


async def test_sending_to_a_missing_topic_fails_unless_auto_created() -> None:
    producer = await _started(MemoryProducer(MemoryBroker()))
    with pytest.raises(UnknownTopicOrPartitionError):
        await producer.send("nope", b"x")
    auto = await _started(MemoryProducer(MemoryBroker(auto_create_topics=True)))
    assert (await auto.send_and_wait("nope", b"x")).offset == 0


async def test_injected_send_failures_fail_the_future_and_write_nothing() -> None:
    broker = _broker(t=1)
    producer = await _started(MemoryProducer(broker))
    broker.fail_next_sends(NotLeaderForPartitionError())
    assert broker.pending_send_failures == 1
    failed = await producer.send("t", b"lost")
    assert broker.pending_send_failures == 0
    with pytest.raises(NotLeaderForPartitionError):
        await failed
    await producer.send_and_wait("t", b"kept")
    assert broker.values("t") == [b"kept"]


async def test_held_acks_keep_sends_in_flight_until_released() -> None:
    broker = _broker(t=1)
    producer = await _started(MemoryProducer(broker))
    broker.hold_acks()
    first = await producer.send("t", b"1")
    second = await producer.send("t", b"2")
    await asyncio.sleep(0)
    assert not first.done() and not second.done()
    assert broker.values("t") == []
    assert broker.release_acks() == 2
    assert [(await first).offset, (await second).offset] == [0, 1]
    assert broker.values("t") == [b"1", b"2"]
    assert (await producer.send("t", b"3")).done()  # released: acknowledged at once again


async def test_metadata_lists_the_topics() -> None:
    factory = MemoryFactory(_broker(a=1), Settings(partitions=2))
    spec = factory.layout.model_specs("m", [])[0]
    report = await factory.ensure_topics([spec])
    assert report.created == (spec.name,)
    assert (await factory.ensure_topics([spec])).unchanged == (spec.name,)
    producer = factory.producer()
    assert await known_topics(producer) == {"a", spec.name}
    assert factory.broker.partitions(spec.name) == {0, 1}


async def test_a_subscribed_consumer_reads_every_partition_in_offset_order() -> None:
    broker = _broker(t=2)
    producer = await _started(MemoryProducer(broker))
    for i in range(6):
        await producer.send("t", b"%d" % i, partition=i % 2)
    consumer = MemoryFactory(broker).consumer("t")
    await consumer.start()
    assert consumer.assignment() == {TopicPartition("t", 0), TopicPartition("t", 1)}
    batches = await consumer.getmany(timeout_ms=0)
    assert {tp: [r.value for r in rs] for tp, rs in batches.items()} == {
        TopicPartition("t", 0): [b"0", b"2", b"4"],
        TopicPartition("t", 1): [b"1", b"3", b"5"],
    }
    assert await consumer.getmany(timeout_ms=0) == {}


async def test_getmany_honours_max_records_and_named_partitions() -> None:
    broker = _broker(t=2)
    producer = await _started(MemoryProducer(broker))
    for i in range(10):
        await producer.send("t", b"%d" % i, partition=i % 2)
    consumer = MemoryFactory(broker).consumer("t")
    await consumer.start()
    tp1 = TopicPartition("t", 1)
    only1 = await consumer.getmany(tp1, timeout_ms=0, max_records=2)
    assert list(only1) == [tp1] and [r.offset for r in only1[tp1]] == [0, 1]
    assert await consumer.position(tp1) == 2
    assert await consumer.position(TopicPartition("t", 0)) == 0


async def test_getmany_waits_for_a_record_written_meanwhile_and_times_out_otherwise() -> None:
    broker = _broker(t=1)
    producer = await _started(MemoryProducer(broker))
    consumer = MemoryFactory(broker).consumer("t")
    await consumer.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await consumer.getmany(timeout_ms=50) == {}
    assert loop.time() - t0 >= 0.045

    async def later() -> None:
        await asyncio.sleep(0.02)
        await producer.send("t", b"late")

    writer = asyncio.create_task(later())
    batches = await consumer.getmany(timeout_ms=5_000)
    await writer
    assert [r.value for rs in batches.values() for r in rs] == [b"late"]
    assert loop.time() - t0 < 2.0


async def test_commits_are_per_group_and_a_new_member_resumes_from_them() -> None:
    broker = _broker(t=1)
    producer = await _started(MemoryProducer(broker))
    for i in range(5):
        await producer.send("t", b"%d" % i)
    factory = MemoryFactory(broker)
    tp = TopicPartition("t", 0)
    first = factory.consumer("t", options=ConsumerOptions(group_id="g"))
    await first.start()
    await first.getmany(timeout_ms=0, max_records=3)
    assert await first.committed(tp) is None  # reading commits nothing
    await first.commit({tp: 2})
    await first.stop()
    assert broker.committed("g", tp) == 2
    second = factory.consumer("t", options=ConsumerOptions(group_id="g"))
    await second.start()
    assert [r.offset for r in (await second.getmany(timeout_ms=0))[tp]] == [2, 3, 4]
    await second.commit()  # the current positions
    assert broker.committed("g", tp) == 5
    await second.commit({tp: OffsetAndMetadata(4, "")})
    assert broker.committed("g", tp) == 4
    other = factory.consumer("t", options=ConsumerOptions(group_id="other"))
    await other.start()
    assert await other.position(tp) == 0


async def test_commit_without_a_group_is_refused() -> None:
    consumer = MemoryFactory(_broker(t=1)).consumer("t")
    await consumer.start()
    with pytest.raises(IllegalOperation):
        await consumer.commit()


async def test_group_members_share_the_partitions() -> None:
    broker = _broker(t=4)
    factory = MemoryFactory(broker)
    a = factory.consumer("t", options=ConsumerOptions(group_id="g"))
    b = factory.consumer("t", options=ConsumerOptions(group_id="g"))
    await a.start()
    assert len(a.assignment()) == 4
    await b.start()
    assert len(a.assignment()) == len(b.assignment()) == 2
    assert a.assignment().isdisjoint(b.assignment())
    await b.stop()
    assert len(a.assignment()) == 4


async def test_latest_reset_skips_what_was_written_before() -> None:
    broker = _broker(t=1)
    producer = await _started(MemoryProducer(broker))
    await producer.send("t", b"old")
    consumer = MemoryFactory(broker).consumer(
        "t", options=ConsumerOptions(offset_reset=OffsetReset.LATEST)
    )
    await consumer.start()
    tp = TopicPartition("t", 0)
    assert await consumer.position(tp) == 1
    await producer.send("t", b"new")
    assert [r.value for r in (await consumer.getmany(timeout_ms=0))[tp]] == [b"new"]


async def test_assign_seek_and_offsets() -> None:
    broker = _broker(t=2)
    producer = await _started(MemoryProducer(broker))
    for i in range(4):
        await producer.send("t", b"%d" % i, partition=0, timestamp_ms=1000 + i * 10)
    consumer = MemoryFactory(broker).consumer()
    await consumer.start()
    tp = TopicPartition("t", 0)
    consumer.assign([tp])
    assert consumer.assignment() == {tp}
    assert await consumer.end_offsets([tp, TopicPartition("t", 1)]) == {
        tp: 4,
        TopicPartition("t", 1): 0,
    }
    assert await consumer.beginning_offsets([tp]) == {tp: 0}
    await consumer.seek_to_end(tp)
    assert await consumer.position(tp) == 4
    consumer.seek(tp, 2)
    assert [r.value for r in (await consumer.getmany(timeout_ms=0))[tp]] == [b"2", b"3"]
    await consumer.seek_to_beginning(tp)
    assert await consumer.position(tp) == 0
    found = await consumer.offsets_for_times({tp: 1015, TopicPartition("t", 1): 0})
    at = found[tp]
    assert at is not None and (at.offset, at.timestamp) == (2, 1020)
    assert found[TopicPartition("t", 1)] is None
    assert consumer.partitions_for_topic("t") == {0, 1}
    assert consumer.partitions_for_topic("missing") is None
    with pytest.raises(IllegalStateError):
        consumer.seek(TopicPartition("t", 1), 0)  # not assigned


async def test_a_stopped_consumer_refuses_to_fetch() -> None:
    consumer = MemoryFactory(_broker(t=1)).consumer("t")
    with pytest.raises(IllegalStateError):
        await consumer.getmany(timeout_ms=0)
    producer = MemoryProducer(MemoryBroker())
    with pytest.raises(IllegalStateError):
        await producer.send("t", b"x")
