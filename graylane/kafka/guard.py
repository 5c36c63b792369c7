"""The guard of one consume loop: backoff, fault counts, and the batch in flight.

:class:`BatchGuard` builds the loop's group consumer (a static member, its id claimed
by :func:`~graylane.kafka.membership.claim_instance`), counts every fault by kind (and
in the ``faults`` metric), waits the backoff after a normal one, and holds the batch in
flight: its rebalance listener (:class:`RevokeListener`) lets that batch finish and
commit before its partitions go to another member, waiting at most ``revoke_wait_s``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import replace
from types import TracebackType

from aiokafka import ConsumerRebalanceListener, TopicPartition
from prometheus_client import CollectorRegistry

from graylane.kafka.backoff import Backoff, BackoffPolicy
from graylane.kafka.fault import Fault, classify, is_normal
from graylane.kafka.membership import InstanceSlot, claim_instance
from graylane.kafka.seam import BatchConsumer, ClientFactory, ConsumerOptions, Record
from graylane.metrics.kafka import KafkaMetrics

__all__ = ["BatchGuard", "Drain", "FaultCallback", "RevokeListener", "partitions_of"]

log = logging.getLogger(__name__)


def partitions_of(records: Iterable[Record]) -> set[TopicPartition]:
    return {TopicPartition(r.topic, r.partition) for r in records}


FaultCallback = Callable[[Fault, BaseException], None]
Drain = Callable[[set[TopicPartition], float], Awaitable[None]]
"""Settle and commit what is in flight on revoked partitions, waiting at most the seconds
given (calling :meth:`BatchGuard.count_revocation` if anything is)."""


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
        if isinstance(exc, Exception) and is_normal(classify(exc)):
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
        self._stop: asyncio.Event | None = None
        self._busy: set[TopicPartition] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.revocations = 0
        """Rebalances that found a batch in flight on a revoked partition."""
        self._counted = False
        self._on_fault: list[FaultCallback] = []
        self._slots: list[InstanceSlot] = []
        self._drain: Drain | None = None
        self._reassigned: Callable[[set[TopicPartition]], None] | None = None

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

        The id's slot is held until :meth:`close`.
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

    def on_fault(self, callback: FaultCallback) -> None:
        """Call ``callback(kind, exc)`` on every fault (e.g. to forget cached topic metadata)."""
        self._on_fault.append(callback)

    def interrupt_on(self, stop: asyncio.Event) -> None:
        """End a backoff wait early once ``stop`` is set."""
        self._stop = stop

    @property
    def stopping(self) -> asyncio.Event | None:
        """The event given to :meth:`interrupt_on`, if any."""
        return self._stop

    def drain_on_revoke(
        self, drain: Drain, reassigned: Callable[[set[TopicPartition]], None]
    ) -> None:
        """Before revoked partitions go, also await ``drain(revoked, wait_s)`` (what a
        pipelined loop has in flight), ``wait_s`` being what is left of ``revoke_wait_s``;
        once the group has assigned partitions again, call ``reassigned(assigned)``."""
        self._drain = drain
        self._reassigned = reassigned

    @property
    def metrics(self) -> KafkaMetrics | None:
        """The Kafka metrics of this loop (None without a registry)."""
        return self._metrics

    def subscribe(self, consumer: BatchConsumer, topics: Iterable[str]) -> None:
        """(Re)subscribe ``consumer`` to ``topics`` with this guard's rebalance listener."""
        consumer.subscribe(list(topics), listener=self.listener)

    def cycle(self) -> _Cycle:
        """``async with guard.cycle():`` one turn; a normal fault is counted and backed off."""
        return _Cycle(self)

    # -- the batch in flight -----------------------------------------------------
    def begin(self, records: Sequence[Record]) -> None:
        self._busy = partitions_of(records)
        self._idle.clear()

    def end(self) -> None:
        self._busy = set()
        self._idle.set()

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        started = asyncio.get_running_loop().time()
        self._counted = bool(self._busy & revoked)
        if self._counted:
            await self._batch_done(revoked)
        if self._drain is not None:
            spent = asyncio.get_running_loop().time() - started
            await self._drain(revoked, max(0.0, self.revoke_wait_s - spent))

    def count_revocation(self) -> None:
        """Count the rebalance under way as one that found something in flight (once)."""
        if not self._counted:
            self._counted = True
            self.revocations += 1

    async def _batch_done(self, revoked: set[TopicPartition]) -> None:
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
        if self._reassigned is not None:
            self._reassigned(assigned)

    # -- faults ------------------------------------------------------------------
    def count(self, exc: BaseException) -> Fault:
        kind = classify(exc)
        self._tally(kind)
        for callback in self._on_fault:
            callback(kind, exc)
        return kind

    def passed_over(self, record: Record, why: str) -> None:
        """Count and log one record the loop passes over (:attr:`Fault.RECORD`)."""
        self._tally(Fault.RECORD)
        log.warning(
            "%s: record %s[%d]@%d passed over: %s",
            self.service,
            record.topic,
            record.partition,
            record.offset,
            why[:300],
        )

    def _tally(self, kind: Fault) -> None:
        self.faults[kind] += 1
        if self._metrics is not None:
            self._metrics.faults.labels(self.service, kind.value).inc()

    async def failed(self, exc: BaseException, during: str) -> None:
        """Count ``exc``, log it, and wait the next backoff delay."""
        kind = self.count(exc)
        delay = self.backoff.next_delay()
        log.warning(
            "%s: %s during %s (%r); going on in %.2f s",
            self.service,
            kind.value,
            during,
            exc,
            delay,
        )
        await self._pause(delay)

    async def _pause(self, delay: float) -> None:
        if self._stop is None:
            await self._sleep(delay)
            return
        if self._stop.is_set():
            return
        sleeping = asyncio.ensure_future(self._sleep(delay))
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({sleeping, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            stopping.cancel()

    def succeeded(self) -> None:
        self.backoff.reset()
