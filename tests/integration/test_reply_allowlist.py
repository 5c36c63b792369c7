"""Reply topics are an allowlist, on the real broker.

Regression (issue 10, item 1): a request naming ``<p>.control.rollouts`` as its
reply topic made the worker write an ``InferenceResult`` into the control topic.
Now router and worker send such a request to the DLQ (``BAD_REPLY_TOPIC``) and
the named topics stay byte-for-byte unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka import TopicPartition

from graylane import serde
from graylane.kafka.admin import ensure_topics, partition_count
from graylane.kafka.seam import ConsumerOptions, KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.routing.convert import table_to_pb
from graylane.routing.table import table_for_weights
from graylane.v1 import inference_pb2
from tests.support.records import forward_request
from tests.support.stack import dead_letters, read_topic, running_stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
OTHER = "othermodel"

Snapshot = dict[int, list[tuple[int, bytes | None, bytes | None]]]


async def snapshot(factory: KafkaFactory, topic: str) -> Snapshot:
    """Every record (offset, key, value) of every partition of ``topic``."""
    admin = factory.admin()
    await admin.start()
    try:
        count = await partition_count(admin, topic)
    finally:
        await admin.close()
    consumer = factory.consumer(options=ConsumerOptions(group_id=None), client_suffix="snap")
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        await consumer.seek_to_beginning(*parts)
        out: Snapshot = {tp.partition: [] for tp in parts}
        for tp in parts:
            while await consumer.position(tp) < ends[tp]:
                fetched = await consumer.getmany(tp, timeout_ms=500)
                for record in fetched.get(tp, []):
                    out[tp.partition].append((record.offset, record.key, record.value))
            assert len(out[tp.partition]) <= ends[tp]
        return out
    finally:
        await consumer.stop()


async def test_a_request_cannot_write_control_audit_or_another_models_topics(
    factory: KafkaFactory, tmp_path: Path
) -> None:
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(OTHER, ["v1"]))
    # Something to compare byte for byte: a marker record in each guarded topic.
    guarded = [layout.rollouts(), layout.routing(), layout.audit(), layout.results(OTHER)]
    producer = factory.producer()
    await producer.start()
    try:
        # The router reads the routing topic: it gets a valid table (of a model
        # the router does not serve) rather than bytes it would log as undecodable.
        table = table_to_pb(table_for_weights(model=OTHER, stable_version="v1", weights=[]))
        for topic in guarded:
            value = serde.encode(table) if topic == layout.routing() else b"marker"
            await producer.send_and_wait(topic, value, key=b"marker")
        before = {topic: await snapshot(factory, topic) for topic in guarded}

        refused = [*guarded, f"{layout.prefix}.reply.not.a.name", "elsewhere.results.gpt"]
        model = write_demo_gpt(tmp_path / "v1.onnx", "tiny", seed=1)
        async with running_stack(factory, model=MODEL, versions={"v1": model}, stable="v1"):
            sent: dict[str, tuple[str, str]] = {}  # request id -> (reply topic, source topic)
            for topic in refused:
                # Through the router, and straight onto the version topic (the
                # worker checks too: its input may not come from our router).
                for target in (layout.ingress(MODEL), layout.version_requests(MODEL, "v1")):
                    req = forward_request(MODEL, topic)
                    sent[req.request_id] = (topic, target)
                    await producer.send_and_wait(target, serde.encode(req), key=b"k")
            # A good request afterwards: its answer shows the path is alive.
            good = forward_request(MODEL, layout.results(MODEL))
            await producer.send_and_wait(layout.ingress(MODEL), serde.encode(good), key=b"k")
            answers = await read_topic(factory, layout.results(MODEL), expect=1, timeout_s=60)
            assert [serde.decode(inference_pb2.InferenceResult, v).request_id for v in answers] == [
                good.request_id
            ]
            letters = await dead_letters(factory, expect=len(sent))
        assert len(letters) == len(sent)
        for letter in letters:
            req = serde.decode(inference_pb2.InferenceRequest, letter.original_value)
            reply_topic, source = sent[req.request_id]
            assert letter.error_code == inference_pb2.BAD_REPLY_TOPIC, letter.reason
            assert letter.source_topic == source
            by_router = source == layout.ingress(MODEL)
            assert letter.service == ("router" if by_router else "worker:gpt/v1")
            assert reply_topic[:60] in letter.reason
        after = {topic: await snapshot(factory, topic) for topic in guarded}
        assert after == before
    finally:
        await producer.stop()
