"""At-least-once batch delivery against the real broker: a retriable error while
forwarding rewinds the batch instead of crashing or committing it (regression:
the router died on NotLeaderForPartitionError for a just-created topic)."""

from __future__ import annotations

from collections.abc import Awaitable

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import NotLeaderForPartitionError, UnknownTopicOrPartitionError

from graylane.kafka.admin import ensure_topics
from graylane.kafka.delivery import deliver_and_commit
from graylane.kafka.seam import ConsumerOptions, KafkaFactory

pytestmark = pytest.mark.kafka


async def test_a_retriable_error_rewinds_and_a_later_try_commits(factory: KafkaFactory) -> None:
    topic = factory.layout.ingress("gpt")
    await ensure_topics(factory, factory.layout.model_specs("gpt", []))
    producer = factory.producer()
    await producer.start()
    for i in range(5):
        await producer.send_and_wait(topic, f"r{i}".encode(), key=b"same-key")
    await producer.stop()

    group = f"{factory.settings.topic_prefix}-delivery"
    consumer = factory.consumer(topic, options=ConsumerOptions(group_id=group))
    await consumer.start()
    try:
        records = []
        while len(records) < 5:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                records.extend(batch)
        tp = TopicPartition(topic, records[0].partition)
        attempts = []

        async def flaky() -> list[Awaitable[object]]:
            attempts.append(1)
            if len(attempts) == 1:
                raise NotLeaderForPartitionError()
            return []

        assert not await deliver_and_commit(consumer, records, flaky, backoff_s=0.0)
        assert await consumer.committed(tp) is None  # nothing committed
        again = []
        while len(again) < 5:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                again.extend(batch)
        assert [r.value for r in again] == [r.value for r in records]  # the same batch
        assert await deliver_and_commit(consumer, again, flaky, backoff_s=0.0)
        assert await consumer.committed(tp) == records[-1].offset + 1

        async def fatal() -> list[Awaitable[object]]:
            error = UnknownTopicOrPartitionError()
            error.retriable = False  # a non-retriable error still surfaces
            raise error

        with pytest.raises(UnknownTopicOrPartitionError):
            await deliver_and_commit(consumer, again, fatal)
    finally:
        await consumer.stop()
