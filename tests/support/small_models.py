"""Small third-party-like ONNX models the tests make themselves: a token tagger and
pre-quantized forms of it (static QDQ and dynamic, made with onnxruntime.quantization),
a scorer, and one projection for the weight-only quantizers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TAGGER_VOCAB = 54
TAGGER_CLASSES = 15
_HIDDEN = 16


def tagger_model(seed: int = 0, *, metadata: dict[str, str] | None = None) -> onnx.ModelProto:
    """A token tagger: int64 ``input_ids`` [batch, seq] (54 symbols) → ``logits`` [batch, seq, 15].

    Its output is called ``logits`` on purpose: 15 classes, not a vocabulary.
    """
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((TAGGER_VOCAB, _HIDDEN)).astype(np.float32)
    w1 = (rng.standard_normal((_HIDDEN, _HIDDEN)) / 4).astype(np.float32)
    w2 = (rng.standard_normal((_HIDDEN, TAGGER_CLASSES)) / 4).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h0"]),
        helper.make_node("MatMul", ["h0", "w1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tagger",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [
            helper.make_tensor_value_info(
                "logits", TensorProto.FLOAT, ["batch", "seq", TAGGER_CLASSES]
            )
        ],
        [numpy_helper.from_array(a, n) for a, n in ((embed, "embed"), (w1, "w1"), (w2, "w2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    return model


def write_tagger(path: Path, seed: int = 0, *, metadata: dict[str, str] | None = None) -> Path:
    onnx.save_model(tagger_model(seed, metadata=metadata), str(path))
    return path


def write_prequantized(path: Path, *, dynamic: bool = False, seed: int = 0) -> Path:
    """The tagger, quantized by onnxruntime.quantization (static QDQ, or dynamic)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    source = path.with_name(path.stem + "-float.onnx")
    write_tagger(source, seed)
    if dynamic:
        quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8)
        return path

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            gen = np.random.default_rng(seed)
            self._rows = iter(
                [{"input_ids": gen.integers(0, TAGGER_VOCAB, (1, 8))} for _ in range(16)]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._rows, None)

    quantize_static(
        str(source),
        str(path),
        Reader(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    return path


SCORER_FEATURES = 6
SCORER_CLASSES = 3


def scorer_model(seed: int = 0) -> onnx.ModelProto:
    """A small classifier that is no language model: float ``features`` [batch, 6] and
    an int64 ``offset`` [batch, 1] in; float ``scores`` [batch, 3] and int64 ``label``
    [batch] (the argmax, plus the offset) out."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((SCORER_FEATURES, 8)) / 2).astype(np.float32)
    w2 = (rng.standard_normal((8, SCORER_CLASSES)) / 2).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["features", "w1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["best"], axis=1, keepdims=0),
        helper.make_node("Squeeze", ["offset", "axes"], ["flat_offset"]),
        helper.make_node("Add", ["best", "flat_offset"], ["label"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scorer",
        [
            helper.make_tensor_value_info(
                "features", TensorProto.FLOAT, ["batch", SCORER_FEATURES]
            ),
            helper.make_tensor_value_info("offset", TensorProto.INT64, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", SCORER_CLASSES]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
        ],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_scorer(path: Path, seed: int = 0) -> Path:
    onnx.save_model(scorer_model(seed), str(path))
    return path


def projection_model(weight: np.ndarray) -> onnx.ModelProto:
    """One ``MatMul`` of ``x`` [batch, seq, K] by the constant ``weight`` [K, N], as a
    decoder's projections are: what weight-only quantization rewrites."""
    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
        "proj",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, n])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
