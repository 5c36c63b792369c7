"""Copy the policy engine's decisions and rollout states into SQL; feed Watch streams.

Reads ``<p>.audit`` (AuditRecord) and ``<p>.control.rollouts`` (RolloutState per
rollout_id) without a consumer group, resuming from offsets kept in the store.
Audit records are inserted once per ``decision_id`` and a state only replaces an
older one, so reading a record twice (a crash between insert and offset save)
changes nothing.

Faults: a record that cannot be decoded or stored (the database refuses it) is
logged, counted (``graylane_audit_skipped_records_total``) and passed over; a
database or broker error (unavailable, locked) ends the pass, and the sink starts
over from its stored offsets after a capped, jittered backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from sqlalchemy.exc import (
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as SQLTimeoutError

from graylane.errors import SerdeError
from graylane.kafka.admin import wait_for_assignment
from graylane.kafka.factory import ConsumerOptions, KafkaFactory
from graylane.kafka.lag import consumer_lag
from graylane.metrics import AuditSinkMetrics
from graylane.serde import decode
from graylane.services.controlplane.sink_retry import Backoff
from graylane.services.controlplane.store import ControlStore
from graylane.v1 import audit_pb2, rollout_pb2

__all__ = ["AuditSink", "RolloutHub", "Subscription"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Subscription:
    model: str
    rollout_id: str
    queue: asyncio.Queue[rollout_pb2.RolloutState]

    def matches(self, state: rollout_pb2.RolloutState) -> bool:
        return (not self.model or state.model == self.model) and (
            not self.rollout_id or state.rollout_id == self.rollout_id
        )


class RolloutHub:
    """Fan-out of rollout state changes to Watch streams; a slow watcher loses its oldest."""

    def __init__(self, queue_size: int = 256) -> None:
        self._subs: set[Subscription] = set()
        self._queue_size = queue_size

    def subscribe(self, model: str = "", rollout_id: str = "") -> Subscription:
        sub = Subscription(model, rollout_id, asyncio.Queue(self._queue_size))
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def publish(self, state: rollout_pb2.RolloutState) -> None:
        for sub in list(self._subs):
            if not sub.matches(state):
                continue
            if sub.queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    sub.queue.get_nowait()
            sub.queue.put_nowait(state)


class AuditSink:
    def __init__(
        self,
        factory: KafkaFactory,
        store: ControlStore,
        hub: RolloutHub,
        metrics: AuditSinkMetrics | None = None,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self._factory = factory
        self._store = store
        self._hub = hub
        self._audit_topic = factory.layout.audit()
        self._rollouts_topic = factory.layout.rollouts()
        self.ready = asyncio.Event()
        self.audit_added = 0
        self.skipped = 0
        self.restarts = 0
        self._metrics = metrics
        self.backoff = backoff or Backoff()

    async def run(self, stop: asyncio.Event) -> None:
        """Copy records until ``stop``; after a database or broker error, start over
        (from the offsets in the store) after a capped, jittered backoff."""
        while not stop.is_set():
            try:
                await self._follow(stop)
                return
            except _RESTARTABLE as exc:
                delay = self.backoff.next_delay()
                log.error(
                    "audit sink: %s: %s; restarting in %.1f s",
                    type(exc).__name__,
                    _short(str(exc)),
                    delay,
                )
                self.restarts += 1
                if self._metrics is not None:
                    self._metrics.restarts.labels(type(exc).__name__).inc()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    async def _follow(self, stop: asyncio.Event) -> None:
        consumer = self._factory.consumer(
            self._audit_topic,
            self._rollouts_topic,
            options=ConsumerOptions(group_id=None),
            client_suffix="cp-audit-sink",
        )
        await consumer.start()
        try:
            for tp in await wait_for_assignment(consumer):
                stored = await asyncio.to_thread(self._store.sink_offsets, tp.topic)
                if tp.partition in stored:
                    consumer.seek(tp, stored[tp.partition])
                else:
                    await consumer.seek_to_beginning(tp)
            self.ready.set()
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=500)
                for tp, records in batches.items():
                    await self._handle(tp, [(r.value, r.offset) for r in records])
                    self.backoff.reset()
                if self._metrics is not None:
                    for topic, lag in (await consumer_lag(consumer)).items():
                        self._metrics.consumer_lag.labels(topic).set(lag)
        finally:
            await consumer.stop()

    async def _handle(self, tp: TopicPartition, records: list[tuple[bytes | None, int]]) -> None:
        if not records:
            return
        if tp.topic == self._audit_topic:
            audits: list[tuple[audit_pb2.AuditRecord, int]] = []
            for value, offset in records:
                try:
                    audits.append((decode(audit_pb2.AuditRecord, value), offset))
                except SerdeError as exc:
                    self._skip(tp, offset, "undecodable", exc)
            started = time.perf_counter()
            added = await self._add_audit(tp, audits)
            self.audit_added += added
            if self._metrics is not None:
                stored = [a for a, _ in audits]
                _count(self._metrics, stored, added, time.perf_counter() - started)
        else:
            for value, offset in records:
                if value is None:
                    continue
                try:
                    state = decode(rollout_pb2.RolloutState, value)
                except SerdeError as exc:
                    self._skip(tp, offset, "undecodable", exc)
                    continue
                try:
                    changed = await asyncio.to_thread(self._store.apply_state, state)
                except Exception as exc:
                    if _transient(exc):
                        raise
                    self._skip(tp, offset, "unstorable", exc)
                    continue
                if changed:
                    self._hub.publish(state)
        await asyncio.to_thread(
            self._store.save_sink_offset, tp.topic, tp.partition, records[-1][1] + 1
        )

    async def _add_audit(
        self, tp: TopicPartition, audits: list[tuple[audit_pb2.AuditRecord, int]]
    ) -> int:
        """Store the batch; if the database refuses it, record by record (skip the bad ones)."""
        try:
            return await asyncio.to_thread(self._store.add_audit, [a for a, _ in audits])
        except Exception as exc:
            if _transient(exc):
                raise
        added = 0
        for audit, offset in audits:
            try:
                added += await asyncio.to_thread(self._store.add_audit, [audit])
            except Exception as exc:
                if _transient(exc):
                    raise
                self._skip(tp, offset, "unstorable", exc)
        return added

    def _skip(self, tp: TopicPartition, offset: int, reason: str, exc: BaseException) -> None:
        """A record that cannot be stored is logged, counted and passed over; never fatal."""
        log.warning(
            "audit sink: %s record at %s@%d skipped: %s: %s",
            reason,
            tp,
            offset,
            type(exc).__name__,
            _short(str(exc)),
        )
        self.skipped += 1
        if self._metrics is not None:
            self._metrics.skipped.labels(tp.topic, reason).inc()


_RESTARTABLE = (SQLAlchemyError, OSError, KafkaError)
"""What ends one pass of the sink and starts the next after a backoff."""


def _transient(exc: BaseException) -> bool:
    """The database (or the link to it) failed, not the record: retry, never skip."""
    return isinstance(
        exc, OperationalError | InterfaceError | DisconnectionError | SQLTimeoutError | OSError
    )


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _count(
    metrics: AuditSinkMetrics, audits: list[audit_pb2.AuditRecord], added: int, seconds: float
) -> None:
    """One stored batch: its write time, records by kind, those already stored, the newest."""
    metrics.write_seconds.observe(seconds)
    metrics.duplicates.inc(max(0, len(audits) - added))
    newest: dict[str, float] = {}
    for record in audits:
        kind = audit_pb2.DecisionKind.Name(record.kind).removeprefix("DECISION_").lower()
        metrics.records.labels(record.model, kind).inc()
        newest[record.model] = max(newest.get(record.model, 0.0), record.decided_at_unix_ms / 1e3)
    for model, at in newest.items():
        metrics.last_record.labels(model).set(at)
