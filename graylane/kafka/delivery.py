"""Delivering a batch: every send acknowledged, then the offsets after it committed.

:func:`deliver_and_commit` is one batch's delivery for a loop that waits on its sends
(the consume loop's default, one batch at a time): process, wait until every send is
acknowledged (none left in flight), then commit the next offsets on the partitions
still assigned. A normal fault rewinds the batch and backs off; with an ``isolate``
step, an error of no known kind is one record's doing, dealt with record by record.
The offset helpers here (next and first offsets of a batch, seeking back on the
partitions still assigned) serve the pipelined loop too.

At-least-once: a batch is committed only once all its sends were acknowledged, so a
crash re-reads rather than loses; downstream readers see duplicates at worst,
identifiable by request_id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from graylane.errors import ErrorCode
from graylane.kafka.fault import Fault, classify, is_normal
from graylane.kafka.guard import BatchGuard
from graylane.kafka.seam import BatchConsumer, Record

__all__ = [
    "Commit",
    "DeadLetter",
    "Isolate",
    "Sends",
    "deliver_and_commit",
    "first_offsets",
    "next_offsets",
    "rewind",
    "seek_back",
    "settle",
    "settle_all",
]

log = logging.getLogger(__name__)

Sends = list[Awaitable[object]]
Commit = Callable[[dict[TopicPartition, int]], Awaitable[None]]
Isolate = Callable[[BaseException], Awaitable[None]]
DeadLetter = Callable[[Record, ErrorCode, str], Awaitable[Awaitable[object]]]
"""Queue a dead letter for a record (e.g. :meth:`graylane.kafka.replies.ReplySink.dead_letter`)."""


async def settle(futures: Sequence[Awaitable[object]]) -> None:
    """Wait until every queued send is acknowledged by the broker."""
    if futures:
        await asyncio.gather(*futures)


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


def rewind(consumer: BatchConsumer, records: Sequence[Record]) -> None:
    """Seek back to the batch's first offsets, on the partitions still assigned."""
    seek_back(consumer, first_offsets(records))


def seek_back(consumer: BatchConsumer, offsets: Mapping[TopicPartition, int]) -> None:
    """Seek to ``offsets``, on the partitions still assigned."""
    assigned = consumer.assignment()
    for tp, offset in offsets.items():
        if tp not in assigned:
            continue  # revoked: its next owner reads from the last commit
        try:
            consumer.seek(tp, offset)
        except IllegalStateError:  # revoked between the check and the seek
            continue


async def deliver_and_commit(
    consumer: BatchConsumer,
    records: Sequence[Record],
    process: Callable[[], Awaitable[Sends]],
    *,
    backoff_s: float = 0.5,
    guard: BatchGuard | None = None,
    commit: Commit | None = None,
    isolate: Isolate | None = None,
) -> bool:
    """Process, wait for every send to be acknowledged, then commit.

    Only the partitions still assigned are committed (a rebalance may have taken
    some away mid-batch: their new owner reads those records again), to Kafka or
    through ``commit``. Returns False (and rewinds) after a retriable error; raises
    others. Without a ``guard``, only a retriable Kafka error is retried (after
    ``backoff_s``) and a commit the group refuses is logged, not raised; with one,
    every normal fault and every ``retriable`` error is retried, counted and backed off,
    and with ``isolate`` too, an error of no known kind is given to ``isolate(exc)``
    (which deals with the batch record by record) and the batch is committed after it.
    """
    if guard is not None:
        return await _guarded(consumer, records, process, guard, commit, isolate)
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
        await (commit or consumer.commit)(kept)
    except (CommitFailedError, IllegalStateError) as exc:
        log.warning("commit refused after a rebalance (%s); the new owner reads them again", exc)
    return True


async def _guarded(
    consumer: BatchConsumer,
    records: Sequence[Record],
    process: Callable[[], Awaitable[Sends]],
    guard: BatchGuard,
    commit: Commit | None,
    isolate: Isolate | None,
) -> bool:
    guard.begin(records)
    try:
        try:
            try:
                await settle_all(await process())
            except Exception as exc:
                if isolate is None or classify(exc) is not Fault.OTHER:
                    raise
                await isolate(exc)  # one record's doing: record by record, passing it over
        except Exception as exc:
            if not is_normal(classify(exc)):
                raise  # lost credentials (or no isolate): nothing is committed
            rewind(consumer, records)
            await guard.failed(exc, f"delivery of {len(records)} records")
            return False
        assigned = consumer.assignment()
        offsets = {tp: o for tp, o in next_offsets(records).items() if tp in assigned}
        try:
            if offsets:
                await (commit or consumer.commit)(offsets)
        except Exception as exc:
            if not is_normal(classify(exc)):
                raise
            if commit is not None:
                rewind(consumer, records)  # offsets kept elsewhere: read the batch again
            await guard.failed(exc, "commit")
            return False
        guard.succeeded()
        return True
    finally:
        guard.end()


async def settle_all(futures: Sequence[Awaitable[object]]) -> None:
    """Wait for every send to succeed or fail (none left in flight), then raise the first error."""
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
