"""At-least-once processing of a fetched batch: commit only what was delivered.

A retriable broker error while forwarding a batch (a leader moving, a topic
just created) must neither crash the service nor lose the batch: the consumer
is rewound to the batch's first offsets and the batch is processed again.
Downstream readers see duplicates at worst, identifiable by request_id.

With a :class:`~graylane.kafka.guard.BatchGuard` every Kafka error is survived:
a failed send rewinds the partitions still assigned and backs off; a failed
commit (the partitions went to another member in a rebalance) leaves the batch
to their next owner. Sends are made through a
:class:`~graylane.kafka.recovering.RecoveringProducer`, which re-sends what the
broker did not acknowledge itself, so a rewind is the last resort.

A rebalance (a replica joining or leaving the group) may take partitions away
while their batch is being processed: only the partitions still assigned are
committed, and a commit the group refuses is logged, not raised. The new owner
reads those records again (at-least-once), and the service keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from graylane.kafka.guard import BatchGuard, Fault, classify
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
    guard: BatchGuard | None = None,
) -> bool:
    """Process, wait for every send to be acknowledged, then commit.

    Returns False (and rewinds) after a retriable Kafka error; raises others,
    unless a ``guard`` is given: then every Kafka error returns False.
    """
    if guard is not None:
        return await _guarded(consumer, records, process, guard)
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
    offsets = next_offsets(records)
    assigned = consumer.assignment()
    kept = {tp: offset for tp, offset in offsets.items() if tp in assigned}
    if len(kept) < len(offsets):
        gone = sorted(f"{tp.topic}[{tp.partition}]" for tp in offsets if tp not in kept)
        log.info("revoked during the batch, not committed (the new owner reads them): %s", gone)
    if not kept:
        return True
    try:
        await consumer.commit(kept)
    except (CommitFailedError, IllegalStateError) as exc:
        log.warning("commit refused after a rebalance (%s); the new owner reads them again", exc)
    return True


def rewind(consumer: BatchConsumer, records: Sequence[Record]) -> None:
    """Seek back to the batch's first offsets, on the partitions still assigned."""
    assigned = consumer.assignment()
    for tp, offset in first_offsets(records).items():
        if tp not in assigned:
            continue  # revoked: its next owner reads from the last commit
        try:
            consumer.seek(tp, offset)
        except IllegalStateError:  # revoked between the check and the seek
            continue


async def _guarded(
    consumer: BatchConsumer,
    records: Sequence[Record],
    process: Callable[[], Awaitable[list[Awaitable[object]]]],
    guard: BatchGuard,
) -> bool:
    guard.begin(records)
    try:
        try:
            await _settle_all(await process())
        except KafkaError as exc:
            if classify(exc) is Fault.OTHER:
                raise  # not one of Kafka's normal events: nothing is committed
            rewind(consumer, records)
            await guard.failed(exc, f"delivery of {len(records)} records")
            return False
        assigned = consumer.assignment()
        offsets = {tp: o for tp, o in next_offsets(records).items() if tp in assigned}
        try:
            if offsets:
                await consumer.commit(offsets)
        except KafkaError as exc:
            if classify(exc) is Fault.OTHER:
                raise
            await guard.failed(exc, "commit")
            return False
        guard.succeeded()
        return True
    finally:
        guard.end()


async def _settle_all(futures: list[Awaitable[object]]) -> None:
    """Wait for every send to succeed or fail (none left in flight), then raise the first error."""
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
