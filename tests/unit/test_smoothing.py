"""Activation smoothing folds exactly: the smoothed float graph computes what the source does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graylane.builder.smoothing import (
    FoldKind,
    apply_smoothing,
    smoothing_groups,
    smoothing_scales,
)

_WIDTH, _HIDDEN = 8, 12


def _block(rng: np.random.Generator) -> onnx.ModelProto:
    """A norm scale feeding two projections, and a SwiGLU feeding a third."""

    def const(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Mul", ["x", "norm.weight"], ["normed"], name="norm"),
        helper.make_node("MatMul", ["normed", "q.weight"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["normed", "gate.weight"], ["gate"], name="gate_proj"),
        helper.make_node("MatMul", ["normed", "up.weight"], ["up"], name="up_proj"),
        helper.make_node("Sigmoid", ["gate"], ["sig"], name="sigmoid"),
        helper.make_node("Mul", ["gate", "sig"], ["act"], name="silu"),
        helper.make_node("Mul", ["act", "up"], ["hidden"], name="swiglu"),
        helper.make_node("MatMul", ["hidden", "down.weight"], ["down"], name="down_proj"),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, _WIDTH])],
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, [None, _WIDTH]),
            helper.make_tensor_value_info("down", TensorProto.FLOAT, [None, _WIDTH]),
        ],
        [
            const("norm.weight", _WIDTH),
            const("q.weight", _WIDTH, _WIDTH),
            const("gate.weight", _WIDTH, _HIDDEN),
            const("up.weight", _WIDTH, _HIDDEN),
            const("down.weight", _HIDDEN, _WIDTH),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, {"x": x})]


def test_groups_are_the_normed_input_and_the_swiglu_product() -> None:
    groups = {g.activation: g for g in smoothing_groups(_block(np.random.default_rng(0)))}
    assert set(groups) == {"normed", "hidden"}
    assert groups["normed"].matmuls == ("q_proj", "gate_proj", "up_proj")
    assert groups["normed"].fold is FoldKind.NORM_SCALE
    assert groups["normed"].fold_initializer == "norm.weight"
    assert groups["hidden"].fold is FoldKind.PRODUCER_COLUMNS
    assert groups["hidden"].fold_initializer == "up.weight"
    only_norms = smoothing_groups(_block(np.random.default_rng(0)), folds=(FoldKind.NORM_SCALE,))
    assert [g.activation for g in only_norms] == ["normed"]
    # A group one of whose MatMuls stays in float is left alone.
    kept = smoothing_groups(_block(np.random.default_rng(0)), exclude=("gate_proj",))
    assert [g.activation for g in kept] == ["hidden"]


def test_smoothing_moves_the_range_into_the_weights_and_keeps_the_outputs() -> None:
    rng = np.random.default_rng(1)
    model = _block(rng)
    source = onnx.ModelProto()
    source.CopyFrom(model)
    x = rng.normal(size=(5, _WIDTH)).astype(np.float32)
    x[:, 3] *= 40.0  # one outlier channel, as a decoder's hidden state has
    groups = smoothing_groups(model)
    maxima = {"normed": np.abs(x * numpy_helper.to_array(source.graph.initializer[0])).max(0)}
    maxima["hidden"] = np.full(_HIDDEN, 2.0, dtype=np.float32)
    folded = apply_smoothing(model, groups, maxima, alpha=0.5)
    assert folded == {FoldKind.NORM_SCALE: 1, FoldKind.PRODUCER_COLUMNS: 1}
    for before, after in zip(_run(source, x), _run(model, x), strict=True):
        np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    old = {i.name: numpy_helper.to_array(i) for i in source.graph.initializer}
    # The outlier channel's activation shrank; its weight row grew by the same factor.
    smoothed = x * weights["norm.weight"]
    original = x * old["norm.weight"]
    ratio = np.abs(original[:, 3]).max() / np.abs(smoothed[:, 3]).max()
    assert ratio > 1.0
    np.testing.assert_allclose(weights["q.weight"][3] / old["q.weight"][3], ratio, rtol=1e-4)


def test_scales_follow_the_smoothquant_rule() -> None:
    scales = smoothing_scales(np.array([16.0, 1.0]), np.array([1.0, 4.0]), alpha=0.5)
    np.testing.assert_allclose(scales, [4.0, 0.5], rtol=1e-6)
    # Dead channels do not blow up: scales stay finite.
    assert np.all(np.isfinite(smoothing_scales(np.zeros(3), np.zeros(3), alpha=0.75)))
