"""A broken engine does not answer ENGINE_FAILURE for ever (issue 10, item 7), on the
real broker with the real ``graylane worker`` process.

The worker serves an ONNX model that loads and validates requests but fails in the
runtime on every batch (a Reshape to an impossible shape: ONNX Runtime raises, so
the adapter raises ``EngineRunError``). After ``--engine-failure-limit`` failed
batches it reloads the model from its file through its loading code, and when the
reloaded engine fails as often again the process exits non-zero with the reason,
after answering and committing what it had fetched.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graylane import serde
from graylane.kafka.admin import ensure_topics
from graylane.kafka.seam import KafkaFactory
from graylane.v1 import inference_pb2
from tests.support.stack import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MODEL, VERSION = "broken", "v1"
LIMIT = 2


def write_failing_model(path: Path) -> Path:
    """x float32 [batch, 4] -> Reshape to [3]: loads fine, fails at run time for any batch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [3])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph([node], "broken", [x], [y], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


async def test_a_worker_whose_engine_keeps_failing_reloads_it_once_then_exits_non_zero(
    factory: KafkaFactory, tmp_path: Path
) -> None:
    settings = factory.settings
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(MODEL, [VERSION]))
    path = write_failing_model(tmp_path / "broken.onnx")
    producer = factory.producer()
    await producer.start()
    try:
        for i in range(2 * LIMIT):
            x = np.full((1, 4), float(i), dtype=np.float32)
            request = inference_pb2.InferenceRequest(
                request_id=f"r{i}", model=MODEL, inputs=serde.to_tensors({"x": x})
            )
            topic = layout.version_requests(MODEL, VERSION)
            await producer.send_and_wait(topic, serde.encode(request), key=b"k", partition=0)
    finally:
        await producer.stop()
    env = {
        **os.environ,
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "PYTHONUNBUFFERED": "1",
    }
    # these args: one request per batch, so 2 * LIMIT requests are 2 * LIMIT failed batches
    args = ["--model", MODEL, "--version", VERSION, "--variant", f"fp32={path}"]
    args += ["--max-batch", "1", "--engine-failure-limit", str(LIMIT)]
    args += ["--metrics-port", "-1", "--log-format", "text"]
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "graylane.app.cli.main", "worker", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            rc = await asyncio.to_thread(worker.wait, 120)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    text = log_path.read_text(errors="replace")
    assert rc != 0, text[-3000:]
    assert f"engine failed {LIMIT} consecutive batches" in text and "reloading it" in text
    assert "engine reloaded: ['fp32']" in text
    assert f"WorkerGaveUp: engine failed {LIMIT} consecutive batches after a reload" in text
    # every request it fetched got its ENGINE_FAILURE answer before it exited
    values = await read_topic(factory, layout.results(MODEL), expect=2 * LIMIT)
    results = [serde.decode(inference_pb2.InferenceResult, v) for v in values]
    assert {r.request_id for r in results} == {f"r{i}" for i in range(2 * LIMIT)}
    assert {r.error_code for r in results} == {inference_pb2.ENGINE_FAILURE}
