"""Requests through the whole path on the real broker:
client -> ingress -> router -> per-version topic -> worker -> reply topic."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from graylane import serde
from graylane.client import GraylaneClient, RequestRejected, Task, UnknownModel
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.batch_generation import run_generate
from graylane.engine_worker.forward import run_forward
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.routing.convert import table_to_pb
from graylane.routing.table import RoutingRule, table_for_weights
from graylane.serde import PostProcess
from graylane.serde import PostProcess as EnginePost
from graylane.v1 import inference_pb2, telemetry_pb2
from tests.support.records import produce
from tests.support.stack import dead_letters, read_topic, running_stack, wait_for_table
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"


async def publish_table(factory: KafkaFactory, **kwargs: object) -> None:
    table = table_for_weights(model=MODEL, **kwargs)  # type: ignore[arg-type]
    await produce(factory, factory.layout.routing(), serde.encode(table_to_pb(table)), key=MODEL)


async def test_both_tasks_through_the_whole_path(
    factory: KafkaFactory, models: dict[str, Path]
) -> None:
    reference = OnnxRuntimeEngine.load(models["v2"], "fp32", intra_op_threads=1)
    async with running_stack(factory, model=MODEL, versions=models, stable="v1") as stack:
        async with GraylaneClient(factory) as client:
            # No table yet: everything goes to the stable version.
            first = await client.infer(
                MODEL,
                prompt="hello",
                post_process=PostProcess.ARGMAX_LAST,
                routing_key="u0",
                timeout=30,
            )
            assert first.version == "v1" and first.variant == "fp32"

            # Rule: testers reach v2; everyone else stays on v1 (weight 0).
            await publish_table(
                factory,
                stable_version="v1",
                weights=[("v2", 0.0)],
                epoch=1,
                rules=[RoutingRule("testers", (("group", "internal"),), "v2")],
            )
            await wait_for_table(stack, MODEL, epoch=1)

            prompt = "graylane routes"
            gen = await client.infer(
                MODEL,
                prompt=prompt,
                task=Task.GENERATE,
                max_new_tokens=12,
                tags={"group": "internal"},
                routing_key="u1",
                timeout=30,
            )
            assert gen.version == "v2"
            expected = run_generate(reference, [list(prompt.encode())], 12, None, 256)[0]
            assert gen.tokens == expected.tokens  # the real engine's greedy tokens
            assert len(gen.tokens) == 12

            ids = np.array([[5, 6, 7, 8, 9]], dtype=np.int64)
            fwd = await client.infer(
                MODEL,
                inputs={"input_ids": ids, "attention_mask": np.ones_like(ids)},
                post_process=PostProcess.TOPK_LAST,
                top_k=3,
                tags={"group": "internal"},
                timeout=30,
            )
            ref = run_forward(
                reference,
                [{"input_ids": ids, "attention_mask": np.ones_like(ids)}],
                EnginePost.TOPK_LAST,
                3,
            )[0]
            assert fwd.version == "v2"
            np.testing.assert_array_equal(fwd.outputs["topk_ids"], ref["topk_ids"])

            # Raw logits come back as named tensors.
            raw = await client.infer(MODEL, token_ids=[1, 2, 3], routing_key="u2", timeout=30)
            assert raw.outputs["logits"].shape == (1, 3, 258)

            # A few hundred requests in flight at once: all answered, batched.
            ids_sent = [
                await client.submit(
                    MODEL,
                    prompt=f"request {i}",
                    routing_key=f"user-{i}",
                    post_process=PostProcess.ARGMAX_LAST,
                )
                for i in range(200)
            ]
            got = {}

            async def collect() -> None:
                async for r in client.results():
                    got[r.request_id] = r
                    if len(got) == len(ids_sent):
                        return

            await asyncio.wait_for(collect(), 90)
            assert set(got) == set(ids_sent)
            assert all(r.ok for r in got.values())
            assert max(r.timing.batch_size for r in got.values()) > 1

        # One telemetry record per batch, not per request.
        served = sum(w.served for w in stack.workers.values())
        telemetry = [
            serde.decode(telemetry_pb2.BatchTelemetry, v)
            for v in await read_topic(factory, factory.layout.telemetry(), expect=1, timeout_s=30)
        ]
    records: list[telemetry_pb2.BatchTelemetry] = []

    async def every_request_counted() -> bool:
        batches = await read_to_end(factory, factory.layout.telemetry())
        records[:] = [
            serde.decode(telemetry_pb2.BatchTelemetry, r.value) for r in batches if r.value
        ]
        return sum(r.request_count for r in records) >= served

    await wait_until(every_request_counted, timeout=30, poll_s=0.5, what="telemetry of every batch")
    assert telemetry, (served, len(records))
    assert sum(r.request_count for r in records) == served
    assert len(records) < served
    assert all(r.latency.count == r.request_count for r in records)


async def test_every_kind_of_bad_input_is_answered_and_the_next_request_served(
    factory: KafkaFactory, models: dict[str, Path]
) -> None:
    factory = KafkaFactory(factory.settings.with_overrides(max_request_bytes=64 * 1024))
    layout = factory.layout
    async with running_stack(
        factory, model=MODEL, versions={"v1": models["v1"]}, stable="v1"
    ) as stack:
        async with GraylaneClient(factory) as client:
            producer = factory.producer()
            await producer.start()

            async def served() -> None:
                ok = await client.infer(MODEL, prompt="still fine", timeout=30)
                assert ok.ok and ok.outputs["logits"].shape[1] == len("still fine")

            async def rejected(code: str, **kwargs: object) -> None:
                with pytest.raises(RequestRejected) as info:
                    await client.infer(MODEL, timeout=30, **kwargs)
                assert info.value.result.error_code == code, info.value.result.error_message
                assert info.value.result.error_message
                await served()

            ids = np.array([[1, 2, 3]], dtype=np.int64)
            mask = np.ones_like(ids)
            await rejected("MISSING_INPUT", inputs={"input_ids": ids})
            await rejected(
                "UNEXPECTED_INPUT", inputs={"input_ids": ids, "attention_mask": mask, "extra": mask}
            )
            await rejected(
                "BAD_DTYPE", inputs={"input_ids": ids.astype(np.float32), "attention_mask": mask}
            )
            await rejected(
                "BAD_SHAPE", inputs={"input_ids": ids[None], "attention_mask": mask[None]}
            )
            await rejected("SEQUENCE_TOO_LONG", token_ids=list(range(200)) * 2)
            await rejected(
                "SEQUENCE_TOO_LONG", task=Task.GENERATE, max_new_tokens=4, token_ids=[7] * 300
            )
            await rejected(
                "PAYLOAD_TOO_LARGE",
                inputs={
                    "input_ids": np.zeros((1, 20_000), np.int64),
                    "attention_mask": np.zeros((1, 20_000), np.int64),
                },
            )
            await rejected("DEADLINE_EXCEEDED", prompt="late", deadline_s=-1.0)
            await rejected("BAD_REQUEST", task=Task.GENERATE, prompt="x", max_new_tokens=0)

            # A request naming another model on this model's ingress.
            wrong = client.build_request("other-model", prompt="x", reply_topic="")
            await producer.send_and_wait(layout.ingress(MODEL), serde.encode(wrong))
            # Pinning a version nobody serves (pinning allowed by the table).
            await publish_table(factory, stable_version="v1", epoch=5, allow_pinning=True)
            await wait_for_table(stack, MODEL, epoch=5)
            with pytest.raises(UnknownModel) as unknown:
                await client.infer(MODEL, prompt="x", pinned_version="v9", timeout=30)
            assert unknown.value.result is not None
            assert unknown.value.result.error_code == "UNKNOWN_VERSION"
            await served()

            # A model with no topics at all is refused by the client itself.
            with pytest.raises(UnknownModel):
                await client.infer("no-such-model", prompt="x", timeout=5)

            # Unidentifiable input goes to the DLQ with its original bytes.
            garbage = b"\xff\xfe not a protobuf \x00"
            at_router = await producer.send_and_wait(layout.ingress(MODEL), garbage, key=b"k1")
            no_id = client.build_request(MODEL, prompt="x", request_id="")
            no_id.request_id = ""
            await producer.send_and_wait(layout.ingress(MODEL), serde.encode(no_id))
            at_worker = await producer.send_and_wait(
                layout.version_requests(MODEL, "v1"), garbage + b"v"
            )
            lost = client.build_request(MODEL, prompt="x", reply_topic=f"{layout.prefix}.nowhere")
            await producer.send_and_wait(layout.ingress(MODEL), serde.encode(lost))
            await served()
            await producer.stop()

            letters = await dead_letters(factory, expect=4)
            by_value = {bytes(d.original_value): d for d in letters}
            router_letter = by_value[garbage]
            assert router_letter.source_topic == layout.ingress(MODEL)
            assert router_letter.error_code == inference_pb2.DECODE_ERROR
            assert router_letter.original_key == b"k1" and router_letter.reason
            assert router_letter.service == "router"
            where = (router_letter.source_partition, router_letter.source_offset)
            assert where == (at_router.partition, at_router.offset)
            worker_letter = by_value[garbage + b"v"]
            assert worker_letter.source_topic == layout.version_requests(MODEL, "v1")
            assert worker_letter.service.startswith("worker")
            where = (worker_letter.source_partition, worker_letter.source_offset)
            assert where == (at_worker.partition, at_worker.offset)
            assert any("no request_id" in d.reason for d in letters)
            assert any("nowhere" in d.reason for d in letters)
            assert all(d.source_offset >= 0 and d.failed_at_unix_ms > 0 for d in letters)

        results = [
            serde.decode(inference_pb2.InferenceResult, v)
            for v in await read_topic(factory, layout.results(MODEL), expect=1)
        ]
        assert [r.error_code for r in results] == [inference_pb2.UNKNOWN_MODEL]
        assert "other-model" in results[0].error_message


async def test_shadow_copies_are_paired_and_never_reach_the_producer(
    factory: KafkaFactory, models: dict[str, Path]
) -> None:
    async with running_stack(factory, model=MODEL, versions=models, stable="v1") as stack:
        await publish_table(
            factory, stable_version="v1", shadow_version="v2", shadow_share=1.0, epoch=1
        )
        await wait_for_table(stack, MODEL, epoch=1)
        async with GraylaneClient(factory) as client:
            sent = [
                await client.submit(
                    MODEL,
                    prompt=f"shadow {i}",
                    routing_key=f"u{i}",
                    post_process=PostProcess.ARGMAX_LAST,
                )
                for i in range(20)
            ]
            got = []

            async def collect() -> None:
                async for r in client.results():
                    got.append(r)
                    if len(got) == len(sent):
                        return

            await asyncio.wait_for(collect(), 60)
            reply_topic = client.reply_topic
        assert sorted(r.request_id for r in got) == sorted(sent)
        assert {r.version for r in got} == {"v1"}
        shadow = [
            serde.decode(inference_pb2.InferenceResult, v)
            for v in await read_topic(factory, factory.layout.shadow(MODEL), expect=40)
        ]
    # The stack has stopped, nothing more is written: every request was answered once,
    # by the stable version only, and no shadow result reached the producer's reply topic.
    replies = [
        serde.decode(inference_pb2.InferenceResult, r.value)
        for r in await read_to_end(factory, reply_topic)
        if r.value
    ]
    assert sorted(r.request_id for r in replies) == sorted(sent)
    assert {r.version for r in replies} == {"v1"}
    assert not any(r.shadow for r in replies)
    candidate = {r.request_id for r in shadow if r.shadow and r.version == "v2"}
    mirrored = {r.request_id for r in shadow if not r.shadow and r.version == "v1"}
    assert candidate == mirrored == set(sent)  # pairs for the output-agreement check
    # Both halves of each pair carry one pair id of the router's (the policy engine pairs
    # on it, not on the client's request id), one id per request.
    pair_ids = {(r.request_id, r.version): r.shadow_pair_id for r in shadow}
    for rid in sent:
        assert pair_ids[(rid, "v1")] == pair_ids[(rid, "v2")] != ""
    assert len({pair_ids[(rid, "v1")] for rid in sent}) == len(sent)
