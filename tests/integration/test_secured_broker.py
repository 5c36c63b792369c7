"""Least privilege on a real secured broker (SASL/PLAIN + StandardAuthorizer + Graylane's ACLs).

A private broker in secured mode (``GRAYLANE_KAFKA_SECURE=1``, its own state folder and
ports) so the shared test broker stays plaintext. Every process logs in as its own role;
the ACLs are the ones ``graylane acls --apply`` grants.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaError,
    TopicAuthorizationFailedError,
)

from graylane import serde
from graylane.acls import AclScope
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.service import Worker
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.services.router.service import Router, RouterConfig
from graylane.v1 import inference_pb2
from tests.support.brokers import SecuredBroker, grant_roles, secured_broker
from tests.support.records import forward_request
from tests.support.stack import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
CLIENT = "app1"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with secured_broker(tmp_path_factory.mktemp("secured-kafka")) as broker:
        yield broker


async def _contents(factory: KafkaFactory, topics: list[str]) -> dict[str, list[bytes | None]]:
    return {t: [r.value for r in await read_to_end(factory, t)] for t in topics}


async def test_each_role_gets_only_its_topics_and_a_producer_cannot_write_control_state(
    secured: SecuredBroker, tmp_path: Path
) -> None:
    prefix = f"s{uuid.uuid4().hex[:8]}"
    admin = KafkaFactory(secured.settings("admin", prefix, tmp_path))
    layout = admin.layout
    await ensure_topics(admin, layout.shared_specs() + layout.model_specs(MODEL, ["1.0.0"]))
    await ensure_topics(admin, [layout.reply_spec(CLIENT)])
    await grant_roles(admin, AclScope(models=(MODEL,), clients=(CLIENT,)))

    # The router and a worker, each with its own login, serve a request end to end.
    model_path = write_demo_gpt(tmp_path / "m.onnx", "tiny", seed=1)
    router = Router(
        KafkaFactory(secured.settings("router", prefix, tmp_path)),
        RouterConfig(stable_versions={MODEL: "1.0.0"}),
    )
    engine = OnnxRuntimeEngine.load(model_path, "fp32", name=MODEL, intra_op_threads=1)
    worker = Worker(
        KafkaFactory(secured.settings("worker", prefix, tmp_path)),
        WorkerConfig(
            model=MODEL,
            version="1.0.0",
            initial_variant="fp32",
            max_seq_len=64,
            buckets=(16, 32, 64),
            max_batch_size=4,
            worker_id="secured-1",
        ),
        {"fp32": engine},
    )
    stop = asyncio.Event()
    tasks = [asyncio.create_task(router.run(stop)), asyncio.create_task(worker.run(stop))]
    producer_factory = KafkaFactory(secured.settings("producer", prefix, tmp_path))
    producer = producer_factory.producer()
    await producer.start()
    try:
        await asyncio.wait_for(asyncio.gather(router.ready.wait(), worker.ready.wait()), 60)
        request = forward_request(MODEL, layout.reply(CLIENT))
        await producer.send_and_wait(layout.ingress(MODEL), serde.encode(request), key=b"u")
        # The producer reads its own reply topic (no consumer group: none is granted).
        replies = await read_topic(producer_factory, layout.reply(CLIENT), expect=1, timeout_s=60)
        results = [serde.decode(inference_pb2.InferenceResult, v) for v in replies]
        assert [r.request_id for r in results] == [request.request_id]
        assert results[0].status == inference_pb2.OK, results[0].error_message

        # A producer can write nothing but ingress: every control, data or audit topic refuses.
        forbidden = [
            layout.rollouts(),
            layout.routing(),
            layout.precision(),
            layout.commands(),
            layout.audit(),
            layout.telemetry(),
            layout.dlq(),
            layout.version_requests(MODEL, "1.0.0"),
            layout.results(MODEL),
        ]
        before = await _contents(admin, forbidden)
        for topic in forbidden:
            with pytest.raises((TopicAuthorizationFailedError, KafkaError)) as refused:
                await producer.send_and_wait(topic, b"forged", key=MODEL.encode())
            assert "uthoriz" in type(refused.value).__name__ + str(refused.value), topic
        assert await _contents(admin, forbidden) == before

        # Nor can it read another client's replies or join a service's consumer group.
        other = producer_factory.consumer(
            layout.version_requests(MODEL, "1.0.0"),
            client_suffix="snoop",
        )
        with pytest.raises((TopicAuthorizationFailedError, GroupAuthorizationFailedError)):
            await other.start()
            await asyncio.wait_for(other.getmany(timeout_ms=5000), 30)  # type: ignore[attr-defined]
        await other.stop()
        assert all(not t.done() for t in tasks), "a service ended"
    finally:
        await producer.stop()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
