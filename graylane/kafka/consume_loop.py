"""The one consume loop: fetch -> handle -> deliver -> commit, through Kafka's normal events.

Every service that consumes a topic in batches (the router, the workers, the audit
sink) runs :class:`ConsumeLoop` with its own :class:`LoopHooks`; the loop owns the
consumer's lifecycle and every Kafka rule, the hooks own what a batch means::

    loop = ConsumeLoop("router", factory, topics, options, role="router",
                       client_suffix="router", registry=registry)
    loop.guard.on_fault(sink.forget)           # e.g. forget cached topic metadata
    await loop.start()                         # static member of the group, started
    try:
        await loop.run(stop, LoopHooks(handle=route_batch), healthy=lambda: tasks.healthy)
    finally:
        await loop.stop()                      # leaves the group at once, frees the id

One turn of :meth:`ConsumeLoop.run`:

1. ``before_fetch()`` (the router settles pending routing tables here);
2. fetch: ``fetch(consumer)`` or one ``getmany`` of up to ``poll_ms``;
3. ``handle(records)`` decodes and answers the batch, returning the sends to wait on
   (a record whose headers are damaged goes to ``dead_letter`` instead);
4. deliver: every send is acknowledged (none left in flight) before anything else;
5. commit the offsets after the batch, on the partitions still assigned
   (``commit(offsets)`` for offsets kept elsewhere, e.g. in a database);
6. ``after_turn(consumer)`` (lag and assignment metrics).

A service adopts it by moving its ``run()`` body into hooks: what it fetches its own
way (the worker waits after the first record for a batch to fill) is ``fetch``; what
it answered by hand inside ``deliver_and_commit(consumer, records, process, guard=)``
is ``handle``; per-turn chores (settling tables, lag gauges) are ``before_fetch`` and
``after_turn``; what it did in its ``finally`` for the consumer (``leave_on_stop``,
``consumer.stop()``, ``guard.close()``) is :meth:`ConsumeLoop.stop`. Its own clients
(producer, followers) and background tasks stay its own: ``healthy`` ends the loop
when one of them died. A test drives one turn with :meth:`ConsumeLoop.turn`.

At-least-once: a batch is committed only once all its sends were acknowledged, so a
crash re-reads rather than loses; downstream readers see duplicates at worst,
identifiable by request_id.

Pipelined (``ConsumeLoop(..., max_in_flight=N)``, N > 1; the default 1 is the turn
above): step 4 does not wait. The batch's sends become one in-flight cycle of
:class:`~graylane.kafka.in_flight.InFlightCycles` and the loop fetches again while
fewer than N cycles are uncommitted (at N, a turn first waits for the oldest to
settle), so delivery overlaps the next fetch and compute, and a handler whose sends
resolve late (a generation acknowledged many seconds after it was submitted) still
sees the records that follow.
Offsets are committed in fetch order as acknowledgements arrive: per partition, the
highest next offset of the prefix of settled cycles, never past a record whose sends
are not all acknowledged; once per turn, and when the loop drains. A cycle whose sends
fail with a normal fault rewinds the consumer to its first records and drops the
cycles after it (read again: duplicates, never a gap); an error of no known kind has
that cycle handled record by record (below); lost credentials end the loop with
nothing more committed. A revocation drains what is in flight on the revoked
partitions (up to ``revoke_wait_s``) and commits it before they go; a clean stop
drains too.

Errors carry their own policy. A rebalance (partitions revoked mid-batch,
``CommitFailedError``, ``IllegalStateError`` on a seek), a broker outage, a topic
deleted under a running service, a broken producer, and any exception whose class
says ``retriable = True`` (:class:`~graylane.errors.GraylaneError` and Kafka's
errors both carry the flag) rewind the batch on the partitions still assigned and
retry it after a capped, jittered :class:`~graylane.kafka.backoff.Backoff`; the loop
goes on (:mod:`graylane.kafka.fault` says which is which). Lost credentials or
authorization (:attr:`~graylane.kafka.fault.Fault.FATAL`) propagate: nothing of the batch
is committed and the service ends, for a restart (new credentials, new ACLs) to fix.

No record ends the loop. Anything else raised while a batch is handled or delivered
is one record's doing: the batch is handled again record by record, each failing
record goes to ``dead_letter`` (or is logged and counted, ``Fault.RECORD``), and
the batch is committed past it. A fetch that fails that way (the library hides which
record it could not read) is read again partition by partition, one record at a
time from where the last turn left it, and the record it cannot read is passed over
(dead-lettered with what is known of it: topic, partition, offset).

:class:`~graylane.kafka.guard.BatchGuard` holds the backoff, the fault counts and the
batch in flight; its rebalance listener lets an in-flight batch finish and commit
before its partitions go to another member. Group members get a static
``group.instance.id`` (:mod:`graylane.kafka.membership`): a restarted process takes its
partitions back at once, and :meth:`ConsumeLoop.stop` still hands them over at once on
a clean stop. One batch is delivered by :func:`~graylane.kafka.delivery.deliver_and_commit`;
the pipelined mode's bookkeeping is :class:`~graylane.kafka.in_flight.InFlightCycles`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry

from graylane.errors import ErrorCode, require_started
from graylane.kafka.backoff import BackoffPolicy
from graylane.kafka.delivery import (
    Commit,
    DeadLetter,
    Sends,
    deliver_and_commit,
    rewind,
    seek_back,
    settle_all,
)
from graylane.kafka.fault import Fault, classify, is_normal
from graylane.kafka.guard import BatchGuard
from graylane.kafka.in_flight import InFlightCycles
from graylane.kafka.membership import leave_on_stop
from graylane.kafka.seam import (
    BatchConsumer,
    ClientFactory,
    ConsumerOptions,
    Record,
    header_damage,
    readable,
)
from graylane.metrics.process import loop_heartbeat

__all__ = ["ConsumeLoop", "LoopHooks"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LoopHooks:
    """A service's part of :class:`ConsumeLoop`; only ``handle`` is required."""

    handle: Callable[[list[Record]], Awaitable[Sends]]
    """Decode and answer a fetched batch; returns the sends to wait on before committing.
    A record that cannot be served is answered here (error result, dead letter, skip)."""
    fetch: Callable[[BatchConsumer], Awaitable[list[Record]]] | None = None
    """One turn's records (default: one ``getmany`` of up to ``poll_ms``)."""
    before_fetch: Callable[[], Awaitable[None]] | None = None
    """Run at the start of every turn."""
    after_turn: Callable[[BatchConsumer], Awaitable[None]] | None = None
    """Run at the end of every turn, with or without records (metrics)."""
    commit: Commit | None = None
    """Where a delivered batch's next offsets go (default: the group's commit in Kafka)."""
    dead_letter: DeadLetter | None = None
    """Where a record the loop passes over goes (default: logged and counted only)."""


class ConsumeLoop:
    """One consumer's loop: fetch -> handle -> deliver -> commit, until stopped.

    With ``options.group_id`` the consumer is a static member of that group (an
    instance id claimed for ``role``) whose rebalances the :attr:`guard` handles;
    without, it reads every partition of ``topics`` and ``position`` (given to
    :meth:`start`) puts it where to begin. ``policy`` is the backoff between
    retries (default 0.2 s doubling to 5 s).

    ``max_in_flight`` > 1 pipelines it: a turn's sends are tracked as one cycle of
    :class:`InFlightCycles` instead of being awaited, and the loop goes on fetching
    while fewer than ``max_in_flight`` cycles are uncommitted (at the cap, a turn
    first waits for the oldest to settle). Offsets are committed in fetch order as
    acknowledgements arrive (once per turn, and on a drain); a cycle whose sends fail
    rewinds the loop to its records, dropping the cycles after it (their records are
    read again: duplicates, never a gap). ``revoke_wait_s`` bounds the wait for what
    is in flight when partitions are revoked, and on a clean stop (:meth:`drain`).
    """

    def __init__(
        self,
        service: str,
        factory: ClientFactory,
        topics: Sequence[str],
        options: ConsumerOptions,
        *,
        role: str,
        client_suffix: str,
        registry: CollectorRegistry | None = None,
        policy: BackoffPolicy | None = None,
        poll_ms: int = 200,
        max_records: int | None = None,
        max_in_flight: int = 1,
        revoke_wait_s: float = 10.0,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight counts cycles: at least 1")
        self.service = service
        self.guard = BatchGuard(
            service, registry=registry, policy=policy, revoke_wait_s=revoke_wait_s
        )
        self._factory = factory
        self._topics = tuple(topics)
        self._options = options
        self._role = role
        self._suffix = client_suffix
        self._poll_ms = poll_ms
        self._max_records = max_records
        self._consumer: BatchConsumer | None = None
        self._resume: dict[TopicPartition, int] = {}
        """Each partition's position before the last default fetch."""
        self._cycles = InFlightCycles(max_in_flight) if max_in_flight > 1 else None
        """The pipelined mode's bookkeeping (None: one batch at a time)."""
        self._flights: dict[int, _Flight] = {}
        self._loose: set[asyncio.Future[BaseException | None]] = set()
        """Sends of cycles no longer tracked (dropped, abandoned to a rebalance)."""
        self._commit_lock = asyncio.Lock()
        self._commit_to: Commit | None = None
        """The last turn's ``hooks.commit`` (a drain commits there too)."""
        self._retry_from = 0
        """The first cycle opened after the last failure: its commit resets the backoff."""
        self._recovered = False
        if self._cycles is not None:
            self.guard.drain_on_revoke(self._drain_revoked, self._reassigned)

    @property
    def max_in_flight(self) -> int:
        return 1 if self._cycles is None else self._cycles.cap

    @property
    def in_flight(self) -> int:
        """Cycles handled and not committed yet (always 0 with ``max_in_flight=1``)."""
        return 0 if self._cycles is None else len(self._cycles)

    @property
    def _book(self) -> InFlightCycles:
        if self._cycles is None:
            raise AssertionError("a loop with max_in_flight=1 tracks no cycles")
        return self._cycles

    @property
    def consumer(self) -> BatchConsumer:
        """The started consumer (:class:`~graylane.errors.NotStartedError` before)."""
        return require_started(self._consumer)

    async def start(
        self, position: Callable[[BatchConsumer], Awaitable[None]] | None = None
    ) -> BatchConsumer:
        """Build and start the consumer; then ``position(consumer)`` if given."""
        if self._options.group_id:
            consumer = self.guard.consumer(
                self._factory,
                self._topics,
                self._options,
                role=self._role,
                client_suffix=self._suffix,
            )
        else:
            consumer = self._factory.consumer(
                *self._topics, options=self._options, client_suffix=self._suffix
            )
        try:
            await consumer.start()
            if position is not None:
                await position(consumer)
        except BaseException:
            await consumer.stop()
            self.guard.close()
            raise
        self._consumer = consumer
        return consumer

    async def turn(self, hooks: LoopHooks) -> int:
        """One turn (see the module's docstring); the number of records fetched."""
        if self._cycles is not None:
            return await self._pipelined_turn(hooks, self._cycles)
        consumer = self.consumer
        async with self.guard.cycle():
            if hooks.before_fetch is not None:
                await hooks.before_fetch()
            unreadable: list[Record] = []
            if hooks.fetch is not None:
                records = await hooks.fetch(consumer)
            else:
                records, unreadable = await self._fetch(consumer)
            if records or unreadable:
                entries = _entries(records, unreadable)
                await deliver_and_commit(
                    consumer,
                    unreadable + records,
                    lambda: self._process(hooks, entries),
                    guard=self.guard,
                    commit=hooks.commit,
                    isolate=lambda exc: self._one_by_one(hooks, entries, exc),
                )
                records += unreadable
            if hooks.after_turn is not None:
                await hooks.after_turn(consumer)
            return len(records)
        return 0  # a normal fault, counted and backed off

    async def _fetch(self, consumer: BatchConsumer) -> tuple[list[Record], list[Record]]:
        """One ``getmany``; if it fails for no known reason, :meth:`_read_around` it.
        Returns the records read and stand-ins for those that could not be read."""
        for tp in consumer.assignment():
            self._resume[tp] = await consumer.position(tp)
        try:
            batches = await consumer.getmany(
                timeout_ms=self._poll_ms, max_records=self._max_records
            )
        except Exception as exc:
            if classify(exc) is not Fault.OTHER:
                raise
            return await self._read_around(consumer, exc)
        return [r for rs in batches.values() for r in rs], []

    async def _read_around(
        self, consumer: BatchConsumer, exc: BaseException
    ) -> tuple[list[Record], list[Record]]:
        """Read each partition again from before the failed fetch, one record at a
        time; the record a read fails on is passed over (a stand-in names it)."""
        log.warning("%s: a fetch failed (%r); reading record by record", self.service, exc)
        records: list[Record] = []
        unreadable: list[Record] = []
        limit = self._max_records or 500
        for tp in sorted(consumer.assignment()):
            if tp in self._resume:
                consumer.seek(tp, self._resume[tp])
            while len(records) < limit:
                at = await consumer.position(tp)
                try:
                    got = await consumer.getmany(tp, timeout_ms=self._poll_ms, max_records=1)
                except Exception as again:
                    if classify(again) is not Fault.OTHER:
                        raise
                    consumer.seek(tp, at + 1)
                    unreadable.append(_stand_in(tp, at))
                    break
                if not got.get(tp):
                    break
                records.extend(got[tp])
        return records, unreadable

    async def _process(
        self, hooks: LoopHooks, entries: list[tuple[Record, ErrorCode, str | None]]
    ) -> Sends:
        """Dead letters for the damaged records, then ``handle`` of the others."""
        sends: Sends = []
        for record, code, why in entries:
            if why is not None:
                sends += await self._pass_over(hooks, record, code, why)
        good = [record for record, _, why in entries if why is None]
        if good:
            sends += await hooks.handle(good)
        return sends

    async def _one_by_one(
        self,
        hooks: LoopHooks,
        entries: list[tuple[Record, ErrorCode, str | None]],
        exc: BaseException,
    ) -> None:
        """The batch again, one record at a time: a record that fails (or whose dead
        letter fails) for no known reason is passed over; a known fault still raises."""
        log.warning(
            "%s: a batch of %d failed (%r); handling it record by record",
            self.service,
            len(entries),
            exc,
        )
        for record, code, why in entries:
            counted = why is not None  # by the first pass
            if why is None:
                try:
                    await settle_all(await hooks.handle([record]))
                    continue
                except Exception as failed:
                    if classify(failed) is not Fault.OTHER:
                        raise
                    code, why = ErrorCode.INTERNAL, f"{type(failed).__name__}: {failed}"
            try:
                await settle_all(await self._pass_over(hooks, record, code, why, count=not counted))
            except Exception as failed:
                if classify(failed) is not Fault.OTHER:
                    raise
                log.error(
                    "%s: the dead letter of %s[%d]@%d failed too (%r); passed over",
                    self.service,
                    record.topic,
                    record.partition,
                    record.offset,
                    failed,
                )

    async def _pass_over(
        self, hooks: LoopHooks, record: Record, code: ErrorCode, why: str, *, count: bool = True
    ) -> Sends:
        if count:
            self.guard.passed_over(record, why)
        if hooks.dead_letter is None:
            return []
        return [await hooks.dead_letter(readable(record), code, why[:1024])]

    async def run(
        self,
        stop: asyncio.Event,
        hooks: LoopHooks,
        *,
        healthy: Callable[[], bool] = lambda: True,
    ) -> None:
        """Turn until ``stop`` is set or ``healthy()`` says the service must end; then
        :meth:`drain` (an error that ends the loop commits nothing more)."""
        self.guard.interrupt_on(stop)
        with loop_heartbeat(self.service) as beat:  # /healthz: this loop still turns
            try:
                while not stop.is_set() and healthy():
                    beat()
                    await self.turn(hooks)
                await self.drain()  # a clean stop commits what was acknowledged
            finally:
                self._abandon()  # an error commits nothing more

    async def stop(self) -> None:
        """Stop the consumer (a static member leaves its group at once) and free its id."""
        self._abandon()
        consumer, self._consumer = self._consumer, None
        try:
            if consumer is not None:
                leave_on_stop(consumer)  # a clean stop hands its partitions over at once
                await consumer.stop()
        finally:
            self.guard.close()

    # -- the pipelined mode ------------------------------------------------------
    async def _pipelined_turn(self, hooks: LoopHooks, cycles: InFlightCycles) -> int:
        consumer = self.consumer
        self._commit_to = hooks.commit
        async with self.guard.cycle():
            if hooks.before_fetch is not None:
                await hooks.before_fetch()
            await self._reap(consumer)
            fetched = 0
            if await self._below_cap(consumer, cycles):
                unreadable: list[Record] = []
                if hooks.fetch is not None:
                    records = await hooks.fetch(consumer)
                else:
                    records, unreadable = await self._fetch(consumer)
                if records or unreadable:
                    entries = _entries(records, unreadable)
                    await self._launch(consumer, hooks, unreadable + records, entries)
                fetched = len(records) + len(unreadable)
            failure = await self._commit_settled(consumer)
            if failure is not None:
                await self._failed(failure, "commit")
            if hooks.after_turn is not None:
                await hooks.after_turn(consumer)
            return fetched
        return 0  # a normal fault, counted and backed off

    async def _launch(
        self,
        consumer: BatchConsumer,
        hooks: LoopHooks,
        batch: list[Record],
        entries: list[tuple[Record, ErrorCode, str | None]],
    ) -> None:
        """Handle a fetched batch and track its sends as a new cycle, not awaiting them."""
        self.guard.begin(batch)
        try:
            try:
                sends = await self._process(hooks, entries)
            except Exception as exc:
                if classify(exc) is not Fault.OTHER:
                    raise
                await self._one_by_one(hooks, entries, exc)  # its sends are settled
                sends = []
        except Exception as exc:
            if not is_normal(classify(exc)):
                raise  # lost credentials: nothing more is committed
            rewind(consumer, batch)  # the newest cycle: nothing after it to drop
            failure = exc
        else:
            self._track(_Flight(batch, entries, hooks), sends)
            return
        finally:
            self.guard.end()
        await self._failed(failure, f"handling of {len(batch)} records")

    def _track(self, flight: _Flight, sends: Sends) -> None:
        cycles = self._book
        flight.key = cycles.open(flight.records)
        self._flights[flight.key] = flight
        if _acknowledged(sends):
            cycles.settle(flight.key)
        else:
            flight.task = asyncio.ensure_future(_outcome(sends))
            flight.task.add_done_callback(functools.partial(self._landed, flight))
        self._gauge()

    def _landed(self, flight: _Flight, task: asyncio.Future[BaseException | None]) -> None:
        """A cycle's sends are settled (a done callback: bookkeeping only)."""
        self._loose.discard(task)
        error = asyncio.CancelledError() if task.cancelled() else task.result()
        if error is None:
            self._book.settle(flight.key)
        else:
            flight.error = error  # the loop acts on it at its next turn

    async def _reap(self, consumer: BatchConsumer) -> None:
        """Act on the cycles whose sends failed, oldest first: an error of no known kind
        is one record's doing (handled record by record), a normal fault rewinds."""
        cycles = self._book
        for key in cycles.keys:
            flight = self._flights.get(key)
            if flight is None or flight.error is None or not cycles.tracks(key):
                continue
            error: BaseException | None
            error, flight.error = flight.error, None
            kind = classify(error)
            if kind is Fault.FATAL:
                raise error  # lost credentials: nothing more is committed
            if kind is Fault.OTHER:
                error = await self._isolate(flight, error)
                if error is None:
                    continue
            self._replay(consumer, key)
            await self._failed(error, f"delivery of {len(flight.records)} records")

    async def _isolate(self, flight: _Flight, error: BaseException) -> BaseException | None:
        """Handle a cycle's records again one by one; the normal fault that stopped it."""
        self.guard.begin(flight.records)
        try:
            await self._one_by_one(flight.hooks, flight.entries, error)
        except Exception as exc:
            if not is_normal(classify(exc)):
                raise
            return exc
        finally:
            self.guard.end()
        self._book.settle(flight.key)
        return None

    def _replay(self, consumer: BatchConsumer, key: int) -> None:
        """Cycle ``key`` failed: read it and every later cycle again."""
        cycles = self._book
        replay = cycles.fail(key)
        for dropped in replay.dropped:
            self._let_go(dropped)
        seek_back(consumer, replay.offsets)
        if replay.dropped:
            log.info(
                "%s: %d cycle(s) dropped, read again from %s",
                self.service,
                len(replay.dropped),
                _where(replay.offsets),
            )
        self._gauge()

    async def _failed(self, exc: BaseException, during: str) -> None:
        """Count and back off; the backoff is reset once a cycle opened after it commits."""
        self._retry_from = self._book.opened
        await self.guard.failed(exc, during)

    async def _below_cap(self, consumer: BatchConsumer, cycles: InFlightCycles) -> bool:
        """Wait while ``max_in_flight`` cycles are uncommitted; False if stopped first."""
        stop = self.guard.stopping
        while True:
            self._advance()
            if not cycles.full:
                return True
            if stop is not None and stop.is_set():
                return False
            waits: set[asyncio.Future[Any]] = set(self._pending(cycles.keys))
            if waits:
                stopping = asyncio.ensure_future(stop.wait()) if stop is not None else None
                if stopping is not None:
                    waits.add(stopping)
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if stopping is not None:
                        stopping.cancel()
            await self._reap(consumer)

    def _pending(self, keys: Iterable[int]) -> list[asyncio.Future[BaseException | None]]:
        pending = []
        for key in keys:
            flight = self._flights.get(key)
            if flight is not None and flight.task is not None and not flight.task.done():
                pending.append(flight.task)
        return pending

    def _advance(self) -> None:
        cycles = self._book
        for key in cycles.advance():
            self._flights.pop(key, None)
            if key >= self._retry_from:
                self._recovered = True
        self._gauge()

    async def _commit_settled(self, consumer: BatchConsumer) -> BaseException | None:
        """Commit the settled prefix on the partitions still assigned; the normal fault
        that refused it (its offsets stay ready for the next commit)."""
        cycles = self._book
        async with self._commit_lock:
            self._advance()
            ready = cycles.ready
            if not ready:
                return None
            assigned = consumer.assignment()
            offsets = {tp: o for tp, o in ready.items() if tp in assigned}
            gone = {tp: o for tp, o in ready.items() if tp not in assigned}
            if gone:
                log.info(
                    "%s: revoked before the commit, not committed (the new owner reads them): %s",
                    self.service,
                    _where(gone),
                )
                cycles.committed(gone)
            if offsets:
                try:
                    await (self._commit_to or consumer.commit)(offsets)
                except Exception as exc:
                    if not is_normal(classify(exc)):
                        raise
                    return exc
                cycles.committed(offsets)
        if self._recovered:
            self._recovered = False
            self.guard.succeeded()
        return None

    async def _settled_within(self, keys: list[int], wait_s: float) -> bool:
        """Wait up to ``wait_s`` for the sends of cycles ``keys``; whether all settled."""
        pending = self._pending(keys)
        if pending and wait_s > 0:
            await asyncio.wait(pending, timeout=wait_s)
        return not self._pending(keys)

    async def drain(self, wait_s: float | None = None) -> None:
        """Wait up to ``wait_s`` (default ``revoke_wait_s``) for the cycles in flight and
        commit the acknowledged prefix (:meth:`run` does on a clean stop). A cycle whose
        sends failed is not handled again here: the prefix committed ends before it.
        What is still in flight stays tracked (until :meth:`stop`)."""
        cycles, consumer = self._cycles, self._consumer
        if cycles is None or consumer is None:
            return
        wait = self.guard.revoke_wait_s if wait_s is None else wait_s
        if not await self._settled_within(cycles.keys, wait):
            log.warning(
                "%s: %d cycle(s) still in flight after %.1f s are left unacknowledged; "
                "they are read again at the next start",
                self.service,
                len(self._pending(cycles.keys)),
                wait,
            )
        await self._commit_quietly(consumer, "draining")

    async def _drain_revoked(self, revoked: set[TopicPartition], wait_s: float) -> None:
        """Before ``revoked`` go (the rebalance listener): wait for the cycles in flight
        on them, and the ones before, then commit the settled prefix."""
        cycles, consumer = self._book, self._consumer
        keys = cycles.keys
        touching = [k for k in keys if cycles.partitions(k) & revoked]
        if consumer is None or not touching:
            if consumer is not None:
                await self._commit_quietly(consumer, "a rebalance")
            return
        self.guard.count_revocation()
        upto = keys[: keys.index(touching[-1]) + 1]  # the prefix must settle up to them
        log.info(
            "%s: rebalance with %d cycle(s) in flight on %d revoked partition(s); "
            "waiting up to %.1f s for them to be acknowledged and committed",
            self.service,
            len(upto),
            len({tp for k in touching for tp in cycles.partitions(k)} & revoked),
            wait_s,
        )
        if not await self._settled_within(upto, wait_s):
            log.warning(
                "%s: cycles still in flight are left to the rebalance: the partitions' "
                "next owner reads them again (this loop too, if they come back to it)",
                self.service,
            )
        await self._commit_quietly(consumer, "a rebalance")

    async def _commit_quietly(self, consumer: BatchConsumer, during: str) -> None:
        """Commit the settled prefix; a refusal is counted, not raised (no backoff here)."""
        try:
            failure = await self._commit_settled(consumer)
        except Exception as exc:  # lost credentials: the loop's next turn meets it too
            failure = exc
        if failure is not None:
            self.guard.count(failure)
            log.warning("%s: commit during %s refused (%r)", self.service, during, failure)

    def _reassigned(self, assigned: set[TopicPartition]) -> None:
        """After a rebalance: forget the partitions that went to another member (their
        next owner reads them from the last commit). A partition given back keeps its
        cycles: it is read again from the last commit, and nothing is committed past a
        cycle still unsettled."""
        cycles = self._book
        for key in cycles.forget(cycles.partitions_held - assigned):
            self._let_go(key)
        self._gauge()

    def _let_go(self, key: int) -> None:
        """Stop tracking cycle ``key``; its sends, if still pending, go on untracked."""
        flight = self._flights.pop(key, None)
        if flight is not None and flight.task is not None and not flight.task.done():
            self._loose.add(flight.task)

    def _abandon(self) -> None:
        """The loop ends: cancel the waits on every send not settled; nothing is committed."""
        if self._cycles is None:
            return
        for key in self._cycles.clear():
            self._let_go(key)
        self._flights.clear()
        for task in list(self._loose):
            task.cancel()
        self._loose.clear()
        self._gauge()

    def _gauge(self) -> None:
        metrics = self.guard.metrics
        if metrics is not None and self._cycles is not None:
            metrics.in_flight.labels(self.service).set(len(self._cycles))


@dataclass(eq=False)
class _Flight:
    """A cycle's I/O side: its records, how to handle them again, the wait on its sends."""

    records: list[Record]
    entries: list[tuple[Record, ErrorCode, str | None]]
    hooks: LoopHooks
    key: int = -1
    task: asyncio.Future[BaseException | None] | None = None
    error: BaseException | None = None
    """What failed its sends, until the loop acts on it."""


async def _outcome(sends: Sends) -> BaseException | None:
    """Settle a cycle's sends (none left in flight); what failed them, None if nothing."""
    try:
        await settle_all(sends)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the loop let go of it
        return exc  # a send was cancelled
    except Exception as exc:
        return exc
    return None


def _acknowledged(sends: Sends) -> bool:
    """Whether every send is already acknowledged (no wait needed)."""
    return all(
        isinstance(s, asyncio.Future) and s.done() and not s.cancelled() and s.exception() is None
        for s in sends
    )


def _entries(
    records: list[Record], unreadable: list[Record]
) -> list[tuple[Record, ErrorCode, str | None]]:
    """Each record of a batch with why it is passed over (None: it is handled)."""
    entries: list[tuple[Record, ErrorCode, str | None]] = [
        (r, ErrorCode.DECODE_ERROR, "unreadable record") for r in unreadable
    ]
    entries += [(r, ErrorCode.DECODE_ERROR, header_damage(r)) for r in records]
    return entries


def _where(offsets: Mapping[TopicPartition, int]) -> list[str]:
    return sorted(f"{tp.topic}[{tp.partition}]@{o}" for tp, o in offsets.items())


def _stand_in(tp: TopicPartition, offset: int) -> Record:
    """A record that could not be read, as far as it is known: where it is."""
    return ConsumerRecord(tp.topic, tp.partition, offset, -1, 0, None, None, None, -1, -1, ())
