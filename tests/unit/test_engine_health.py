"""A broken engine does not answer ENGINE_FAILURE for ever (issue 10, item 7): the pure
counter (engine_worker/compute.py) and the worker acting on it on the in-memory
Kafka double: N consecutive engine failures reload the engine once, N more end ``run()``
with WorkerGaveUp; input errors and sheds never count."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from graylane import serde
from graylane.artifacts.model_info import ModelInfo
from graylane.engine.errors import EngineRunError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.compute import EngineHealth, EngineVerdict, WorkerGaveUp
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.loading import onnx_model_info
from graylane.engine_worker.service import Worker
from graylane.models.demo_gpt import write_demo_gpt
from graylane.settings import Settings
from graylane.v1 import inference_pb2
from tests.support.engines import DelegatingEngine
from tests.support.memory_kafka import MemoryBroker, MemoryFactory

C, R, X = EngineVerdict.CONTINUE, EngineVerdict.RELOAD, EngineVerdict.EXIT


def test_limit_failures_reload_once_then_limit_more_exit() -> None:
    health = EngineHealth(limit=3)
    assert [health.failed("e") for _ in range(6)] == [C, C, R, C, C, X]
    assert "3 consecutive batches after a reload; last error: e" in str(health.give_up())


def test_a_served_batch_resets_the_count_and_rearms_the_reload() -> None:
    health = EngineHealth(limit=2)
    assert [health.failed("e"), health.failed("e")] == [C, R]
    health.served()
    assert [health.failed("e"), health.failed("e")] == [C, R]  # a reload again, not an exit
    health.failed("e")
    health.served()
    assert health.consecutive == 0
    assert health.failed("e") is C


def test_limit_zero_never_reloads_and_a_negative_limit_is_refused() -> None:
    health = EngineHealth(limit=0)
    assert {health.failed("e") for _ in range(100)} == {C}
    with pytest.raises(ValueError):
        EngineHealth(limit=-1)


# --- the worker ----------------------------------------------------------------------------

MODEL, VERSION = "gpt", "v1"


class BrokenEngine(DelegatingEngine):
    """A real engine whose runtime fails (a device gone bad): it raises, it fakes nothing."""

    def __init__(self, inner: InferenceEngine, broken: bool) -> None:
        super().__init__(inner)
        self.broken = broken
        self.runs = 0
        self.closed = False

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runs += 1
        if self.broken:
            raise EngineRunError("CUDA error: an illegal memory access was encountered")
        return self.inner.run(feeds)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("m") / "tiny.onnx", "tiny", seed=5)


@pytest.fixture(scope="module")
def engine(model_path: Path) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine.load(model_path, "fp32", name=MODEL, intra_op_threads=1)


@pytest.fixture(scope="module")
def info(model_path: Path) -> ModelInfo:
    return onnx_model_info(model_path)


def _request(i: int, ids: list[int]) -> bytes:
    arr = np.array([ids], dtype=np.int64)
    feeds = {"input_ids": arr, "attention_mask": np.ones_like(arr)}
    return serde.encode(
        inference_pb2.InferenceRequest(
            request_id=f"r{i}", model=MODEL, inputs=serde.to_tensors(feeds)
        )
    )


class Stack:
    def __init__(
        self, engine: OnnxRuntimeEngine, info: ModelInfo, *, broken_after_reload: bool
    ) -> None:
        self.broker = MemoryBroker()
        self.factory = MemoryFactory(self.broker, Settings(topic_prefix="t", partitions=1))
        self.loaded: list[BrokenEngine] = [BrokenEngine(engine, broken=False)]
        self.real = engine
        self.broken_after_reload = broken_after_reload
        config = WorkerConfig(
            model=MODEL,
            version=VERSION,
            initial_variant="fp32",
            max_seq_len=16,
            buckets=(16,),
            max_batch_size=1,
            fetch_factor=1,
            adaptive_batching=False,
            metrics_port=-1,
            worker_id="w",
            engine_failure_limit=3,
            # the task and vocabulary the model declares (ids beyond it are input errors)
            model_info=info,
        )
        self.worker = Worker(self.factory, config, {"fp32": self.loaded[0]}, reload=self.reload)

    async def start(self, stop: asyncio.Event) -> asyncio.Task[None]:
        """Run the worker; its engine breaks once it has warmed up and serves."""
        task = asyncio.create_task(self.worker.run(stop))
        ready = asyncio.create_task(self.worker.ready.wait())
        await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        self.loaded[0].broken = True
        return task

    def reload(self) -> dict[str, InferenceEngine]:
        fresh = BrokenEngine(self.real, broken=self.broken_after_reload)
        self.loaded.append(fresh)
        return {"fp32": fresh}

    def send(self, *values: bytes) -> None:
        topic = self.factory.layout.version_requests(MODEL, VERSION)
        for value in values:
            self.broker.append(topic, value, key=b"k", partition=0)

    def results(self) -> list[inference_pb2.InferenceResult]:
        return [
            serde.decode(inference_pb2.InferenceResult, r.value)
            for r in self.broker.records(self.factory.layout.results(MODEL))
            if r.value is not None
        ]


async def _until(condition, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_broken_engine_is_reloaded_then_the_worker_gives_up(
    engine: OnnxRuntimeEngine,
    info: ModelInfo,
) -> None:
    stack = Stack(engine, info, broken_after_reload=True)
    stop = asyncio.Event()
    task = await stack.start(stop)
    # input errors (a token id outside the vocabulary) never count as engine failures
    stack.send(*[_request(100 + i, [10**6]) for i in range(5)])
    await _until(lambda: len(stack.results()) == 5)
    assert {r.error_code for r in stack.results()} == {inference_pb2.BAD_REQUEST}
    assert len(stack.loaded) == 1
    stack.send(*[_request(i, [1, 2, 3]) for i in range(3)])
    await _until(lambda: len(stack.loaded) == 2)  # reloaded after 3 failed batches
    assert stack.loaded[0].closed and not task.done()
    stack.send(*[_request(10 + i, [1, 2, 3]) for i in range(3)])
    with pytest.raises(WorkerGaveUp, match="after a reload; last error: EngineRunError"):
        await asyncio.wait_for(task, 20)
    assert not stop.is_set()
    codes = [r.error_code for r in stack.results()[5:]]
    assert codes == [inference_pb2.ENGINE_FAILURE] * 6  # every request answered before exit
    assert len(stack.loaded) == 2  # one reload only


async def test_a_reload_that_heals_the_engine_keeps_the_worker_serving(
    engine: OnnxRuntimeEngine,
    info: ModelInfo,
) -> None:
    stack = Stack(engine, info, broken_after_reload=False)
    stop = asyncio.Event()
    task = await stack.start(stop)
    stack.send(*[_request(i, [1, 2, 3]) for i in range(3)])
    await _until(lambda: len(stack.loaded) == 2)
    stack.send(*[_request(10 + i, [1, 2, 3]) for i in range(6)])
    await _until(lambda: len(stack.results()) == 9)
    assert [r.status for r in stack.results()[3:]] == [inference_pb2.OK] * 6
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 10)
