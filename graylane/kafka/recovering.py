"""A producer that recovers by itself from the errors an idempotent producer never leaves.

After a broker outage longer than ``request_timeout_ms`` an idempotent aiokafka
producer has a gap in its sequence numbers: the broker then refuses every batch
with ``OutOfOrderSequenceNumber``, for ever. :class:`RecoveringProducer` sits
behind the seam's :class:`~graylane.kafka.seam.Producer` protocol, and on such a
fatal error (or a timed-out batch, which leaves that gap) builds a new
underlying producer (a new producer id and epoch) and sends the records that
were not acknowledged again, once each. What still fails reaches the caller
through the returned future: the caller sees the failure, and its next send
goes out on the new producer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiokafka.errors import (
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    KafkaError,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    UnknownProducerId,
)
from aiokafka.structs import RecordMetadata

if TYPE_CHECKING:  # the seam builds this producer; it needs the protocols only to type it
    from graylane.kafka.seam import Headers, MetadataClient, Producer

__all__ = ["RecoveringProducer", "is_fatal_for_producer"]

log = logging.getLogger(__name__)

_FATAL: tuple[type[KafkaError], ...] = (
    OutOfOrderSequenceNumber,
    ProducerFenced,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    UnknownProducerId,
    ProducerClosed,
)


def is_fatal_for_producer(exc: BaseException) -> bool:
    """Errors after which this producer instance will not deliver again."""
    return isinstance(exc, _FATAL)


def _poisons(exc: BaseException) -> bool:
    """A failed send's error after which the producer is rebuilt."""
    return is_fatal_for_producer(exc) or isinstance(exc, KafkaTimeoutError)


@dataclass(frozen=True)
class _Outgoing:
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    timestamp_ms: int | None
    headers: Headers | None


class RecoveringProducer:
    """A :class:`Producer` that replaces its underlying producer after a fatal error.

    ``make`` builds a fresh, unstarted producer. ``resends`` is how often one
    record is sent again on a new producer before its future fails.
    ``start_timeout_s`` bounds building a new producer while the broker is away.
    ``delivery_timeout_s`` bounds the wait for one record's ack: past it the record
    counts as timed out (the producer is rebuilt and the record re-sent, or its future
    fails with ``KafkaTimeoutError``), so no caller waits for ever on a request lost
    with a dead connection. ``None``: no bound.
    """

    def __init__(
        self,
        make: Callable[[], Producer],
        *,
        resends: int = 1,
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 5.0,
        delivery_timeout_s: float | None = None,
    ) -> None:
        self._delivery_timeout_s = delivery_timeout_s
        self._make = make
        self._resends = resends
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._inner = make()
        self._generation = 0
        self._broken: int | None = None
        """The generation found broken and not yet replaced."""
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._stopped = False
        self.recreated = 0
        """How many times the underlying producer was rebuilt (for metrics and tests)."""

    @property
    def client(self) -> MetadataClient:
        return self._inner.client

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def broken(self) -> bool:
        """Whether the current producer was found broken (a fatal error, or a batch that
        timed out and left a sequence gap): the next send goes out on a rebuilt one."""
        return self._broken == self._generation

    async def start(self) -> None:
        await self._inner.start()
        self._started = True

    async def stop(self) -> None:
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:  # flushing a producer whose broker is gone can wait for ever
            await asyncio.wait_for(self._inner.stop(), max(self._stop_timeout_s, 30.0))
        except TimeoutError:
            log.warning("the producer did not stop within 30 s (unacknowledged records lost)")

    async def flush(self) -> None:
        await self._inner.flush()
        while self._tasks:  # re-sends under way belong to the flush
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
            await self._inner.flush()

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> RecordMetadata:
        future = await self.send(topic, value, key, partition, timestamp_ms, headers)
        return await future

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; the future resolves on the broker's ack or fails for good."""
        record = _Outgoing(topic, value, key, partition, timestamp_ms, headers)
        outer: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        await self._submit(record, outer, self._resends)
        return outer

    # -- internals --------------------------------------------------------------
    async def _current(self) -> tuple[Producer, int]:
        """The producer to send on, rebuilt first if its generation was found broken."""
        if self._broken is None or self._stopped:
            return self._inner, self._generation
        async with self._lock:
            if self._broken == self._generation:
                await self._replace()
            return self._inner, self._generation

    async def _replace(self) -> None:
        old = self._inner
        fresh = self._make()
        try:
            await asyncio.wait_for(fresh.start(), self._start_timeout_s)
        except TimeoutError:
            await self._quietly_stop(fresh)
            raise KafkaTimeoutError(
                f"no new producer within {self._start_timeout_s:g} s (is the broker up?)"
            ) from None
        except BaseException:
            await self._quietly_stop(fresh)
            raise
        self._inner = fresh
        self._generation += 1
        self._broken = None
        self.recreated += 1
        log.warning("producer rebuilt after a fatal error (generation %d)", self._generation)
        self._spawn(self._quietly_stop(old))

    async def _quietly_stop(self, producer: Producer) -> None:
        try:
            await asyncio.wait_for(producer.stop(), self._stop_timeout_s)
        except (Exception, asyncio.CancelledError):  # a broken producer may not stop cleanly
            log.debug("a replaced producer did not stop cleanly", exc_info=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _mark_broken(self, generation: int, exc: BaseException) -> None:
        if generation == self._generation and self._broken is None:
            log.warning("producer generation %d is broken: %r", generation, exc)
            self._broken = generation

    async def _submit(
        self, record: _Outgoing, outer: asyncio.Future[RecordMetadata], resends: int
    ) -> None:
        producer, generation = await self._current()
        try:
            inner = await producer.send(
                record.topic,
                record.value,
                key=record.key,
                partition=record.partition,
                timestamp_ms=record.timestamp_ms,
                headers=record.headers,
            )
        except KafkaError as exc:
            if not is_fatal_for_producer(exc) or resends <= 0 or self._stopped:
                raise
            self._mark_broken(generation, exc)
            await self._submit(record, outer, resends - 1)
            return
        if self._delivery_timeout_s is None:
            inner.add_done_callback(
                lambda done: self._settled(done, record, outer, generation, resends)
            )
            return
        expired: list[bool] = []
        timer = asyncio.get_running_loop().call_later(
            self._delivery_timeout_s,
            self._expire,
            inner,
            expired,
            record,
            outer,
            generation,
            resends,
        )

        def settled(done: asyncio.Future[RecordMetadata]) -> None:
            timer.cancel()
            if expired and (done.cancelled() or done.exception() is not None):
                return  # already handled as timed out
            self._settled(done, record, outer, generation, resends)

        inner.add_done_callback(settled)

    def _expire(
        self,
        inner: asyncio.Future[RecordMetadata],
        expired: list[bool],
        record: _Outgoing,
        outer: asyncio.Future[RecordMetadata],
        generation: int,
        resends: int,
    ) -> None:
        if inner.done() or outer.done():
            return
        expired.append(True)
        exc = KafkaTimeoutError(f"no broker ack within {self._delivery_timeout_s:g} s")
        self._mark_broken(generation, exc)
        if resends <= 0 or self._stopped:
            outer.set_exception(exc)
            return
        self._spawn(self._resend(record, outer, resends - 1))

    def _settled(
        self,
        done: asyncio.Future[RecordMetadata],
        record: _Outgoing,
        outer: asyncio.Future[RecordMetadata],
        generation: int,
        resends: int,
    ) -> None:
        if outer.done():
            return
        if done.cancelled():
            outer.cancel()
            return
        exc = done.exception()
        if exc is None:
            outer.set_result(done.result())
            return
        if not _poisons(exc):
            outer.set_exception(exc)
            return
        self._mark_broken(generation, exc)
        if resends <= 0 or self._stopped:
            outer.set_exception(exc)
            return
        self._spawn(self._resend(record, outer, resends - 1))

    async def _resend(
        self, record: _Outgoing, outer: asyncio.Future[RecordMetadata], resends: int
    ) -> None:
        try:
            await self._submit(record, outer, resends)
        except asyncio.CancelledError:
            if not outer.done():
                outer.cancel()
            raise
        except BaseException as exc:
            if not outer.done():
                outer.set_exception(exc)
