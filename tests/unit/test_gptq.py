"""GPTQ rounds the 8-bit rung's weights closer on calibration activations than round to
nearest, and its codes are what ONNX Runtime's ``MatMulNBits`` computes with."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graylane.builder.gptq import gptq_blocks, input_hessians, rtn_blocks, write_int8_blocks
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
