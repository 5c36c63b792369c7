"""Kafka's normal events are not fatal, on the real broker (issue 10, item 3).

(a) A second router joins the group while the first has a batch in flight: the
    first lets its batch finish and commit before giving partitions away (it used
    to die of ``IllegalStateError``/``CommitFailedError`` on that commit), both
    stay up and every request is forwarded.
(b) A client's reply topic is deleted while a worker runs: that client's request
    becomes a dead letter, the worker stays up and later requests are answered
    (it used to retry the send to the deleted topic for ever, answering nothing).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest

from graylane import serde
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.services.router.service import Router, RouterConfig
from graylane.v1 import inference_pb2
from tests.support.records import forward_request
from tests.support.stack import dead_letters, read_topic, running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"


async def forwarded_ids(factory: KafkaFactory) -> set[str]:
    records = await read_to_end(factory, factory.layout.version_requests(MODEL, "v1"))
    return {serde.decode(inference_pb2.InferenceRequest, r.value).request_id for r in records}


async def test_a_rebalance_during_a_router_batch_loses_nothing_and_kills_no_one(
    factory: KafkaFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="graylane.kafka.guard")
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(MODEL, ["v1"]))
    group = f"{layout.prefix}-router-rebalance"
    first = Router(factory, RouterConfig(stable_versions={MODEL: "v1"}, group_id=group))
    second = Router(factory, RouterConfig(stable_versions={MODEL: "v1"}, group_id=group))
    gate, gated = asyncio.Event(), asyncio.Event()
    route_all = first._route_all

    async def held(records: list, sink: object) -> list:  # type: ignore[type-arg]
        if not gate.is_set():
            gated.set()
            await gate.wait()  # the batch stays in flight while the group rebalances
        return await route_all(records, sink)  # type: ignore[arg-type]

    first._route_all = held  # type: ignore[method-assign]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(first.run(stop))]
    producer = factory.producer()
    await producer.start()
    sent: set[str] = set()
    try:
        await asyncio.wait_for(first.ready.wait(), 60)

        async def send(count: int) -> None:
            for i in range(count):
                req = forward_request(
                    MODEL, layout.results(MODEL), routing_key=f"user-{uuid.uuid4().hex[:6]}-{i}"
                )
                sent.add(req.request_id)
                await producer.send_and_wait(layout.ingress(MODEL), serde.encode(req))

        await send(20)
        await asyncio.wait_for(gated.wait(), 60)
        tasks.append(asyncio.create_task(second.run(stop)))

        def rebalancing() -> bool:
            waiting = "rebalance with a batch in flight" in caplog.text
            return waiting or second.observability.readiness()  # old code: no wait at all

        await wait_until(rebalancing, timeout=60, what="the second router joined")
        gate.set()
        await wait_until(second.observability.readiness, timeout=60, what="second assigned")
        await send(20)

        async def all_forwarded() -> bool:
            assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            return sent <= await forwarded_ids(factory)

        await wait_until(all_forwarded, timeout=90, poll_s=0.5, what="every request forwarded")
        assert not any(t.done() for t in tasks)  # both routers are alive
    finally:
        gate.set()
        stop.set()
        await producer.stop()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)]


async def test_a_deleted_reply_topic_does_not_stop_the_worker(
    factory: KafkaFactory, tmp_path: Path
) -> None:
    layout = factory.layout
    client = "c1"
    reply = layout.reply(client)
    await ensure_topics(factory, [layout.reply_spec(client)])
    model = write_demo_gpt(tmp_path / "v1.onnx", "tiny", seed=1)
    producer = factory.producer()
    await producer.start()
    try:
        async with running_stack(factory, model=MODEL, versions={"v1": model}, stable="v1") as st:
            first = forward_request(MODEL, reply, routing_key="k")
            await producer.send_and_wait(layout.ingress(MODEL), serde.encode(first))
            answers = await read_topic(factory, reply, expect=1, timeout_s=60)
            assert len(answers) == 1
            admin = factory.admin()
            await admin.start()
            try:
                await admin.delete_topics([reply])
            finally:
                await admin.close()
            orphan = forward_request(MODEL, reply, routing_key="k")
            later = forward_request(MODEL, layout.results(MODEL), routing_key="k")
            for req in (orphan, later):
                await producer.send_and_wait(layout.ingress(MODEL), serde.encode(req))
            letters = [
                letter
                for letter in await dead_letters_within(factory, 120)
                if letter.source_topic == layout.version_requests(MODEL, "v1")
            ]
            (letter,) = letters
            orphaned = serde.decode(inference_pb2.InferenceRequest, letter.original_value)
            assert orphaned.request_id == orphan.request_id
            assert "does not exist" in letter.reason
            results = await read_topic(factory, layout.results(MODEL), expect=1, timeout_s=60)
            ids = {serde.decode(inference_pb2.InferenceResult, v).request_id for v in results}
            assert later.request_id in ids
            assert not any(t.done() for t in st.tasks)  # router and worker are alive
    finally:
        await producer.stop()


async def dead_letters_within(factory: KafkaFactory, timeout_s: float) -> list:  # type: ignore[type-arg]
    found: list = []  # type: ignore[type-arg]

    async def arrived() -> bool:
        found[:] = await dead_letters(factory, expect=1)
        return bool(found)

    await wait_until(arrived, timeout=timeout_s, poll_s=1.0, what="a dead letter")
    return found
