"""Sizes against a stock cluster's limit, on the real broker: the test's topics carry
``max.message.bytes=1048588`` (Kafka's default; the local broker allows 8 MiB).

Regressions: a request just under its version topic's limit, enlarged by the
router's routing fields, was forwarded anyway, refused by the broker
(``MessageSizeTooLargeError``, not retriable) and the router stopped; a record near
the limit with big headers yielded a dead letter over the dead-letter topic's
limit (every header copied) and stopped the router the same way; a result of a
few MB, under the worker's own 8 MiB check but over the reply topic's limit, was
sent, refused, and the worker stopped. Each record was read again on every
restart: a crash loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from graylane import serde
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.kafka.admin import describe_topic_configs, ensure_topics, topic_overrides
from graylane.kafka.seam import Headers, KafkaFactory
from graylane.services.router.service import Router, RouterConfig
from graylane.topics import TopicSpec
from graylane.v1 import dlq_pb2, inference_pb2
from tests.support.batches import batch_bytes, big_headers, record_at
from tests.support.engines import DelegatingEngine
from tests.support.stack import read_topic, running_stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

MODEL = "gpt"
STOCK_LIMIT = 1_048_588
"""Kafka's default ``message.max.bytes`` (and so a stock topic's ``max.message.bytes``)."""


async def at_stock_limit(factory: KafkaFactory, specs: Sequence[TopicSpec]) -> None:
    """Create ``specs`` and set ``max.message.bytes`` to the stock limit on each."""
    await ensure_topics(factory, specs)
    admin = factory.admin()
    await admin.start()
    try:
        for spec in specs:
            configs = {
                **await topic_overrides(admin, spec.name),
                "max.message.bytes": str(STOCK_LIMIT),
            }
            await admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, spec.name, configs=configs)]
            )

        async def applied() -> bool:
            for spec in specs:
                configs = await describe_topic_configs(admin, spec.name)
                if configs.get("max.message.bytes") != str(STOCK_LIMIT):
                    return False
            return True

        await wait_until(applied, timeout=15, what="the stock limit on every topic")
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def stock_router(factory: KafkaFactory) -> AsyncIterator[asyncio.Task[None]]:
    """A router whose topics (ingress, version topic, results, dlq) are at the stock limit."""
    layout = factory.layout
    await at_stock_limit(factory, layout.shared_specs() + layout.model_specs(MODEL, ["v1"]))
    router = Router(factory, RouterConfig(stable_versions={MODEL: "v1"}))
    stop = asyncio.Event()
    task = asyncio.create_task(router.run(stop))
    await asyncio.wait_for(router.ready.wait(), 60)
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def send(
    factory: KafkaFactory, value: bytes, key: bytes, headers: Headers | None = None
) -> None:
    producer = factory.producer(client_suffix="test-writer")
    await producer.start()
    try:
        await producer.send_and_wait(factory.layout.ingress(MODEL), value, key=key, headers=headers)
    finally:
        await producer.stop()


async def still_routes(factory: KafkaFactory, task: asyncio.Task[None]) -> None:
    """A small request after the big one reaches the version topic: the router goes on."""
    small = inference_pb2.InferenceRequest(request_id="small-1", model=MODEL, prompt="hi")
    await send(factory, serde.encode(small), b"small-1")
    forwarded = await read_topic(factory, factory.layout.version_requests(MODEL, "v1"), expect=1)
    ids = [serde.decode(inference_pb2.InferenceRequest, v).request_id for v in forwarded]
    assert ids == ["small-1"]
    assert not task.done()


async def test_a_forward_enlarged_past_the_version_topics_limit_is_answered(
    factory: KafkaFactory,
) -> None:
    key = b"big-1"

    def request(size: int) -> bytes:
        return serde.encode(
            inference_pb2.InferenceRequest(request_id="big-1", model=MODEL, prompt="x" * size)
        )

    # The largest request the ingress accepts (a few bytes under the limit).
    size = STOCK_LIMIT - batch_bytes(request(0), key)
    while batch_bytes(request(size), key) > STOCK_LIMIT - 4:
        size -= 1
    async with stock_router(factory) as task:
        await send(factory, request(size), key)
        (reply,) = [
            serde.decode(inference_pb2.InferenceResult, v)
            for v in await read_topic(factory, factory.layout.results(MODEL), expect=1)
        ]
        assert reply.request_id == "big-1" and reply.status == inference_pb2.ERROR
        assert reply.error_code == inference_pb2.PAYLOAD_TOO_LARGE, reply.error_message
        assert "1048588" in reply.error_message
        await still_routes(factory, task)


async def test_a_dead_letter_of_a_record_near_the_limit_with_big_headers_is_delivered(
    factory: KafkaFactory,
) -> None:
    headers = big_headers()
    key = b"k" * 1_000
    value = record_at(STOCK_LIMIT - 100, key, headers, fill=b"\xff").value or b""
    async with stock_router(factory) as task:
        await send(factory, value, key, headers)  # not a request: a dead letter
        (letter,) = [
            serde.decode(dlq_pb2.DeadLetter, v)
            for v in await read_topic(factory, factory.layout.dlq(), expect=1)
        ]
        assert letter.error_code == inference_pb2.DECODE_ERROR
        assert letter.original_header_count == 2000
        assert letter.original_length == len(value)
        assert value.startswith(letter.original_value) and letter.original_value
        await still_routes(factory, task)


class WideLogits(DelegatingEngine):
    """The demo GPT with its logits repeated 8 times along the vocabulary: big results."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.inner.run(feeds)
        return {**outputs, "logits": np.tile(outputs["logits"], (1, 1, 8))}


async def test_a_result_over_the_reply_topics_limit_is_answered_result_too_large(
    factory: KafkaFactory, models: dict[str, Path]
) -> None:
    layout = factory.layout
    await at_stock_limit(factory, layout.shared_specs() + layout.model_specs(MODEL, ["v1"]))
    engine = WideLogits(OnnxRuntimeEngine.load(models["v1"], "fp32", intra_op_threads=1))
    async with running_stack(
        factory,
        model=MODEL,
        versions={"v1": models["v1"]},
        stable="v1",
        engines={"v1": {"fp32": engine}},
    ) as stack:
        # 200 tokens of logits, 2064 wide, float32: 1.65 MB, over the 1 MiB limit.
        big = inference_pb2.InferenceRequest(
            request_id="big-result", model=MODEL, token_ids=[5] * 200
        )
        await send(factory, serde.encode(big), b"big-result")
        small = inference_pb2.InferenceRequest(request_id="small-result", model=MODEL, prompt="hi")
        await send(factory, serde.encode(small), b"small-result")
        replies = {
            r.request_id: r
            for r in (
                serde.decode(inference_pb2.InferenceResult, v)
                for v in await read_topic(factory, layout.results(MODEL), expect=2)
            )
        }
        assert replies["big-result"].error_code == inference_pb2.RESULT_TOO_LARGE
        assert "1048588" in replies["big-result"].error_message
        # The worker goes on: the next request is served.
        assert replies["small-result"].status == inference_pb2.OK
        assert not any(t.done() for t in stack.tasks)
