"""Issue 10 item 4 on the real broker: a rollout cannot start while its candidate has
no topic or no worker in its consumer group, and the refusal says how to start one."""

from __future__ import annotations

import pytest

from graylane.kafka.admin import ensure_topics
from graylane.kafka.seam import ConsumerOptions, KafkaFactory
from graylane.services.controlplane.bus import KafkaCandidateCheck
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

MODEL = "gpt"


async def test_candidate_needs_a_topic_and_a_consuming_worker(factory: KafkaFactory) -> None:
    layout = factory.layout
    check = KafkaCandidateCheck(factory, layout)
    missing = await check(MODEL, "2.0.0")
    assert missing is not None and "does not exist" in missing
    assert "graylane serve worker --model gpt --version 2.0.0" in missing

    await ensure_topics(factory, layout.model_specs(MODEL, ["2.0.0"]))
    idle = await check(MODEL, "2.0.0")
    assert idle is not None and layout.worker_group(MODEL, "2.0.0") in idle

    consumer = factory.consumer(
        layout.version_requests(MODEL, "2.0.0"),
        options=ConsumerOptions(group_id=layout.worker_group(MODEL, "2.0.0")),
        client_suffix="fake-worker",
    )
    await consumer.start()
    try:
        await consumer.getmany(timeout_ms=100)
        await wait_until(lambda: bool(consumer.assignment()), timeout=30, what="group join")
        assert await check(MODEL, "2.0.0") is None
    finally:
        await consumer.stop()
