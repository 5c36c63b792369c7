"""GPTQ rounds the 8-bit rung's weights closer on calibration activations than round to
nearest, and its codes are what ONNX Runtime's ``MatMulNBits`` computes with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graylane.builder.gptq import (
    GptqRounding,
    Int8Blocks,
    gptq_blocks,
    input_hessians,
    rtn_blocks,
    write_int8_blocks,
)
from tests.support.small_models import projection_model

_IN, _OUT, _BLOCK = 128, 24, 32


def _quantized(weight: np.ndarray, level: int) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        projection_model(weight), bits=8, block_size=_BLOCK, is_symmetric=True, accuracy_level=level
    )
    quantizer.process()
    model: onnx.ModelProto = quantizer.model.model
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def _correlated(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Activations whose channels move together, with a few large ones (as a decoder's)."""
    mixing = rng.normal(size=(_IN, _IN)) * 0.3
    x = rng.normal(size=(rows, _IN)) @ mixing + rng.normal(size=(rows, _IN))
    x[:, :4] *= 8.0
    return np.asarray(x, dtype=np.float64)


def test_round_to_nearest_is_onnx_runtimes_own_rounding() -> None:
    weight = np.random.default_rng(0).normal(size=(_IN, _OUT)).astype(np.float32)
    inits = {i.name: numpy_helper.to_array(i) for i in _quantized(weight, 4).graph.initializer}
    rtn = rtn_blocks(weight, _BLOCK)
    np.testing.assert_array_equal(inits["w_Q8"], rtn.codes)
    np.testing.assert_array_equal(inits["w_scales"].reshape(rtn.scales.shape), rtn.scales)
    # With no correlation between channels there is nothing to compensate: GPTQ is RTN.
    same = gptq_blocks(weight, np.eye(_IN), _BLOCK)
    np.testing.assert_array_equal(same.codes, rtn.codes)


def test_gptq_output_error_on_the_calibration_activations_is_below_rtns() -> None:
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(_IN, _OUT)).astype(np.float32)
    x = _correlated(rng, 2000)
    reference = x @ weight
    errors = {}
    for name, blocks in (
        ("rtn", rtn_blocks(weight, _BLOCK)),
        ("gptq", gptq_blocks(weight, x.T @ x, _BLOCK)),
        ("act-order", gptq_blocks(weight, x.T @ x, _BLOCK, act_order=True)),
    ):
        assert blocks.codes.dtype == np.uint8 and blocks.scales.shape == (_OUT, _IN // _BLOCK)
        errors[name] = np.linalg.norm(x @ blocks.weight() - reference)
    assert errors["gptq"] < 0.9 * errors["rtn"]
    assert errors["act-order"] < 0.9 * errors["rtn"]
    # And on activations of the same kind it was not fitted on.
    held_out = _correlated(np.random.default_rng(1), 500)
    assert np.linalg.norm(
        held_out @ gptq_blocks(weight, x.T @ x, _BLOCK).weight() - (held_out @ weight)
    ) < np.linalg.norm(held_out @ rtn_blocks(weight, _BLOCK).weight() - held_out @ weight)


def test_the_written_matmulnbits_dequantizes_to_the_codes_and_runs_them() -> None:
    rng = np.random.default_rng(2)
    weight = rng.normal(size=(_IN, _OUT)).astype(np.float32)
    x = _correlated(rng, 400)
    blocks = gptq_blocks(weight, x.T @ x, _BLOCK)
    exact = blocks.weight()
    probe = x[:6].reshape(2, 3, _IN).astype(np.float32)
    for level in (0, 4):  # float compute, then int8 compute as the rung runs
        model = _quantized(weight, level)
        assert write_int8_blocks(model, {"y": blocks}) == ["proj_Q8"]
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        dequantized = (inits["w_Q8"].astype(np.float64) - 128) * inits["w_scales"].reshape(
            _OUT, _IN // _BLOCK, 1
        )
        np.testing.assert_array_equal(dequantized.reshape(_OUT, _IN).T, exact)
        got = _run(model, probe)
        expected = probe.astype(np.float64) @ exact
        tolerance = 1e-4 if level == 0 else 2e-2
        assert np.abs(got - expected).max() < tolerance * np.abs(expected).max()


def test_hessians_are_summed_over_prompts_from_extra_graph_outputs() -> None:
    rng = np.random.default_rng(3)
    table = rng.normal(size=(10, _IN)).astype(np.float32)
    weight = rng.normal(size=(_IN, _OUT)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["x"], name="embed"),
            helper.make_node("MatMul", ["x", "w"], ["logits"], name="proj"),
        ],
        "tiny",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, None]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, None]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, None, _OUT])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    prompts = [[1, 2, 3], [4, 4]]
    hessians, tokens = input_hessians(model, ["x"], prompts)
    rows = table[[1, 2, 3, 4, 4]].astype(np.float64)
    assert tokens == 5
    np.testing.assert_allclose(hessians["x"], rows.T @ rows, rtol=1e-6)


def test_the_sensitivity_measurement_quantizes_a_layer_as_the_rung_rounds_it(
    tmp_path: Path,
) -> None:
    """With GPTQ, each layer is measured with its GPTQ codes, not rounded to nearest."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from graylane.builder.variants import layer_quantizer

    rng = np.random.default_rng(4)
    weight = rng.normal(size=(_IN, _OUT)).astype(np.float32)
    x = _correlated(rng, 400)
    blocks = gptq_blocks(weight, x.T @ x, _BLOCK)
    rtn = rtn_blocks(weight, _BLOCK)
    assert not np.array_equal(blocks.codes, rtn.codes)

    def quantizer_for(model: onnx.ModelProto, exclude: Sequence[str]) -> Any:
        return MatMulNBitsQuantizer(
            model,
            bits=8,
            block_size=_BLOCK,
            is_symmetric=True,
            accuracy_level=4,
            nodes_to_exclude=list(exclude),
        )

    def codes_of(encoded: Mapping[str, Int8Blocks] | None, exclude: Sequence[str]) -> Any:
        folder = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        quantize = layer_quantizer([], quantizer_for, encoded)
        quantize(projection_model(weight), exclude, folder / "model.onnx")
        model = onnx.load(str(folder / "model.onnx"))
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        return inits.get("w_Q8")

    np.testing.assert_array_equal(codes_of({"y": blocks}, []), blocks.codes)
    np.testing.assert_array_equal(codes_of(None, []), rtn.codes)
    assert codes_of({"y": blocks}, ["proj"]) is None  # kept in float: nothing written


def test_the_rounding_less_the_float_layers_keeps_the_rest() -> None:
    weight = np.random.default_rng(5).normal(size=(_IN, _OUT)).astype(np.float32)
    blocks = rtn_blocks(weight, _BLOCK)
    rounding = GptqRounding(
        encoded={"a": blocks, "b": blocks}, calibration_prompts=2, tokens=9, activations=1
    )
    rest = rounding.without({"a"})
    assert list(rest.encoded) == ["b"]
    assert (rest.calibration_prompts, rest.tokens, rest.activations) == (2, 9, 1)
    assert "GPTQ rounding of 1 weights" in rest.describe()
