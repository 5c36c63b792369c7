"""Keep a consume loop up through Kafka's normal events.

A rebalance during a batch (partitions revoked, ``CommitFailedError``,
``IllegalStateError`` on a seek), a broker outage (``KafkaTimeoutError``,
``KafkaConnectionError``), a topic deleted under a running service: the batch is
abandoned or retried after a capped, jittered backoff, and the loop goes on.

:class:`BatchGuard` is the one object a service holds: its rebalance listener
lets an in-flight batch finish and commit before its partitions go to another
member, :meth:`BatchGuard.cycle` wraps one turn of the loop, and
:func:`graylane.kafka.delivery.deliver_and_commit` takes it to classify, count
and back off.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import replace
from enum import Enum
from types import TracebackType

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NoBrokersAvailable,
    NodeNotReadyError,
    RebalanceInProgressError,
    RequestTimedOutError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from prometheus_client import CollectorRegistry

from graylane.kafka.backoff import Backoff, BackoffPolicy
from graylane.kafka.membership import InstanceSlot, claim_instance
from graylane.kafka.options import ConsumerOptions
from graylane.kafka.recovering import is_fatal_for_producer
from graylane.kafka.seam import BatchConsumer, ClientFactory, Record
from graylane.metrics.kafka import KafkaMetrics

__all__ = ["BatchGuard", "Fault", "RevokeListener", "classify"]

log = logging.getLogger(__name__)


class Fault(Enum):
    """What kind of normal Kafka event an error is."""

    REBALANCE = "rebalance"
    OUTAGE = "outage"
    MISSING_TOPIC = "missing_topic"
    PRODUCER = "producer"
    OTHER = "other"


_REBALANCE = (
    CommitFailedError,
    IllegalStateError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    IllegalGenerationError,
)
_OUTAGE = (
    KafkaTimeoutError,
    KafkaConnectionError,
    NoBrokersAvailable,
    NodeNotReadyError,
    RequestTimedOutError,
)


def classify(exc: BaseException) -> Fault:
    """The kind of ``exc`` (pure; for logs and the fault metric)."""
    if isinstance(exc, _REBALANCE):
        return Fault.REBALANCE
    if isinstance(exc, UnknownTopicOrPartitionError):
        return Fault.MISSING_TOPIC
    if is_fatal_for_producer(exc):
        return Fault.PRODUCER
    if isinstance(exc, _OUTAGE) or getattr(exc, "retriable", False):
        return Fault.OUTAGE
    return Fault.OTHER


def partitions_of(records: Iterable[Record]) -> set[TopicPartition]:
    return {TopicPartition(r.topic, r.partition) for r in records}


class RevokeListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Before partitions go to another member, let the batch on them finish and commit."""

    def __init__(self, guard: BatchGuard) -> None:
        self._guard = guard

    async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        await self._guard.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        self._guard.assigned(set(assigned))


class _Cycle:
    def __init__(self, guard: BatchGuard) -> None:
        self._guard = guard

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if isinstance(exc, KafkaError) and classify(exc) is not Fault.OTHER:
            await self._guard.failed(exc, "fetch")
            return True
        return False


class BatchGuard:
    """Backoff, fault counting and the in-flight batch of one consume loop."""

    def __init__(
        self,
        service: str,
        *,
        registry: CollectorRegistry | None = None,
        policy: BackoffPolicy | None = None,
        revoke_wait_s: float = 10.0,
        rand: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.service = service
        self.backoff = Backoff(policy or BackoffPolicy(base_s=0.2, cap_s=5.0), rand=rand)
        self.revoke_wait_s = revoke_wait_s
        self.listener = RevokeListener(self)
        self.faults: dict[Fault, int] = dict.fromkeys(Fault, 0)
        self._metrics = KafkaMetrics.create(registry) if registry is not None else None
        self._sleep = sleep
        self._busy: set[TopicPartition] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.revocations = 0
        """Rebalances that found a batch in flight on a revoked partition."""
        self._on_fault: list[Callable[[Fault], None]] = []
        self._slots: list[InstanceSlot] = []

    # -- wiring ----------------------------------------------------------------
    def consumer(
        self,
        factory: ClientFactory,
        topics: Sequence[str],
        options: ConsumerOptions,
        *,
        role: str,
        client_suffix: str,
    ) -> BatchConsumer:
        """A group consumer of ``topics`` with a static instance id and this guard's listener.

        The id's slot is held until :meth:`close` (see :mod:`graylane.kafka.membership`).
        """
        slot = claim_instance(role, options.group_id or "", explicit=factory.settings.instance_id)
        self._slots.append(slot)
        log.info("%s: group %s, instance %s", self.service, options.group_id, slot.instance_id)
        options = replace(options, group_instance_id=slot.instance_id)
        consumer = factory.consumer(*topics, options=options, client_suffix=client_suffix)
        self.subscribe(consumer, topics)
        return consumer

    def close(self) -> None:
        """Free the instance ids claimed by :meth:`consumer` (after the consumer stopped)."""
        for slot in self._slots:
            slot.release()
        self._slots.clear()

    def on_fault(self, callback: Callable[[Fault], None]) -> None:
        """Call ``callback`` on every fault (e.g. to forget cached topic metadata)."""
        self._on_fault.append(callback)

    def subscribe(self, consumer: BatchConsumer, topics: Iterable[str]) -> None:
        """(Re)subscribe ``consumer`` to ``topics`` with this guard's rebalance listener."""
        consumer.subscribe(list(topics), listener=self.listener)

    def cycle(self) -> _Cycle:
        """``async with guard.cycle():`` one turn; a Kafka error is counted and backed off."""
        return _Cycle(self)

    # -- the batch in flight -----------------------------------------------------
    def begin(self, records: Sequence[Record]) -> None:
        self._busy = partitions_of(records)
        self._idle.clear()

    def end(self) -> None:
        self._busy = set()
        self._idle.set()

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        if not self._busy & revoked:
            return
        self.revocations += 1
        log.info(
            "%s: rebalance with a batch in flight on %d revoked partition(s); "
            "waiting up to %.0f s for it to be delivered and committed",
            self.service,
            len(self._busy & revoked),
            self.revoke_wait_s,
        )
        try:
            await asyncio.wait_for(self._idle.wait(), self.revoke_wait_s)
        except TimeoutError:
            log.warning(
                "%s: the batch in flight is abandoned to the rebalance; "
                "the partitions' next owner reads it again",
                self.service,
            )

    def assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("%s: %d partition(s) assigned", self.service, len(assigned))

    # -- faults ------------------------------------------------------------------
    def count(self, exc: BaseException) -> Fault:
        kind = classify(exc)
        self.faults[kind] += 1
        if self._metrics is not None:
            self._metrics.faults.labels(self.service, kind.value).inc()
        for callback in self._on_fault:
            callback(kind)
        return kind

    async def failed(self, exc: BaseException, during: str) -> None:
        """Count ``exc``, log it, and wait the next backoff delay."""
        kind = self.count(exc)
        delay = self.backoff.next_delay()
        log.warning(
            "%s: Kafka %s during %s (%r); going on in %.2f s",
            self.service,
            kind.value,
            during,
            exc,
            delay,
        )
        await self._sleep(delay)

    def succeeded(self) -> None:
        self.backoff.reset()
