"""A 4-bit rung keeps weights already on 4-bit block grids exactly (a Q4_1 GGUF's import)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from graylane.builder.source_grid import encode_on_source_grid, source_grid
from tests.support.small_models import projection_model

_IN, _OUT, _BLOCK = 64, 16, 32


def _q4_1(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """An ``[in, out]`` weight as a Q4_1 GGUF dequantizes: ``d * q + m`` per block of 32,
    the block's minimum and maximum at codes 0 and 15, some blocks all positive."""
    codes = rng.integers(0, 16, size=(cols, rows // _BLOCK, _BLOCK))
    codes[..., 0], codes[..., 1] = 0, 15
    step = rng.uniform(0.01, 0.1, size=(cols, rows // _BLOCK, 1)).astype(np.float32)
    low = rng.uniform(-1.0, 0.5, size=(cols, rows // _BLOCK, 1)).astype(np.float32)
    blocks = (step * codes.astype(np.float32) + low).astype(np.float32)
    return np.ascontiguousarray(blocks.reshape(cols, rows).T)


def test_a_q4_1_weight_is_found_on_its_grid_and_given_back_exactly() -> None:
    weight = _q4_1(np.random.default_rng(0), _IN, _OUT)
    grid = source_grid(weight, _BLOCK)
    assert grid is not None
    assert grid.codes.max() == 15 and grid.zero_points.max() <= 15
    np.testing.assert_allclose(grid.weight(), weight, rtol=0, atol=1e-6)
    # The integer zero point alone is off; the offsets carry what it leaves over.
    assert np.abs(grid.offsets).max() > 1e-3


def test_a_weight_off_any_4_bit_grid_is_left_to_the_quantizer() -> None:
    weight = np.random.default_rng(1).normal(size=(_IN, _OUT)).astype(np.float32)
    assert source_grid(weight, _BLOCK) is None
    assert source_grid(_q4_1(np.random.default_rng(2), _IN, _OUT), 64) is None  # two grids


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def test_the_rewritten_matmulnbits_computes_the_source_product() -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(3)
    weight = _q4_1(rng, _IN, _OUT)
    x = rng.normal(size=(2, 3, _IN)).astype(np.float32)
    reference = x @ weight
    rounded = MatMulNBitsQuantizer(
        projection_model(weight), bits=4, block_size=_BLOCK, is_symmetric=False, accuracy_level=1
    )
    rounded.process()
    rtn_error = np.abs(_run(rounded.model.model, x) - reference).max()
    exact = MatMulNBitsQuantizer(
        projection_model(weight), bits=4, block_size=_BLOCK, is_symmetric=False, accuracy_level=1
    )
    exact.process()
    assert encode_on_source_grid(exact.model.model, {"y": weight}) == ["proj_Q4"]
    ops = [n.op_type for n in exact.model.model.graph.node]
    assert ops.count("MatMulNBits") == 1 and "ReduceSum" in ops
    error = np.abs(_run(exact.model.model, x) - reference).max()
    assert error < 1e-4 < rtn_error
