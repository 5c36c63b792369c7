"""The 8-bit rung's float layers: grouped by decoder layer, ranked by measured divergence."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graylane.builder.layer_sensitivity import (
    LayerSensitivity,
    decoder_layers,
    mean_kl,
    measure_layers,
    most_sensitive,
)


def test_nodes_are_grouped_by_their_first_numbered_part() -> None:
    nodes = [
        "layers.0.self_attn.q_proj",
        "layers.0.mlp.down_proj",
        "layers.1.self_attn.q_proj",
        "/model/layers.12/mlp/up_proj/MatMul",
        "h3.attn.qkv",
        "lm_head",
    ]
    assert decoder_layers(nodes) == {
        "layers.0": ("layers.0.self_attn.q_proj", "layers.0.mlp.down_proj"),
        "layers.1": ("layers.1.self_attn.q_proj",),
        "layers.12": ("/model/layers.12/mlp/up_proj/MatMul",),
        "h3": ("h3.attn.qkv",),
    }


def test_kl_is_zero_for_the_same_logits_and_grows_with_the_shift() -> None:
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(5, 11))
    assert mean_kl(reference, reference) == 0.0
    assert mean_kl(reference, reference + 3.0) < 1e-12  # a constant shift is the same softmax
    small = reference.copy()
    small[:, 0] += 0.1
    large = reference.copy()
    large[:, 0] += 1.0
    assert 0.0 < mean_kl(reference, small) < mean_kl(reference, large)
    two = np.log(np.array([[0.5, 0.5]]))
    skewed = np.log(np.array([[0.9, 0.1]]))
    expected = 0.5 * np.log(0.5 / 0.9) + 0.5 * np.log(0.5 / 0.1)
    assert abs(mean_kl(two, skewed) - expected) < 1e-12


def _measured(*kls: float) -> list[LayerSensitivity]:
    return [
        LayerSensitivity(
            layer=f"layers.{i}", nodes=(f"layers.{i}.mlp",), mean_kl=kl, top1_changes=0
        )
        for i, kl in enumerate(kls)
    ]


def test_the_largest_divergences_are_kept_largest_first() -> None:
    measured = _measured(2e-4, 3e-5, 9e-5, 1.6e-4, 3e-5)
    assert most_sensitive(measured, 2) == ("layers.0", "layers.3")
    assert most_sensitive(measured, 3) == ("layers.0", "layers.3", "layers.2")
    assert most_sensitive(measured, 5)[-2:] == ("layers.1", "layers.4")  # ties: graph order
    assert most_sensitive(measured, 0) == ()
    assert most_sensitive(measured, 9) == most_sensitive(measured, 5)


_WIDTH = 4


def _two_layers(scale: Sequence[float]) -> onnx.ModelProto:
    """input_ids -> one-hot -> layers.0 -> layers.1 -> logits, layer ``i`` ``scale[i]`` times
    the identity."""
    eye = numpy_helper.from_array(np.eye(_WIDTH, dtype=np.float32), "embed")
    weights = [
        numpy_helper.from_array((np.eye(_WIDTH) * s).astype(np.float32), f"w{i}")
        for i, s in enumerate(scale)
    ]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h0"], name="embed"),
        helper.make_node("MatMul", ["h0", "w0"], ["h1"], name="layers.0.proj"),
        helper.make_node("MatMul", ["h1", "w1"], ["logits"], name="layers.1.proj"),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", _WIDTH])],
        [eye, *weights],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _round_all_but(model: onnx.ModelProto, exclude: Sequence[str], path: Path) -> None:
    """A stand-in quantizer: the weights of every node not excluded rounded to integers."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    inits = {i.name: i for i in copy.graph.initializer}
    for node in copy.graph.node:
        if node.op_type == "MatMul" and node.name not in exclude:
            w = numpy_helper.to_array(inits[node.input[1]])
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(np.round(w), node.input[1]))
    onnx.save_model(copy, str(path))


def test_measuring_keeps_the_layer_whose_quantization_moves_the_logits_most() -> None:
    model = _two_layers([2.3, 1.4])  # rounding: layers.0 loses 13 %, layers.1 29 %
    nodes = ["layers.0.proj", "layers.1.proj"]
    choice = measure_layers(model, nodes, [[0, 1, 2, 3], [3, 2]], _round_all_but, count=1)
    assert choice.layers == ("layers.1",)
    assert choice.nodes == ("layers.1.proj",)
    assert choice.positions == 6 and choice.calibration_prompts == 2
    by_layer = {m.layer: m for m in choice.measured}
    assert by_layer["layers.1"].mean_kl > by_layer["layers.0"].mean_kl > 0.0
    assert "layers.1" in choice.describe()
