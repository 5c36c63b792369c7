"""The self-recovering producer, against a fake that raises aiokafka's real errors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
)
from aiokafka.structs import RecordMetadata, TopicPartition

from graylane.kafka.recovering import RecoveringProducer, is_fatal_for_producer
from graylane.kafka.seam import KafkaFactory, Producer
from graylane.settings import Settings


@dataclass
class FakeCluster:
    """Producers share it: what was accepted, and how the next sends fail."""

    accepted: list[tuple[int, bytes | None]] = field(default_factory=list)
    fail_future: list[BaseException] = field(default_factory=list)
    fail_send: list[BaseException] = field(default_factory=list)
    fail_start: list[BaseException] = field(default_factory=list)
    broken: set[int] = field(default_factory=set)
    """Generations whose every send fails with OutOfOrderSequenceNumber (a sequence gap)."""
    silent: set[int] = field(default_factory=set)
    """Generations whose sends are never answered (a request lost with its connection)."""
    built: int = 0


class FakeProducer:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.generation = cluster.built
        cluster.built += 1
        self.stopped = False

    @property
    def client(self) -> object:
        return None

    async def start(self) -> None:
        if self.cluster.fail_start:
            raise self.cluster.fail_start.pop(0)

    async def stop(self) -> None:
        self.stopped = True

    async def flush(self) -> None:
        await asyncio.sleep(0)

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: object = None,
    ) -> asyncio.Future[RecordMetadata]:
        if self.stopped:
            raise ProducerClosed()
        if self.cluster.fail_send:
            raise self.cluster.fail_send.pop(0)
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        if self.generation in self.cluster.silent:
            return future  # never resolves
        if self.generation in self.cluster.broken:
            future.set_exception(OutOfOrderSequenceNumber())
        elif self.cluster.fail_future:
            future.set_exception(self.cluster.fail_future.pop(0))
        else:
            self.cluster.accepted.append((self.generation, value))
            offset = len(self.cluster.accepted) - 1
            future.set_result(
                RecordMetadata(topic, 0, TopicPartition(topic, 0), offset, -1, -1, -1)
            )
        return future

    async def send_and_wait(self, topic: str, value: bytes | None = None, **kw: object) -> object:
        return await (await self.send(topic, value))


def wrapper(cluster: FakeCluster, **kwargs: float) -> RecoveringProducer:
    return RecoveringProducer(lambda: FakeProducer(cluster), **kwargs)  # type: ignore[arg-type,return-value]


async def test_a_sequence_gap_rebuilds_the_producer_and_resends_only_the_unacked() -> None:
    cluster = FakeCluster()
    producer = wrapper(cluster)
    await producer.start()
    assert (await producer.send_and_wait("t", b"before")).offset == 0
    cluster.broken.add(0)  # the outage left generation 0 with a gap
    metadata = await producer.send_and_wait("t", b"during")
    assert metadata.offset == 1
    assert cluster.accepted == [(0, b"before"), (1, b"during")]  # "before" not sent again
    assert producer.recreated == 1 and producer.generation == 1
    await producer.send_and_wait("t", b"after")  # the same instance keeps working
    assert cluster.accepted[-1] == (1, b"after")
    await producer.stop()


async def test_every_record_in_flight_is_resent_once_on_one_new_producer() -> None:
    cluster = FakeCluster()
    producer = wrapper(cluster)
    await producer.start()
    cluster.broken.add(0)
    futures = [await producer.send("t", bytes([i])) for i in range(5)]
    await asyncio.gather(*futures)
    assert sorted(v for _, v in cluster.accepted) == [bytes([i]) for i in range(5)]
    assert {g for g, _ in cluster.accepted} == {1}
    assert producer.recreated == 1


@pytest.mark.parametrize("error", [KafkaTimeoutError(), OutOfOrderSequenceNumber()])
async def test_a_timed_out_or_fatal_batch_is_resent_on_a_new_producer(error: Exception) -> None:
    cluster = FakeCluster(fail_future=[error])
    producer = wrapper(cluster)
    await producer.start()
    await producer.send_and_wait("t", b"x")
    assert cluster.accepted == [(1, b"x")]


async def test_an_ack_that_never_comes_is_a_timeout_then_a_resend_on_a_new_producer() -> None:
    cluster = FakeCluster(silent={0})
    producer = wrapper(cluster, delivery_timeout_s=0.05)
    await producer.start()
    metadata = await asyncio.wait_for(producer.send_and_wait("t", b"x"), 5)
    assert cluster.accepted == [(1, b"x")] and metadata.offset == 0
    assert producer.recreated == 1
    await producer.stop()


async def test_when_no_producer_acks_the_caller_gets_a_timeout_not_a_hang() -> None:
    cluster = FakeCluster(silent={0, 1})
    producer = wrapper(cluster, delivery_timeout_s=0.05)
    await producer.start()
    with pytest.raises(KafkaTimeoutError, match="no broker ack within"):
        await asyncio.wait_for(producer.send_and_wait("t", b"x"), 5)
    assert not cluster.accepted
    await producer.stop()


async def test_an_ordinary_error_reaches_the_caller_without_a_rebuild() -> None:
    cluster = FakeCluster(fail_future=[MessageSizeTooLargeError()])
    producer = wrapper(cluster)
    await producer.start()
    with pytest.raises(MessageSizeTooLargeError):
        await producer.send_and_wait("t", b"x")
    assert producer.recreated == 0
    assert not is_fatal_for_producer(MessageSizeTooLargeError())


async def test_failure_while_the_broker_is_away_surfaces_then_the_same_instance_recovers() -> None:
    cluster = FakeCluster()
    producer = wrapper(cluster)
    await producer.start()
    cluster.broken.add(0)
    cluster.fail_start.append(KafkaConnectionError("broker down"))
    with pytest.raises(KafkaConnectionError):
        await producer.send_and_wait("t", b"lost-to-the-caller")  # surfaced, not swallowed
    assert cluster.accepted == []
    await producer.send_and_wait("t", b"after")  # broker back: rebuilt on the next send
    assert cluster.accepted == [(2, b"after")]


async def test_a_start_that_hangs_is_bounded_and_reported_as_a_kafka_timeout() -> None:
    cluster = FakeCluster()
    producer = wrapper(cluster, start_timeout_s=0.05)
    await producer.start()
    cluster.broken.add(0)

    class Hanging(FakeProducer):
        async def start(self) -> None:
            await asyncio.sleep(10)

    producer._make = lambda: Hanging(cluster)  # type: ignore[assignment,return-value]
    with pytest.raises(KafkaTimeoutError):
        await producer.send_and_wait("t", b"x")


async def test_a_closed_inner_producer_is_replaced_at_send_time() -> None:
    cluster = FakeCluster(fail_send=[ProducerClosed()])
    producer = wrapper(cluster)
    await producer.start()
    await producer.send_and_wait("t", b"x")
    assert cluster.accepted == [(1, b"x")]


async def test_resends_are_bounded() -> None:
    cluster = FakeCluster()
    producer = wrapper(cluster)
    await producer.start()
    cluster.broken.update(range(10))  # every producer is broken
    with pytest.raises(OutOfOrderSequenceNumber):
        await producer.send_and_wait("t", b"x")
    assert producer.recreated == 1


async def test_the_factory_hands_out_recovering_producers() -> None:
    producer: Producer = KafkaFactory(Settings()).producer()
    assert isinstance(producer, RecoveringProducer)
    assert isinstance(producer, Producer)
