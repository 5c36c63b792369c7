"""The Open Inference Protocol v2 mapping: JSON and binary tensors in, outputs back (pure)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from graylane.engine.signature import IOSignature, TensorSpec
from graylane.services.gateway import oip
from graylane.services.gateway.failures import ApiError

MAX = 1 << 20


def _parse(header: dict[str, Any], binary: bytes = b"") -> oip.TensorCall:
    return oip.parse_infer(header, binary, max_elements=MAX)


def test_json_tensors_of_every_datatype_become_numpy() -> None:
    call = _parse(
        {
            "id": "req-1",
            "inputs": [
                {"name": "f", "datatype": "FP32", "shape": [2, 2], "data": [[1.5, 2], [3, 4]]},
                {"name": "i", "datatype": "INT64", "shape": [3], "data": [1, -2, 3]},
                {"name": "b", "datatype": "BOOL", "shape": [2], "data": [True, False]},
                {"name": "u", "datatype": "UINT8", "shape": [1, 2], "data": [0, 255]},
                {"name": "h", "datatype": "FP16", "shape": [1], "data": [0.5]},
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
            "parameters": {"timeout": 2_500_000},
        }
    )
    assert call.id == "req-1" and call.timeout_s == 2.5
    assert call.inputs["f"].dtype == np.float32 and call.inputs["f"].tolist() == [[1.5, 2], [3, 4]]
    assert call.inputs["i"].dtype == np.int64 and call.inputs["i"].tolist() == [1, -2, 3]
    assert call.inputs["b"].dtype == np.bool_ and call.inputs["u"].dtype == np.uint8
    assert call.inputs["h"].dtype == np.float16
    assert call.outputs == (oip.RequestedOutput("y", True), oip.RequestedOutput("z", False))


def test_binary_tensors_follow_the_json_header() -> None:
    features = np.arange(6, dtype=np.float32).reshape(2, 3)
    ids = np.array([[7], [9]], dtype=np.int64)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "datatype": "FP32",
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": features.nbytes},
                },
                {"name": "ids", "datatype": "INT64", "shape": [2, 1], "data": [7, 9]},
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    body = header + features.tobytes()
    decoded, binary = oip.split_body(body, str(len(header)), max_depth=32, max_containers=1000)
    call = oip.parse_infer(decoded, binary, max_elements=MAX)
    np.testing.assert_array_equal(call.inputs["features"], features)
    np.testing.assert_array_equal(call.inputs["ids"], ids)
    assert call.binary_outputs and call.outputs == ()


@pytest.mark.parametrize(
    ("inputs", "binary", "why"),
    [
        ([], b"", "non-empty"),
        ([{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["a"]}], b"", "BYTES"),
        ([{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}], b"", "unknown datatype"),
        ([{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2]}], b"", "do not fill"),
        ([{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}], b"", "range"),
        ([{"name": "x", "datatype": "INT32", "shape": [1], "data": [1.5]}], b"", "integers"),
        ([{"name": "x", "datatype": "BOOL", "shape": [1], "data": [1]}], b"", "true/false"),
        ([{"name": "x", "datatype": "FP32", "shape": [-1], "data": []}], b"", "negative"),
        ([{"name": "x", "datatype": "FP32", "shape": [1]}], b"", "neither"),
        (
            [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2],
                    "parameters": {"binary_data_size": 4},
                }
            ],
            b"\0" * 4,
            "does not fit",
        ),
        (
            [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ],
            b"\0" * 2,
            "ends early",
        ),
        ([{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], b"\0", "belong to no"),
        (
            [
                {"name": "x", "datatype": "FP32", "shape": [1], "data": [1]},
                {"name": "x", "datatype": "FP32", "shape": [1], "data": [1]},
            ],
            b"",
            "twice",
        ),
    ],
)
def test_bad_inputs_are_refused_with_a_reason(
    inputs: list[dict[str, Any]], binary: bytes, why: str
) -> None:
    with pytest.raises(ApiError, match=why) as refused:
        _parse({"inputs": inputs}, binary)
    assert refused.value.status == 400


def test_a_header_length_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ApiError, match="does not fit"):
        oip.split_body(b"{}", "10", max_depth=32, max_containers=1000)
    with pytest.raises(ApiError, match="could not parse the JSON body"):
        oip.split_body(b"{nope", None, max_depth=32, max_containers=1000)


def test_outputs_come_back_as_json_or_binary_as_asked() -> None:
    outputs = {
        "scores": np.array([[0.25, -1.0]], dtype=np.float32),
        "label": np.array([3], dtype=np.int64),
    }
    call = oip.TensorCall(
        id="r",
        inputs={},
        outputs=(oip.RequestedOutput("label", False), oip.RequestedOutput("scores", True)),
    )
    body, length = oip.infer_response(model="m", version="1.0.0", call=call, outputs=outputs)
    assert length is not None
    header = json.loads(body[:length])
    assert header == {
        "model_name": "m",
        "model_version": "1.0.0",
        "id": "r",
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [1], "data": [3]},
            {
                "name": "scores",
                "datatype": "FP32",
                "shape": [1, 2],
                "parameters": {"binary_data_size": 8},
            },
        ],
    }
    np.testing.assert_array_equal(np.frombuffer(body[length:], dtype="<f4"), [0.25, -1.0])
    every = oip.TensorCall(id="", inputs={})
    body, length = oip.infer_response(model="m", version="1", call=every, outputs=outputs)
    assert length is None and [o["name"] for o in json.loads(body)["outputs"]] == [
        "scores",
        "label",
    ]
    with pytest.raises(ApiError, match="not an output"):
        oip.infer_response(
            model="m",
            version="1",
            call=oip.TensorCall(id="", inputs={}, outputs=(oip.RequestedOutput("x", False),)),
            outputs=outputs,
        )


def test_model_metadata_writes_dynamic_dimensions_as_minus_one() -> None:
    signature = IOSignature(
        inputs=(TensorSpec("x", np.dtype("float32"), ("batch", 4)),),
        outputs=(TensorSpec("y", np.dtype("int64"), (None,)),),
    )
    assert oip.model_metadata("m", ["1", "2"], signature) == {
        "name": "m",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "INT64", "shape": [-1]}],
    }
    assert oip.model_metadata("m", [], None)["inputs"] == []
