"""Kafka's normal events are not fatal (issue 10, item 3): the guard, the rebalance
listener, guarded delivery, static instance ids and the reply-topic cache; and the
router surviving a broker timeout and a failed commit on the in-memory double."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NotLeaderForPartitionError,
    OutOfOrderSequenceNumber,
    RecordTooLargeError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from prometheus_client import CollectorRegistry

from graylane.kafka.backoff import BackoffPolicy
from graylane.kafka.delivery import deliver_and_commit
from graylane.kafka.fault import Fault, classify
from graylane.kafka.guard import BatchGuard
from graylane.kafka.membership import claim_instance
from graylane.kafka.replies import ReplySink
from graylane.kafka.seam import ConsumerOptions, Record
from graylane.services.router.service import Router
from graylane.settings import Settings
from tests.support.memory_kafka import MemoryBroker, MemoryConsumer, MemoryFactory
from tests.unit.test_router_memory import (
    GROUP,
    MODEL,
    broker,
    committed_up_to_end,
    eventually,
    factory,
    forwarded,
    request,
    running_router,
    submit,
)

__all__ = ["broker", "factory"]  # fixtures (a broker with the router's topics)


def quick_guard(**kwargs: object) -> tuple[BatchGuard, list[float]]:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    guard = BatchGuard(
        "test",
        policy=BackoffPolicy(base_s=0.1, cap_s=0.4, jitter=0.0),
        sleep=sleep,
        **kwargs,  # type: ignore[arg-type]
    )
    return guard, slept


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (CommitFailedError(), Fault.REBALANCE),
        (IllegalStateError(), Fault.REBALANCE),
        (KafkaTimeoutError(), Fault.OUTAGE),
        (KafkaConnectionError(), Fault.OUTAGE),
        (NotLeaderForPartitionError(), Fault.OUTAGE),
        (UnknownTopicOrPartitionError(), Fault.MISSING_TOPIC),
        (OutOfOrderSequenceNumber(), Fault.PRODUCER),
        (RecordTooLargeError(), Fault.OTHER),
        (TopicAuthorizationFailedError(), Fault.FATAL),
        (GroupAuthorizationFailedError(), Fault.FATAL),
        (SaslAuthenticationFailed(), Fault.FATAL),
    ],
)
def test_classify(error: Exception, kind: Fault) -> None:
    assert classify(error) is kind


async def polled(consumer: MemoryConsumer) -> list[Record]:
    """The records one poll returns, over every partition."""
    return [r for rs in (await consumer.getmany(timeout_ms=100)).values() for r in rs]


@pytest.fixture
async def consumer(factory: MemoryFactory) -> AsyncIterator[MemoryConsumer]:
    """A started ingress consumer of the router's group, with request r1 submitted."""
    consumer = factory.consumer(
        factory.layout.ingress(MODEL), options=ConsumerOptions(group_id=GROUP)
    )
    await consumer.start()
    await submit(factory, request("r1", "u1"))
    yield consumer
    await consumer.stop()


@pytest.fixture
async def records(consumer: MemoryConsumer) -> list[Record]:
    """The first poll of ``consumer``: the batch holding r1."""
    return await polled(consumer)


async def test_guarded_delivery_survives_an_outage_and_backs_off(
    consumer: MemoryConsumer, records: list[Record]
) -> None:
    guard, slept = quick_guard()

    async def outage() -> list[asyncio.Future[object]]:
        raise KafkaTimeoutError()

    for _ in range(4):
        assert not await deliver_and_commit(consumer, records, outage, guard=guard)
    assert slept == pytest.approx([0.1, 0.2, 0.4, 0.4])  # capped exponential backoff
    assert guard.faults[Fault.OUTAGE] == 4
    again = await polled(consumer)
    assert [r.offset for r in again] == [r.offset for r in records]  # rewound

    async def fine() -> list[asyncio.Future[object]]:
        return []

    assert await deliver_and_commit(consumer, again, fine, guard=guard)
    assert guard.backoff.failures == 0

    async def other() -> list[asyncio.Future[object]]:
        raise RecordTooLargeError()

    with pytest.raises(RecordTooLargeError):  # not a normal Kafka event: still surfaces
        await deliver_and_commit(consumer, again, other, guard=guard)


async def test_a_failed_commit_and_a_revoked_partition_are_survived(
    consumer: MemoryConsumer, records: list[Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    guard, _ = quick_guard()

    async def failing_commit(offsets: object = None) -> None:
        raise CommitFailedError()

    monkeypatch.setattr(consumer, "commit", failing_commit)

    async def fine() -> list[asyncio.Future[object]]:
        return []

    assert not await deliver_and_commit(consumer, records, fine, guard=guard)
    assert guard.faults[Fault.REBALANCE] == 1

    def seek(tp: TopicPartition, offset: int) -> None:
        raise IllegalStateError(f"{tp} is not assigned")

    monkeypatch.setattr(consumer, "seek", seek)

    async def outage() -> list[asyncio.Future[object]]:
        raise KafkaConnectionError()

    assert not await deliver_and_commit(consumer, records, outage, guard=guard)


async def test_the_listener_lets_the_batch_in_flight_finish_before_a_rebalance(
    records: list[Record],
) -> None:
    guard, _ = quick_guard()
    assert isinstance(guard.listener, ConsumerRebalanceListener)
    guard.begin(records)
    tp = TopicPartition(records[0].topic, records[0].partition)
    revoking = asyncio.create_task(guard.listener.on_partitions_revoked({tp}))
    await asyncio.sleep(0.05)
    assert not revoking.done()  # the rebalance waits for the batch
    guard.end()
    await asyncio.wait_for(revoking, 1)
    assert guard.revocations == 1
    # A batch on other partitions does not hold a rebalance up.
    guard.begin(records)
    await asyncio.wait_for(guard.listener.on_partitions_revoked({TopicPartition("x", 9)}), 1)
    short, _ = quick_guard(revoke_wait_s=0.05)
    short.begin(records)
    await asyncio.wait_for(short.listener.on_partitions_revoked({tp}), 1)  # abandoned in time


@contextlib.asynccontextmanager
async def router_past_a_send_timeout(
    broker: MemoryBroker, factory: MemoryFactory
) -> AsyncIterator[Router]:
    """A running router whose first send timed out, once it committed request r1."""
    async with running_router(factory) as router:
        broker.fail_next_sends(KafkaTimeoutError())
        await submit(factory, request("r1", "u1"))
        await eventually(lambda: committed_up_to_end(broker, factory), timeout_s=10)
        yield router


async def test_the_router_survives_a_broker_timeout_and_delivers_again(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    """Regression: a KafkaTimeoutError (not retriable) ended the router's run()."""
    async with router_past_a_send_timeout(broker, factory) as router:
        assert broker.pending_send_failures == 0
        assert router.ready.is_set()
    assert [r.request_id for r in forwarded(factory, "v1")] == ["r1"]


async def test_the_router_survives_a_commit_lost_to_a_rebalance(
    broker: MemoryBroker, factory: MemoryFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: CommitFailedError (partitions revoked mid-batch) ended the router."""
    failures = [CommitFailedError()]
    real_commit = MemoryConsumer.commit

    async def commit(self: MemoryConsumer, offsets: object = None) -> None:
        if failures and self.group_id == GROUP:
            raise failures.pop()
        await real_commit(self, offsets)  # type: ignore[arg-type]

    monkeypatch.setattr(MemoryConsumer, "commit", commit)
    async with running_router(factory):
        await submit(factory, request("r1", "u1"))
        await eventually(lambda: not failures and len(forwarded(factory, "v1")) == 1)
        await submit(factory, request("r2", "u1"))  # same key: same partition
        await eventually(lambda: committed_up_to_end(broker, factory), timeout_s=10)
    assert [r.request_id for r in forwarded(factory, "v1")] == ["r1", "r2"]


async def test_the_router_counts_faults_in_a_metric(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    async with router_past_a_send_timeout(broker, factory) as router:
        value = router.registry.get_sample_value(
            "graylane_kafka_faults_total", {"service": "router", "kind": "outage"}
        )
        assert value == 1.0


def test_instance_ids_are_unique_among_live_holders_and_stable_over_restarts(
    tmp_path: Path,
) -> None:
    a = claim_instance("worker", "g", host="h", lock_dir=tmp_path)
    b = claim_instance("worker", "g", host="h", lock_dir=tmp_path)
    assert (a.instance_id, b.instance_id) == ("worker-h-0", "worker-h-1")
    a.release()  # the process holding index 0 died
    again = claim_instance("worker", "g", host="h", lock_dir=tmp_path)
    assert again.instance_id == "worker-h-0"  # its restart takes its id (and partitions) back
    other_group = claim_instance("worker", "g2", host="h", lock_dir=tmp_path)
    assert other_group.instance_id == "worker-h-0"
    assert claim_instance("worker", "g", explicit="pod-7").instance_id == "pod-7"
    for slot in (b, again, other_group):
        slot.release()


def test_the_instance_id_comes_from_the_environment() -> None:
    assert Settings.from_env({"GRAYLANE_INSTANCE_ID": "router-a"}).instance_id == "router-a"
    assert Settings.from_env({}).instance_id == ""


class CountingCluster:
    def __init__(self, topics: set[str]) -> None:
        self.topics_now = topics
        self.fetches = 0

    def topics(self, exclude_internal_topics: bool = True) -> set[str]:
        return set(self.topics_now)


class MetadataOnly:
    def __init__(self, cluster: CountingCluster) -> None:
        self.cluster = cluster

    async def fetch_all_metadata(self) -> CountingCluster:
        self.cluster.fetches += 1
        return self.cluster


class ProducerStub:
    def __init__(self, cluster: CountingCluster) -> None:
        self.client = MetadataOnly(cluster)


async def test_the_reply_topic_cache_forgets_a_deleted_topic(factory: MemoryFactory) -> None:
    cluster = CountingCluster({"t.reply.c1"})
    sink = ReplySink(ProducerStub(cluster), factory.layout, "test", refresh_s=60)  # type: ignore[arg-type]
    assert await sink.topic_exists("t.reply.c1")
    assert await sink.topic_exists("t.reply.c1")
    assert cluster.fetches == 1  # cached
    cluster.topics_now = set()  # deleted under the running service
    sink.forget(Fault.MISSING_TOPIC)  # what the guard calls on a failed send
    assert not await sink.topic_exists("t.reply.c1")
    expiring = ReplySink(ProducerStub(cluster), factory.layout, "test", refresh_s=0.0)  # type: ignore[arg-type]
    cluster.topics_now = {"t.reply.c1"}
    assert await expiring.topic_exists("t.reply.c1")
    cluster.topics_now = set()
    await asyncio.sleep(0.06)
    assert not await expiring.topic_exists("t.reply.c1")  # the cache ages out by itself


def test_a_guard_with_a_registry_exports_its_counter() -> None:
    registry = CollectorRegistry()
    guard = BatchGuard("x", registry=registry)
    guard.count(CommitFailedError())
    assert (
        registry.get_sample_value(
            "graylane_kafka_faults_total", {"service": "x", "kind": "rebalance"}
        )
        == 1.0
    )


async def test_a_failed_batch_is_rewound_only_once_no_send_is_in_flight(
    consumer: MemoryConsumer, records: list[Record]
) -> None:
    guard, _ = quick_guard()
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[object] = loop.create_future()
    held: asyncio.Future[object] = loop.create_future()
    failed.set_exception(KafkaTimeoutError())

    async def process() -> list[asyncio.Future[object]]:
        return [failed, held]

    delivery = asyncio.create_task(deliver_and_commit(consumer, records, process, guard=guard))
    await asyncio.sleep(0.05)
    assert not delivery.done()  # a rewind now would send the held record twice
    held.set_result(None)
    assert not await asyncio.wait_for(delivery, 1)


class Unreachable:
    async def fetch_all_metadata(self) -> CountingCluster:
        # what aiokafka raises when no broker answers a metadata request: a bare KafkaError
        raise KafkaError("Unable to get cluster metadata over all known brokers")


class UnreachableProducer:
    client = Unreachable()


async def test_a_reply_topic_check_in_an_outage_is_an_outage_not_a_crash(
    factory: MemoryFactory, consumer: MemoryConsumer, records: list[Record]
) -> None:
    # Regression (chaos bench, 60 s outage): a worker died of the bare KafkaError.
    guard, _ = quick_guard()
    sink = ReplySink(UnreachableProducer(), factory.layout, "test")  # type: ignore[arg-type]

    async def deliver() -> list[asyncio.Future[object]]:
        await sink.topic_exists(factory.layout.reply("c1"))
        return []

    assert not await deliver_and_commit(consumer, records, deliver, guard=guard)
    assert guard.faults[Fault.OUTAGE] == 1
    again = await polled(consumer)
    assert [r.offset for r in again] == [r.offset for r in records]  # rewound, not lost
