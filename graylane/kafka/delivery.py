"""At-least-once processing of a fetched batch: commit only what was delivered.

A retriable broker error while forwarding a batch (a leader moving, a topic
just created) must neither crash the service nor lose the batch: the consumer
is rewound to the batch's first offsets and the batch is processed again.
Downstream readers see duplicates at worst, identifiable by request_id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from graylane.kafka.replies import settle
from graylane.kafka.seam import BatchConsumer, Record

log = logging.getLogger(__name__)


def next_offsets(records: Sequence[Record]) -> dict[TopicPartition, int]:
    """The offsets to commit once every record of the batch is handled."""
    offsets: dict[TopicPartition, int] = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
    return offsets


def first_offsets(records: Sequence[Record]) -> dict[TopicPartition, int]:
    offsets: dict[TopicPartition, int] = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        offsets[tp] = min(offsets.get(tp, r.offset), r.offset)
    return offsets


async def deliver_and_commit(
    consumer: BatchConsumer,
    records: Sequence[Record],
    process: Callable[[], Awaitable[list[Awaitable[object]]]],
    *,
    backoff_s: float = 0.5,
) -> bool:
    """Process, wait for every send to be acknowledged, then commit.

    Returns False (and rewinds) after a retriable Kafka error; raises others.
    """
    try:
        await settle(await process())
    except KafkaError as exc:
        if not exc.retriable:
            raise
        log.warning("retriable Kafka error (%s); processing %d records again", exc, len(records))
        for tp, offset in first_offsets(records).items():
            consumer.seek(tp, offset)
        await asyncio.sleep(backoff_s)
        return False
    await consumer.commit(next_offsets(records))
    return True
