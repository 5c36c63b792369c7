"""Records that are damaged at the Kafka level, or written by a newer Graylane, on the
real broker: the router and the audit sink pass over what they cannot read or
interpret and serve the next record; a client's invented names never become labels."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import aiokafka.consumer.fetcher
import pytest
from aiokafka.admin import NewTopic
from aiokafka.record.memory_records import MemoryRecords
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine

from graylane import serde
from graylane.errors import ErrorCode
from graylane.kafka import seam
from graylane.kafka.backoff import BackoffPolicy
from graylane.kafka.consume_loop import ConsumeLoop, LoopHooks
from graylane.kafka.fault import Fault
from graylane.kafka.seam import ConsumerOptions, KafkaFactory, Record
from graylane.metrics.controlside import AuditSinkMetrics
from graylane.registry.migrate import upgrade
from graylane.services.controlplane.audit_sink import AuditSink, RolloutHub
from graylane.services.controlplane.state import ControlStore
from graylane.services.router.service import Router, RouterConfig
from graylane.v1 import audit_pb2, inference_pb2
from tests.support.damage import RawHeaderKey, raw_header_keys
from tests.support.records import produce, produce_records
from tests.support.stack import dead_letters, read_topic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

MODEL = "dmg"


def request(request_id: str, model: str = MODEL) -> bytes:
    return serde.encode(
        inference_pb2.InferenceRequest(
            request_id=request_id, model=model, routing_key="u1", token_ids=[1, 2, 3]
        )
    )


@contextlib.asynccontextmanager
async def running_router(factory: KafkaFactory) -> AsyncIterator[tuple[Router, asyncio.Task[None]]]:
    await factory.ensure_topics(
        factory.layout.shared_specs() + factory.layout.model_specs(MODEL, ["v1"])
    )
    router = Router(factory, RouterConfig(stable_versions={MODEL: "v1"}, metrics_port=-1))
    stop = asyncio.Event()
    task = asyncio.create_task(router.run(stop))
    ready = asyncio.ensure_future(router.ready.wait())
    await asyncio.wait([task, ready], timeout=60, return_when=asyncio.FIRST_COMPLETED)
    ready.cancel()
    assert router.ready.is_set(), "the router did not start"
    try:
        yield router, task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_a_header_key_that_is_not_utf8_is_dead_lettered_and_the_router_serves_on(
    factory: KafkaFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka decoded header keys strictly inside ``getmany``: the router ended, and
    ended again on the same offset after every restart."""
    ingress = factory.layout.ingress(MODEL)
    await factory.ensure_topics(
        factory.layout.shared_specs() + factory.layout.model_specs(MODEL, ["v1"])
    )
    # The damaged record is on the topic before the router starts: the patch that writes it
    # swaps aiokafka's batch builder for the whole process, so no other producer (the
    # router's dead letters) may build a batch while it is in place.
    producer = factory.producer(client_suffix="damage-writer")
    await producer.start()
    try:
        with raw_header_keys(monkeypatch):
            await producer.send_and_wait(
                ingress, request("bad"), key=b"u1", headers=[(RawHeaderKey(b"\xff\xfe"), b"x")]
            )
    finally:
        await producer.stop()
    async with running_router(factory) as (_, task):
        await produce(factory, ingress, request("good"), key="u1")
        forwarded = await read_topic(
            factory, factory.layout.version_requests(MODEL, "v1"), expect=1, timeout_s=30
        )
        assert not task.done(), "the router stopped"
        assert [serde.decode(inference_pb2.InferenceRequest, v).request_id for v in forwarded] == [
            "good"
        ]
        [letter] = await dead_letters(factory, expect=1)
        assert letter.source_topic == ingress
        assert letter.error_code == ErrorCode.DECODE_ERROR
        assert "UTF-8" in letter.reason


async def test_invented_model_names_add_at_most_one_label_value(factory: KafkaFactory) -> None:
    """Each unknown model name a client sent used to become a series of its own."""
    ingress = factory.layout.ingress(MODEL)
    async with running_router(factory) as (router, task):
        await produce_records(
            factory,
            ingress,
            [(f"u{i}", request(f"r{i}", model=f"invented-{i}")) for i in range(1000)],
        )

        def rejected() -> float:
            return sum(
                s.value
                for m in router.registry.collect()
                if m.name == "graylane_router_errors"
                for s in m.samples
                if s.name.endswith("_total")
            )

        await wait_until(
            lambda: rejected() >= 1000 or task.done(), timeout=60, what="1000 refusals"
        )
        assert not task.done()
        models = {
            s.labels["model"]
            for m in router.registry.collect()
            if m.name == "graylane_router_errors"
            for s in m.samples
        }
        assert len(models - {MODEL}) <= 1, sorted(models)[:5]


async def test_an_unknown_decision_kind_does_not_stop_the_audit_sink(
    factory: KafkaFactory, tmp_path: Path
) -> None:
    """``DecisionKind.Name`` of a value a newer policy engine writes raised: the control
    plane's sink ended before saving its offset, and ended again at every start."""
    await factory.ensure_topics(factory.layout.shared_specs())
    engine = create_engine(f"sqlite:///{tmp_path / 'control.db'}")
    upgrade(engine)
    store = ControlStore(engine)
    metrics = AuditSinkMetrics.create(CollectorRegistry())
    sink = AuditSink(factory, store, RolloutHub(), metrics)
    stop = asyncio.Event()
    task = asyncio.create_task(sink.run(stop))
    try:
        await asyncio.wait_for(sink.ready.wait(), 30)

        def record(decision_id: str, kind: int) -> tuple[str, bytes]:
            return MODEL, serde.encode(
                audit_pb2.AuditRecord(
                    decision_id=decision_id,
                    decided_at_unix_ms=1_700_000_000_000,
                    model=MODEL,
                    rollout_id="ro",
                    version="v2",
                    kind=kind,
                    rule="r",
                    reason="why",
                )
            )

        future_kind = max(audit_pb2.DecisionKind.values()) + 50
        await produce_records(factory, factory.layout.audit(), [record("d-future", future_kind)])
        await produce_records(
            factory, factory.layout.audit(), [record("d-next", audit_pb2.DECISION_HOLD)]
        )

        def stored() -> set[str]:
            return {r.decision_id for r in store.query_audit(model=MODEL)}

        await wait_until(
            lambda: "d-next" in stored() or task.done(), timeout=30, what="the next record stored"
        )
        assert not task.done(), "the audit sink stopped"
        assert "d-next" in stored()
        assert metrics.records.labels(MODEL, "unknown")._value.get() == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_a_fetch_the_library_cannot_read_is_narrowed_to_the_one_record(
    factory: KafkaFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the tolerant reader, aiokafka's fetch fails for a whole batch: the loop
    reads again record by record and passes over exactly the one it cannot read."""
    monkeypatch.setattr(seam, "tolerate_header_damage", lambda: None)
    monkeypatch.setattr(aiokafka.consumer.fetcher, "MemoryRecords", MemoryRecords)
    topic = f"{factory.settings.topic_prefix}.narrowed"
    admin = factory.admin()
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = factory.producer(client_suffix="damage-writer")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"r0")
        with raw_header_keys(monkeypatch):
            await producer.send_and_wait(topic, b"bad", headers=[(RawHeaderKey(b"\xff"), b"")])
        await producer.send_and_wait(topic, b"r2")
    finally:
        await producer.stop()
    loop = ConsumeLoop(
        "narrowing",
        factory,
        [topic],
        ConsumerOptions(group_id=f"{topic}.g"),
        role="narrowing",
        client_suffix="narrowing",
        policy=BackoffPolicy(base_s=0.01, cap_s=0.05),
    )
    handled: list[bytes] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        handled.extend(r.value or b"" for r in records)
        return []

    await loop.start()
    try:
        for _ in range(40):
            await loop.turn(LoopHooks(handle=handle))
            if b"r2" in handled:
                break
    finally:
        await loop.stop()
    assert handled == [b"r0", b"r2"]
    assert loop.guard.faults[Fault.RECORD] == 1
