"""Copy the policy engine's decisions and rollout states into SQL; feed Watch streams.

Reads ``<p>.audit`` (AuditRecord) and ``<p>.control.rollouts`` (RolloutState per
rollout_id) without a consumer group, through the library's
:class:`~graylane.kafka.consume_loop.ConsumeLoop`, resuming from offsets kept in the store
(the loop's commit goes there). Audit records are inserted once per
``decision_id`` and a state only replaces an older one, so reading a record twice
(a crash between insert and offset save) changes nothing.

Faults: a record that cannot be decoded or stored (the database refuses it), or
that fails in any other way (the loop passes it over), is logged, counted
(``graylane_audit_skipped_records_total``) and passed over. A value this build does
not know (a newer writer's enum value, an unknown field) is kept as written and
counted under ``kind="unknown"``, never fatal. A
database that fails (unavailable, locked) raises :class:`StoreUnavailable`, which
is retriable: the loop reads the batch again after a capped, jittered backoff.
A broker error the loop does not retry starts the consumer over from the stored
offsets, after the same backoff. Each retry counts as a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from sqlalchemy.exc import (
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as SQLTimeoutError

from graylane.errors import ErrorCode, GraylaneError, SerdeError, clip, is_retriable
from graylane.kafka.backoff import BackoffPolicy
from graylane.kafka.consume_loop import ConsumeLoop, LoopHooks
from graylane.kafka.fault import Fault
from graylane.kafka.reading import consumer_lag, wait_for_assignment
from graylane.kafka.seam import BatchConsumer, ClientFactory, ConsumerOptions, Record
from graylane.metrics.controlside import AuditSinkMetrics
from graylane.serde import decode
from graylane.services.controlplane.state import ControlStore
from graylane.v1 import audit_pb2, rollout_pb2

__all__ = ["AuditSink", "RolloutHub", "StoreUnavailable", "Subscription", "decision_kind_label"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_BACKOFF = BackoffPolicy(base_s=0.5, cap_s=30.0, jitter=0.2)
"""Between two tries of a failed batch (or start): 0.5 s doubling to 30 s."""


class StoreUnavailable(GraylaneError):
    """The database (or the link to it) failed, not the record: read the batch again."""

    retriable = True


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
        factory: ClientFactory,
        store: ControlStore,
        hub: RolloutHub,
        metrics: AuditSinkMetrics | None = None,
        *,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        on_audits: Callable[[Sequence[audit_pb2.AuditRecord]], None] | None = None,
    ) -> None:
        self._factory = factory
        self._on_audits = on_audits
        """Sees every decoded audit batch once it is stored (the notifier); must not wait."""
        self._store = store
        self._hub = hub
        self._audit_topic = factory.layout.audit()
        self._rollouts_topic = factory.layout.rollouts()
        self.ready = asyncio.Event()
        self.audit_added = 0
        self.skipped = 0
        self.restarts = 0
        self._metrics = metrics
        self.backoff = backoff

    async def run(self, stop: asyncio.Event) -> None:
        """Copy records until ``stop``; after a database or broker error, go on from the
        offsets in the store after a capped, jittered backoff."""
        loop = ConsumeLoop(
            "audit-sink",
            self._factory,
            [self._audit_topic, self._rollouts_topic],
            ConsumerOptions(group_id=None),
            role="audit-sink",
            client_suffix="cp-audit-sink",
            policy=self.backoff,
            max_records=500,
        )
        loop.guard.on_fault(self._restarted)
        loop.guard.interrupt_on(stop)
        hooks = LoopHooks(
            handle=self._handle,
            commit=self._save_offsets,
            after_turn=self._lag,
            dead_letter=self._passed_over,
        )
        while not stop.is_set():
            try:
                await loop.start(self._position)
                self.ready.set()
                await loop.run(stop, hooks)
            except Exception as exc:
                if not (isinstance(exc, _RESTARTABLE) or is_retriable(exc)):
                    raise
                await loop.guard.failed(exc, "a pass of the audit sink")
            finally:
                await loop.stop()

    def _restarted(self, kind: Fault, exc: BaseException) -> None:
        cause = exc.__cause__ if isinstance(exc, StoreUnavailable) and exc.__cause__ else exc
        self.restarts += 1
        if self._metrics is not None:
            self._metrics.restarts.labels(type(cause).__name__).inc()

    async def _passed_over(self, record: Record, code: ErrorCode, why: str) -> Awaitable[object]:
        """A record the loop passes over: counted like any skipped record (nothing is sent)."""
        self._skip(
            TopicPartition(record.topic, record.partition),
            record.offset,
            "uninterpretable",
            SerdeError(f"{code.name}: {why}"),
        )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def _position(self, consumer: BatchConsumer) -> None:
        """Each partition at its offset in the store, else at its beginning."""
        for tp in await wait_for_assignment(consumer):
            stored = await self._call(self._store.sink_offsets, tp.topic, every_failure=True)
            if tp.partition in stored:
                consumer.seek(tp, stored[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)

    async def _save_offsets(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            await self._call(
                self._store.save_sink_offset, tp.topic, tp.partition, offset, every_failure=True
            )

    async def _lag(self, consumer: BatchConsumer) -> None:
        if self._metrics is not None:
            for topic, lag in (await consumer_lag(consumer)).items():
                self._metrics.consumer_lag.labels(topic).set(lag)

    async def _call(self, call: Callable[..., T], *args: object, every_failure: bool = False) -> T:
        """``call(*args)`` in a thread; a failure of the database itself (or, with
        ``every_failure``, any database error) is raised as :class:`StoreUnavailable`."""
        try:
            return await asyncio.to_thread(call, *args)
        except Exception as exc:
            if _transient(exc) or (every_failure and isinstance(exc, SQLAlchemyError)):
                raise StoreUnavailable(f"{type(exc).__name__}: {clip(str(exc), 300)}") from exc
            raise

    async def _handle(self, records: list[Record]) -> list[Awaitable[object]]:
        """Store a fetched batch, partition by partition; nothing is sent."""
        by_partition: dict[TopicPartition, list[Record]] = {}
        for record in records:
            by_partition.setdefault(TopicPartition(record.topic, record.partition), []).append(
                record
            )
        for tp, batch in by_partition.items():
            if tp.topic == self._audit_topic:
                await self._store_audits(tp, batch)
            else:
                await self._store_states(tp, batch)
        return []

    async def _store_audits(self, tp: TopicPartition, records: list[Record]) -> None:
        audits: list[tuple[audit_pb2.AuditRecord, int]] = []
        for record in records:
            try:
                audits.append((decode(audit_pb2.AuditRecord, record.value), record.offset))
            except SerdeError as exc:
                self._skip(tp, record.offset, "undecodable", exc)
        started = time.perf_counter()
        added = await self._add_audit(tp, audits)
        self.audit_added += added
        if self._on_audits is not None and audits:
            try:
                self._on_audits([a for a, _ in audits])
            except Exception as exc:  # a notification problem never stops the copy
                log.error("audit sink: the audit hook failed: %s", exc)
        if self._metrics is not None:
            stored = [a for a, _ in audits]
            _count(self._metrics, stored, added, time.perf_counter() - started)

    async def _store_states(self, tp: TopicPartition, records: list[Record]) -> None:
        for record in records:
            if record.value is None:
                continue
            try:
                state = decode(rollout_pb2.RolloutState, record.value)
            except SerdeError as exc:
                self._skip(tp, record.offset, "undecodable", exc)
                continue
            try:
                changed = await self._call(self._store.apply_state, state)
            except StoreUnavailable:
                raise
            except Exception as exc:
                self._skip(tp, record.offset, "unstorable", exc)
                continue
            if changed:
                self._hub.publish(state)

    async def _add_audit(
        self, tp: TopicPartition, audits: list[tuple[audit_pb2.AuditRecord, int]]
    ) -> int:
        """Store the batch; if the database refuses it, record by record (skip the bad ones)."""
        try:
            return await self._call(self._store.add_audit, [a for a, _ in audits])
        except StoreUnavailable:
            raise
        except Exception as exc:  # the database refused something: find it record by record
            log.debug("audit sink: batch refused (%s); storing record by record", exc)
        added = 0
        for audit, offset in audits:
            try:
                added += await self._call(self._store.add_audit, [audit])
            except StoreUnavailable:
                raise
            except Exception as exc:
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
            clip(str(exc), 300),
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


def decision_kind_label(kind: int) -> str:
    """The ``kind`` label of a decision: its name, or ``"unknown"`` for a value a newer
    writer added that this build does not know."""
    if kind not in audit_pb2.DecisionKind.values():
        return "unknown"
    return audit_pb2.DecisionKind.Name(kind).removeprefix("DECISION_").lower()


def _count(
    metrics: AuditSinkMetrics, audits: list[audit_pb2.AuditRecord], added: int, seconds: float
) -> None:
    """One stored batch: its write time, records by kind, those already stored, the newest."""
    metrics.write_seconds.observe(seconds)
    metrics.duplicates.inc(max(0, len(audits) - added))
    newest: dict[str, float] = {}
    for record in audits:
        kind = decision_kind_label(record.kind)
        metrics.records.labels(record.model, kind).inc()
        newest[record.model] = max(newest.get(record.model, 0.0), record.decided_at_unix_ms / 1e3)
    for model, at in newest.items():
        metrics.last_record.labels(model).set(at)
