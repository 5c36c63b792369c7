"""The worker end to end on an in-memory Kafka: requests in, results and telemetry out.

A real ONNX Runtime engine (the tiny demo GPT) serves; the expected answers are
computed by running the same engine directly. The Kafka double is
``tests/support/memory_kafka.py`` behind the seam protocols; the worker's own
cycle (one turn of the library's consume loop with ``Worker.hooks``: collect, answer,
commit after delivery) runs on it.
Offset-commit *protocol* behaviour stays covered by the real-broker tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import NotLeaderForPartitionError

from graylane import serde
from graylane.clock import now_ms
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.batch_generation import run_generate
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.forward import run_forward
from graylane.engine_worker.postprocess import TOKEN_IDS
from graylane.engine_worker.service import Worker
from graylane.kafka.consume_loop import ConsumeLoop, LoopHooks
from graylane.kafka.replies import ReplySink
from graylane.models.byte_vocab import decode_tokens, encode_text
from graylane.models.demo_gpt import write_demo_gpt
from graylane.serde import PostProcess
from graylane.v1 import dlq_pb2, inference_pb2, telemetry_pb2
from tests.support.memory_kafka import MemoryBroker, MemoryFactory

MODEL, VERSION = "demo", "v1"
MAX_SEQ = 64


@pytest.fixture(scope="module")
def gpt_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("m") / "demo-tiny.onnx", "tiny", seed=5)


@pytest.fixture(scope="module")
def engine(gpt_path: Path) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine.load(gpt_path, "fp32", name=MODEL, intra_op_threads=1)


@dataclass
class Rig:
    broker: MemoryBroker
    factory: MemoryFactory
    worker: Worker
    serve: Serve

    @property
    def topic(self) -> str:
        return self.factory.layout.version_requests(MODEL, VERSION)

    @property
    def group(self) -> str:
        group = self.worker.consumer_options().group_id
        assert group is not None
        return group

    def committed(self) -> int | None:
        return self.broker.committed(self.group, TopicPartition(self.topic, 0))

    def read(self, topic: str) -> list[bytes]:
        return [r.value for r in self.broker.records(topic) if r.value is not None]


@dataclass
class Serve:
    loop: ConsumeLoop
    hooks: LoopHooks

    async def once(self) -> int:
        return await self.loop.turn(self.hooks)


@pytest.fixture
async def rig(engine: OnnxRuntimeEngine) -> AsyncIterator[Rig]:
    broker = MemoryBroker()
    factory = MemoryFactory(broker)
    layout = factory.layout
    await factory.ensure_topics(layout.shared_specs() + layout.model_specs(MODEL, [VERSION]))
    config = WorkerConfig(
        model=MODEL,
        version=VERSION,
        initial_variant="fp32",
        max_seq_len=MAX_SEQ,
        buckets=(16, 32, 64),
        max_batch_size=4,
        worker_id="w-test",
    )
    worker = Worker(factory, config, {"fp32": engine})  # type: ignore[arg-type]
    producer = factory.producer()
    await producer.start()
    loop = ConsumeLoop(
        "worker",
        factory,  # type: ignore[arg-type]
        [layout.version_requests(MODEL, VERSION)],
        worker.consumer_options(),
        role="worker",
        client_suffix="worker",
    )
    await loop.start()
    sink = ReplySink(producer, layout, "worker:test")  # type: ignore[arg-type]
    yield Rig(broker, factory, worker, Serve(loop, worker.hooks(sink, producer)))  # type: ignore[arg-type]
    await loop.stop()
    await producer.stop()


async def publish(rig: Rig, *values: bytes) -> None:
    for value in values:
        rig.broker.append(rig.topic, value, key=b"k", partition=0)


async def serve_until_committed(rig: Rig, offset: int, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while rig.committed() != offset:
            await rig.serve.once()


def request(request_id: str, **fields: object) -> inference_pb2.InferenceRequest:
    return inference_pb2.InferenceRequest(request_id=request_id, model=MODEL, **fields)  # type: ignore[arg-type]


def results_by_id(rig: Rig) -> dict[str, inference_pb2.InferenceResult]:
    decoded = [
        serde.decode(inference_pb2.InferenceResult, v)
        for v in rig.read(rig.factory.layout.results(MODEL))
    ]
    return {r.request_id: r for r in decoded}


async def test_requests_in_results_and_telemetry_out(rig: Rig, engine: OnnxRuntimeEngine) -> None:
    ids = np.array([[3, 40, 50, 60, 70]], dtype=np.int64)
    generate = request(
        "gen",
        prompt="hello",
        task=inference_pb2.GENERATE,
        generation=inference_pb2.GenerationParams(max_new_tokens=4),
    )
    argmax = request("argmax", token_ids=[5, 6, 7], post_process=inference_pb2.ARGMAX_LAST)
    forward = request(
        "tensors",
        inputs=serde.to_tensors({"input_ids": ids, "attention_mask": np.ones_like(ids)}),
    )
    await publish(rig, *(serde.encode(r) for r in (generate, argmax, forward)))

    await serve_until_committed(rig, 3)

    results = results_by_id(rig)
    assert set(results) == {"gen", "argmax", "tensors"}
    assert all(r.status == inference_pb2.OK for r in results.values())
    assert {(r.version, r.variant, r.worker_id) for r in results.values()} == {
        (VERSION, "fp32", "w-test")
    }
    # The answers are the engine's own: the same inference run directly.
    (expected_gen,) = run_generate(engine, [encode_text("hello")], 4, None, MAX_SEQ)
    assert tuple(results["gen"].generated_token_ids) == expected_gen.tokens
    assert results["gen"].text == decode_tokens(expected_gen.tokens)  # the demo's tokenizer
    (expected_argmax,) = run_forward(
        engine,
        [{"input_ids": np.array([[5, 6, 7]]), "attention_mask": np.ones((1, 3), np.int64)}],
        PostProcess.ARGMAX_LAST,
    )
    got_argmax = serde.from_tensors(results["argmax"].outputs)
    np.testing.assert_array_equal(got_argmax[TOKEN_IDS], expected_argmax[TOKEN_IDS])
    expected_logits = engine.run({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    got_logits = serde.from_tensors(results["tensors"].outputs)["logits"]
    np.testing.assert_allclose(got_logits, expected_logits["logits"], atol=1e-4)

    telemetry = [
        serde.decode(telemetry_pb2.BatchTelemetry, v)
        for v in rig.read(rig.factory.layout.telemetry())
    ]
    assert telemetry and {(t.model, t.version, t.variant) for t in telemetry} == {
        (MODEL, VERSION, "fp32")
    }
    assert sum(t.request_count for t in telemetry) == 3
    assert sum(t.error_count for t in telemetry) == 0
    assert rig.worker.served == 3


async def test_a_bad_item_gets_its_error_result_and_the_rest_are_served(rig: Rig) -> None:
    ids = np.array([[1, 2, 3]], dtype=np.int32)  # the model takes int64 ids
    bad_dtype = request(
        "bad-dtype",
        inputs=serde.to_tensors({"input_ids": ids, "attention_mask": np.ones((1, 3), np.int64)}),
    )
    missing = request("missing", inputs=serde.to_tensors({"input_ids": ids.astype(np.int64)}))
    good = request("good", token_ids=[9, 8, 7], post_process=inference_pb2.ARGMAX_LAST)
    await publish(rig, serde.encode(bad_dtype), b"\xff not a request", serde.encode(missing))
    await publish(rig, serde.encode(good))

    await serve_until_committed(rig, 4)

    results = results_by_id(rig)
    assert results["bad-dtype"].status == inference_pb2.ERROR
    assert results["bad-dtype"].error_code == inference_pb2.BAD_DTYPE
    assert results["missing"].error_code == inference_pb2.MISSING_INPUT
    assert results["good"].status == inference_pb2.OK
    (letter,) = [serde.decode(dlq_pb2.DeadLetter, v) for v in rig.read(rig.factory.layout.dlq())]
    assert letter.error_code == inference_pb2.DECODE_ERROR
    assert letter.original_value == b"\xff not a request"
    assert letter.source_offset == 1


async def test_offsets_are_committed_only_after_delivery(rig: Rig) -> None:
    first = request("first", token_ids=[1, 2], post_process=inference_pb2.ARGMAX_LAST)
    await publish(rig, serde.encode(first))
    await serve_until_committed(rig, 1)
    assert rig.committed() == 1

    second = request("second", token_ids=[3, 4], post_process=inference_pb2.ARGMAX_LAST)
    await publish(rig, serde.encode(second))
    rig.broker.fail_next_sends(NotLeaderForPartitionError())  # the result's send fails
    async with asyncio.timeout(30):
        while await rig.serve.once() == 0:
            pass
    assert rig.committed() == 1  # not delivered, so not committed: it will be read again
    assert "second" not in results_by_id(rig)

    await serve_until_committed(rig, 2)
    assert results_by_id(rig)["second"].status == inference_pb2.OK


async def test_requests_that_cannot_meet_their_deadline_are_shed_at_once(rig: Rig) -> None:
    # The worker has measured 600 ms per row (padded to 16); it now plans batches of 2
    # (the learner is still measuring size 2), so each batch is predicted at 1.2 s.
    for _ in range(3):
        rig.worker.backend.learner.observe(1, 600.0, 16)
    deadline = now_ms() + 2000
    reqs = [
        request(
            f"r{i}", token_ids=[5, 6, 7], deadline_unix_ms=deadline, created_at_unix_ms=now_ms()
        )
        for i in range(4)
    ]
    await publish(rig, *(serde.encode(r) for r in reqs))

    await serve_until_committed(rig, 4)

    results = results_by_id(rig)
    assert [results[f"r{i}"].status for i in range(2)] == [inference_pb2.OK] * 2
    for i in (2, 3):  # behind a batch predicted to end at +1.2 s, theirs would end at +2.4 s
        assert results[f"r{i}"].error_code == inference_pb2.SHED
        assert "deadline cannot be met" in results[f"r{i}"].error_message
    telemetry = [
        serde.decode(telemetry_pb2.BatchTelemetry, v)
        for v in rig.read(rig.factory.layout.telemetry())
    ]
    assert sum(t.shed_count for t in telemetry) == 2
    assert sum(t.error_count for t in telemetry) == 0  # not an engine error: no gate counts it
    shed = rig.worker.metrics.shed.labels(MODEL, VERSION, "fp32", "deadline")
    assert shed._value.get() == 2


async def test_a_cycle_of_sheds_alone_is_reported_and_a_pause_probes(rig: Rig) -> None:
    for _ in range(3):
        rig.worker.backend.learner.observe(1, 600.0, 16)  # a stale, pessimistic estimate
    rig.worker.backend.last_run_ms = now_ms()  # a batch ran just now: no probe this cycle
    soon = now_ms() + 300
    reqs = [
        request(f"s{i}", token_ids=[5, 6, 7], deadline_unix_ms=soon, created_at_unix_ms=now_ms())
        for i in range(2)
    ]
    await publish(rig, *(serde.encode(r) for r in reqs))
    await serve_until_committed(rig, 2)
    results = results_by_id(rig)
    assert {results[f"s{i}"].error_code for i in range(2)} == {inference_pb2.SHED}
    telemetry = [
        serde.decode(telemetry_pb2.BatchTelemetry, v)
        for v in rig.read(rig.factory.layout.telemetry())
    ]
    # nothing ran, yet the policy engine hears of the load
    assert [(t.request_count, t.shed_count, t.variant) for t in telemetry] == [(0, 2, "fp32")]

    rig.worker.backend.last_run_ms = now_ms() - 5_000  # nothing ran for a while: probe
    late = request("p", token_ids=[5, 6, 7], deadline_unix_ms=now_ms() + 300)
    await publish(rig, serde.encode(late))
    await serve_until_committed(rig, 3)
    assert results_by_id(rig)["p"].status == inference_pb2.OK
