"""The control-plane audit sink survives what it reads and the database it writes
(issue 10, item 2): undecodable and unstorable records are counted and skipped, ids
longer than their column are hashed (stable) instead of cut, and a database that is
locked for a while makes the sink start over after a capped backoff, then store the
records that came later. Real SQLite files; the broker is the in-memory double."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DataError, OperationalError

from graylane import serde
from graylane.kafka.backoff import BackoffPolicy
from graylane.metrics.controlside import AuditSinkMetrics
from graylane.registry.migrate import upgrade
from graylane.services.controlplane.audit_sink import AuditSink, RolloutHub
from graylane.services.controlplane.state import HASH_DIGITS, ControlStore, fit
from graylane.settings import Settings
from graylane.v1 import audit_pb2, rollout_pb2
from tests.support.memory_kafka import MemoryBroker, MemoryFactory

# --- ids that do not fit their column -----------------------------------------------------


def test_fit_keeps_short_ids_and_hashes_long_ones_stably() -> None:
    assert fit("r-1", 64) == "r-1"
    assert fit("x" * 64, 64) == "x" * 64
    long_a, long_b = "p" * 200 + "a", "p" * 200 + "b"
    fa, fb = fit(long_a, 64), fit(long_b, 64)
    assert len(fa) == len(fb) == 64
    assert fa.startswith("p" * (64 - HASH_DIGITS - 1) + "~")
    assert fa != fb  # same long prefix, different ids: different keys
    assert fit(long_a, 64) == fa  # stable: a re-read record maps to the same key
    with pytest.raises(ValueError):
        fit("anything", HASH_DIGITS)


# --- the sink ------------------------------------------------------------------------------


def _audit(decision_id: str, model: str = "gpt", rollout_id: str = "r1") -> bytes:
    return serde.encode(
        audit_pb2.AuditRecord(
            decision_id=decision_id,
            model=model,
            rollout_id=rollout_id,
            version="v2",
            kind=audit_pb2.DECISION_HOLD,
            rule="hold",
            reason="no data",
            decided_at_unix_ms=1_000,
        )
    )


def _state(rollout_id: str) -> bytes:
    return serde.encode(
        rollout_pb2.RolloutState(
            rollout_id=rollout_id,
            model="gpt",
            phase=rollout_pb2.CANARY,
            updated_at_unix_ms=1_000,
            spec=rollout_pb2.RolloutSpec(
                rollout_id=rollout_id, model="gpt", baseline_version="v1", candidate_version="v2"
            ),
        )
    )


class Rig:
    def __init__(self, db: Path, store_cls: type[ControlStore] = ControlStore) -> None:
        self.broker = MemoryBroker()
        self.factory = MemoryFactory(self.broker, Settings(topic_prefix="t", partitions=1))
        for topic in (self.factory.layout.audit(), self.factory.layout.rollouts()):
            self.broker.create_topic(topic, 1)
        # a short busy timeout: a locked database fails fast instead of waiting 5 s
        engine = create_engine(f"sqlite:///{db}", connect_args={"timeout": 0.05})
        upgrade(engine)
        self.store = store_cls(engine)
        self.metrics = AuditSinkMetrics.create(CollectorRegistry())
        self.sink = AuditSink(
            self.factory,  # type: ignore[arg-type]
            self.store,
            RolloutHub(),
            self.metrics,
            backoff=BackoffPolicy(base_s=0.05, cap_s=0.2),
        )

    def audit(self, *values: bytes) -> None:
        for value in values:
            self.broker.append(self.factory.layout.audit(), value, key=b"k", partition=0)

    def state(self, *values: bytes) -> None:
        for value in values:
            self.broker.append(self.factory.layout.rollouts(), value, key=b"k", partition=0)

    def stored_ids(self) -> set[str]:
        # The test's own read may meet the sink mid-retry on a locked file: read again.
        for _ in range(50):
            try:
                return {r.decision_id for r in self.store.query_audit(limit=1000)}
            except OperationalError:
                time.sleep(0.02)
        return {r.decision_id for r in self.store.query_audit(limit=1000)}

    def skipped(self, topic: str, reason: str) -> float:
        return self.metrics.skipped.labels(topic, reason)._value.get()


async def until(condition, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def running(rig: Rig) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(rig.sink.run(stop))
    try:
        await asyncio.wait_for(rig.sink.ready.wait(), 10)
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)  # it ended cleanly: never raised


@pytest.fixture
async def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "cp.db")


async def test_garbage_and_long_ids_never_stop_the_sink(rig: Rig) -> None:
    long_rollout = "r-" + "x" * 400
    long_decision = "d-" + "y" * 400
    rig.audit(
        b"\xff\x00 not protobuf", _audit("d1"), _audit(long_decision, rollout_id=long_rollout)
    )
    rig.state(b"\x0a\xff\xff garbage", _state(long_rollout), _state("r2"))
    rig.audit(_audit("d2"))
    async for _ in running(rig):
        await until(lambda: rig.sink.audit_added == 3 and len(rig.store.list_rollouts()) == 2)
    audit_topic, rollouts_topic = rig.factory.layout.audit(), rig.factory.layout.rollouts()
    assert rig.skipped(audit_topic, "undecodable") == 1
    assert rig.skipped(rollouts_topic, "undecodable") == 1
    assert rig.stored_ids() == {"d1", "d2", long_decision}
    with rig.store.engine.connect() as conn:
        keys = {row[0] for row in conn.execute(text("SELECT decision_id FROM cp_audit"))}
    assert keys == {"d1", "d2", fit(long_decision, 128)}  # the column holds the hashed key
    # the long rollout id is stored hashed, found by its full id, its record kept whole
    (record,) = rig.store.query_audit(rollout_id=long_rollout)
    assert record.decision_id == long_decision and record.rollout_id == long_rollout
    stored = rig.store.get_rollout(long_rollout)
    assert stored is not None
    # read again (a restart before the offset was saved) changes nothing
    assert rig.store.add_audit([serde.decode(audit_pb2.AuditRecord, _audit(long_decision))]) == 0


class RefusingStore(ControlStore):
    """The database refuses one record as PostgreSQL refuses a value too long for its column."""

    def add_audit(self, records: Iterable[audit_pb2.AuditRecord]) -> int:
        batch = list(records)
        if any(r.model == "refused" for r in batch):
            raise DataError("INSERT", {}, Exception("value too long for type character varying"))
        return super().add_audit(batch)


async def test_a_record_the_database_refuses_is_skipped_and_its_batch_mates_stored(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "cp.db", RefusingStore)
    rig.audit(_audit("d1"), _audit("bad", model="refused"), _audit("d2"))
    async for _ in running(rig):
        await until(lambda: rig.sink.skipped == 1 and rig.stored_ids() == {"d1", "d2"})
        rig.audit(_audit("d3"))
        await until(lambda: rig.stored_ids() == {"d1", "d2", "d3"})
    assert rig.skipped(rig.factory.layout.audit(), "unstorable") == 1
    assert rig.sink.restarts == 0


async def test_a_locked_database_restarts_the_sink_which_then_stores_later_records(
    rig: Rig, tmp_path: Path
) -> None:
    rig.audit(_audit("d1"))
    async for _ in running(rig):
        await until(lambda: rig.stored_ids() == {"d1"})
        blocker = sqlite3.connect(tmp_path / "cp.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            rig.audit(_audit("d2"))
            rig.state(_state("r9"))
            await until(lambda: rig.sink.restarts >= 2)
            assert rig.metrics.restarts.labels("OperationalError")._value.get() >= 2
            assert rig.stored_ids() == {"d1"}
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await until(lambda: rig.stored_ids() == {"d1", "d2"})
        await until(lambda: rig.store.get_rollout("r9") is not None)
        rig.audit(_audit("d3"))
        await until(lambda: rig.stored_ids() == {"d1", "d2", "d3"})
    assert rig.sink.skipped == 0  # nothing was lost to the outage
