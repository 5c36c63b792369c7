"""The bus layer against the real local broker."""

from __future__ import annotations

import asyncio

import pytest

from graylane import serde
from graylane.kafka.admin import describe_topic_configs, ensure_topics, partition_count
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import ConsumerOptions, KafkaFactory
from graylane.topics import TopicKind
from graylane.v1 import control_pb2, inference_pb2
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka


async def test_topic_creation_applies_compaction_and_retention(factory: KafkaFactory) -> None:
    layout = factory.layout
    specs = layout.shared_specs() + layout.model_specs("gpt", ["v1", "v2"])
    report = await ensure_topics(factory, specs)
    assert set(report.created) == {s.name for s in specs}

    admin = factory.admin()
    await admin.start()
    try:
        routing = await describe_topic_configs(admin, layout.routing())
        assert routing["cleanup.policy"] == "compact"
        precision = await describe_topic_configs(admin, layout.precision())
        assert precision["cleanup.policy"] == "compact"
        audit = await describe_topic_configs(admin, layout.audit())
        assert audit["cleanup.policy"] == "delete"
        assert audit["retention.ms"] == str(layout.audit_retention_ms)
        telemetry = await describe_topic_configs(admin, layout.telemetry())
        assert telemetry["retention.ms"] == str(layout.data_retention_ms)
        assert await partition_count(admin, layout.version_requests("gpt", "v1")) == 2
        assert await partition_count(admin, layout.routing()) == 1
    finally:
        await admin.close()

    # Idempotent: a second call creates nothing and changes nothing.
    again = await ensure_topics(factory, specs)
    assert again.created == () and again.reconfigured == ()
    assert set(again.unchanged) == {s.name for s in specs}


async def test_drifted_topic_config_is_repaired(factory: KafkaFactory) -> None:
    spec = next(s for s in factory.layout.shared_specs() if s.kind is TopicKind.AUDIT)
    drifted = type(spec)(
        name=spec.name,
        kind=spec.kind,
        partitions=spec.partitions,
        replication_factor=spec.replication_factor,
        cleanup=spec.cleanup,
        retention_ms=60_000,
    )
    await ensure_topics(factory, [drifted])
    report = await ensure_topics(factory, [spec])
    assert report.reconfigured == (spec.name,)
    admin = factory.admin()
    await admin.start()
    seen: dict[str, str] = {}

    async def repaired() -> bool:
        seen.update(await describe_topic_configs(admin, spec.name))
        return seen["retention.ms"] == str(spec.retention_ms)

    try:  # the broker applies an altered config a moment after it answers the change
        await wait_until(repaired, timeout=30, what=f"retention.ms of {spec.name} repaired")
    finally:
        await admin.close()
    assert seen["retention.ms"] == str(spec.retention_ms)


async def test_round_trip_with_keys_headers_and_per_key_order(factory: KafkaFactory) -> None:
    topic = factory.layout.ingress("gpt")
    await ensure_topics(factory, factory.layout.model_specs("gpt", []))
    producer = factory.producer()
    await producer.start()
    sent: dict[str, list[int]] = {}
    try:
        futures = []
        for i in range(60):
            key = f"user-{i % 6}"
            req = inference_pb2.InferenceRequest(request_id=f"r{i}", model="gpt", routing_key=key)
            sent.setdefault(key, []).append(i)
            futures.append(
                await producer.send(
                    topic,
                    serde.encode(req),
                    key=key.encode(),
                    headers=[("seq", str(i).encode()), ("kind", b"test")],
                )
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()

    consumer = factory.consumer(
        topic, options=ConsumerOptions(group_id=f"{factory.settings.topic_prefix}-g")
    )
    await consumer.start()
    received: dict[str, list[int]] = {}
    partitions_of_key: dict[str, set[int]] = {}
    try:
        deadline = asyncio.get_running_loop().time() + 30
        total = 0
        while total < 60 and asyncio.get_running_loop().time() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    req = serde.decode(inference_pb2.InferenceRequest, record.value)
                    headers = dict(record.headers)
                    assert headers["kind"] == b"test"
                    key = record.key.decode()
                    assert key == req.routing_key
                    seq = int(headers["seq"])
                    assert req.request_id == f"r{seq}"
                    received.setdefault(key, []).append(seq)
                    partitions_of_key.setdefault(key, set()).add(tp.partition)
                    total += 1
        await consumer.commit()
    finally:
        await consumer.stop()
    assert received == sent  # every record, and per key in the order sent
    assert all(len(p) == 1 for p in partitions_of_key.values())
    assert len({p for ps in partitions_of_key.values() for p in ps}) == 2  # keys spread


async def test_reading_a_compacted_topic_gives_the_latest_value_per_key(
    factory: KafkaFactory,
) -> None:
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs())
    producer = factory.producer()
    await producer.start()
    try:
        for epoch in range(1, 6):
            for model in ("gpt", "bert"):
                table = control_pb2.RoutingTable(model=model, epoch=epoch, stable_version="v1")
                await producer.send_and_wait(
                    layout.routing(), serde.encode(table), key=model.encode()
                )
        await producer.send_and_wait(layout.routing(), None, key=b"retired")
    finally:
        await producer.stop()
    latest = await read_latest_per_key(factory, layout.routing())
    assert set(latest) == {b"gpt", b"bert", b"retired"}
    assert latest[b"retired"] is None
    for model in (b"gpt", b"bert"):
        table = serde.decode(control_pb2.RoutingTable, latest[model])
        assert table.epoch == 5 and table.model == model.decode()


async def test_reading_an_empty_compacted_topic(factory: KafkaFactory) -> None:
    await ensure_topics(factory, factory.layout.shared_specs())
    assert await read_latest_per_key(factory, factory.layout.precision()) == {}
