"""Triton's own client (``tritonclient.http``) against the gateway on the real broker.

A non-LLM ONNX model (float features and an int64 offset in; float scores and an int64
label out) is served by a real worker; the gateway answers the Open Inference Protocol
v2. tritonclient is synchronous (gevent), so each call runs in a thread while the
gateway serves in the test's event loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.kafka.seam import KafkaFactory
from graylane.services.gateway.logic.admission import KeyRing, parse_api_keys
from tests.support.gateway import running_gateway
from tests.support.small_models import SCORER_FEATURES, write_scorer
from tests.support.stack import running_stack

pytestmark = [pytest.mark.kafka]

MODEL = "scorer"
VERSION = "1.0.0"
KEY = "team-c-0123456789abcdef"


def _auth() -> dict[str, str]:
    """A fresh headers dict per call: tritonclient writes its own headers into the one given."""
    return {"Authorization": f"Bearer {KEY}"}


def _inputs(features: np.ndarray, offset: np.ndarray, *, binary: bool) -> list[Any]:
    first = triton.InferInput("features", list(features.shape), "FP32")
    first.set_data_from_numpy(features, binary_data=binary)
    second = triton.InferInput("offset", list(offset.shape), "INT64")
    second.set_data_from_numpy(offset, binary_data=binary)
    return [first, second]


def _outputs(*, binary: bool) -> list[Any]:
    return [
        triton.InferRequestedOutput("scores", binary_data=binary),
        triton.InferRequestedOutput("label", binary_data=binary),
    ]


def _calls(url: str, features: np.ndarray, offset: np.ndarray) -> dict[str, Any]:
    """Every call of the test, in one thread (a gevent client stays in its thread)."""
    client = triton.InferenceServerClient(url=url)
    got: dict[str, Any] = {}
    try:
        got["live"] = client.is_server_live()
        got["ready"] = client.is_server_ready()
        got["metadata"] = client.get_model_metadata(MODEL, headers=_auth())
        got["model_ready"] = client.is_model_ready(MODEL, headers=_auth())
        got["version_ready"] = client.is_model_ready(MODEL, VERSION, headers=_auth())
        got["unknown_ready"] = client.is_model_ready("no-such-model", headers=_auth())
        got["json"] = client.infer(
            MODEL,
            _inputs(features, offset, binary=False),
            outputs=_outputs(binary=False),
            headers=_auth(),
        )
        got["binary"] = client.infer(
            MODEL,
            _inputs(features, offset, binary=True),
            outputs=_outputs(binary=True),
            headers=_auth(),
        )
        got["pinned"] = client.infer(
            MODEL, _inputs(features, offset, binary=True), model_version=VERSION, headers=_auth()
        )
        for name, call in (
            ("no_key", lambda: client.get_model_metadata(MODEL)),
            (
                "unserved",
                lambda: client.infer(
                    MODEL,
                    _inputs(features, offset, binary=False),
                    model_version="9.9.9",
                    headers=_auth(),
                ),
            ),
        ):
            try:
                call()
                got[name] = None
            except InferenceServerException as exc:
                got[name] = exc
    finally:
        client.close()
    return got


async def test_tritonclient_reads_metadata_and_readiness_and_infers_like_onnx_runtime(
    factory: KafkaFactory, tmp_path: Path
) -> None:
    model_path = write_scorer(tmp_path / "scorer.onnx", seed=5)
    rng = np.random.default_rng(9)
    features = rng.standard_normal((3, SCORER_FEATURES)).astype(np.float32)
    offset = np.array([[0], [10], [20]], dtype=np.int64)
    reference = OnnxRuntimeEngine.load(model_path, "fp32", intra_op_threads=1)
    expected = reference.run({"features": features, "offset": offset})

    async with (
        running_stack(
            factory,
            model=MODEL,
            versions={VERSION: model_path},
            stable=VERSION,
            max_seq_len=64,
        ),
        running_gateway(
            factory,
            keys=KeyRing(parse_api_keys(f"{KEY}:infer:team-c")),
            signatures={(MODEL, ""): model_path},
        ) as gateway,
    ):
        url = f"127.0.0.1:{gateway.port}"
        got = await asyncio.to_thread(_calls, url, features, offset)

    assert got["live"] and got["ready"]
    metadata = got["metadata"]
    assert metadata["name"] == MODEL and metadata["versions"] == [VERSION]
    assert metadata["inputs"] == [
        {"name": "features", "datatype": "FP32", "shape": [-1, SCORER_FEATURES]},
        {"name": "offset", "datatype": "INT64", "shape": [-1, 1]},
    ]
    assert metadata["outputs"] == [
        {"name": "scores", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "label", "datatype": "INT64", "shape": [-1]},
    ]
    assert got["model_ready"] and got["version_ready"]
    assert not got["unknown_ready"]
    for kind in ("json", "binary", "pinned"):
        result = got[kind]
        np.testing.assert_allclose(result.as_numpy("scores"), expected["scores"], rtol=1e-6)
        np.testing.assert_array_equal(result.as_numpy("label"), expected["label"])
        assert result.get_response()["model_version"] == VERSION
    no_key, unserved = got["no_key"], got["unserved"]
    assert isinstance(no_key, InferenceServerException) and no_key.status() == "401"
    assert isinstance(unserved, InferenceServerException) and unserved.status() == "404"
    assert "9.9.9" in unserved.message()
