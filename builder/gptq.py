"""Error-compensating rounding of the 8-bit rung's weights (GPTQ).

After smoothing, rounding the 8-bit rung's weights costs SmolLM2-135M about as much as
quantizing its activations (summed relative output error of sampled projections: weights
alone 7.5e-4, activations alone 5.4e-4). Round to nearest treats every weight alone;
GPTQ rounds the input channels of a ``MatMul`` (``x @ W``, ``W`` is ``[K, N]``) one at a
time and moves each rounding error onto the channels not rounded yet, in the proportion
that keeps ``x @ W`` closest on the calibration activations:

1. ``H = X^T X`` of the MatMul's (smoothed) input on calibration text, accumulated per
   forward (``X`` itself is never kept), damped by 1 % of its mean diagonal;
2. ``U``, the upper Cholesky factor of ``H^-1``;
3. for each input channel ``k`` in order: at the start of each block of ``block`` input
   channels, the block's scale per output column from the weights as the errors so far
   have left them (ONNX Runtime's symmetric 8-bit convention: the largest-magnitude
   weight maps to -128, ``scale = w_max / -128``); round row ``k``; its error
   ``e = (w - q) / U[k, k]`` updates the rows after it, ``W[j] -= e * U[k, j]``.

The codes and scales are written straight into the ``MatMulNBits`` initializers the
quantizer made (``B`` ``[N, K / block, block]`` uint8, code ``round(w / scale) + 128``;
``scales`` ``[N, K / block]``; no zero-point input: 128 is the symmetric default),
since quantizing again would round the compensated weights back to nearest.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = [
    "DAMPING",
    "GptqRounding",
    "Int8Blocks",
    "gptq_blocks",
    "input_hessians",
    "rtn_blocks",
    "write_int8_blocks",
]

DAMPING = 0.01
"""Added to ``H``'s diagonal, as a fraction of its mean diagonal."""
_ZERO = 128
_LAZY = 128
"""Channels updated together before the rest of ``W`` sees their errors (a multiple of
the block size keeps a block's scale choice inside one batch)."""


@dataclass(frozen=True)
class Int8Blocks:
    """One ``[K, N]`` weight as symmetric 8-bit blocks along ``K``."""

    codes: np.ndarray
    """``[N, K / block, block]`` uint8, ``round(w / scale) + 128``."""
    scales: np.ndarray
    """``[N, K / block]`` float32."""

    def weight(self) -> np.ndarray:
        """The ``[K, N]`` weight these encode, ``(code - 128) * scale``."""
        values = (self.codes.astype(np.float64) - _ZERO) * self.scales[..., None]
        out, count, block = self.codes.shape
        return np.asarray(values.reshape(out, count * block).T, dtype=np.float64)


@dataclass(frozen=True)
class GptqRounding:
    """The 8-bit rung's GPTQ codes, and what they were fitted on (noted in its manifest)."""

    encoded: Mapping[str, Int8Blocks]
    """By the ``MatMul``'s output (which ``MatMulNBits`` keeps)."""
    calibration_prompts: int
    tokens: int
    activations: int
    """Distinct inputs whose ``X^T X`` was taken (q/k/v share one)."""

    def without(self, outputs: Collection[str]) -> GptqRounding:
        """The same rounding less the weights of ``outputs`` (layers kept in float)."""
        dropped = set(outputs)
        encoded = {k: v for k, v in self.encoded.items() if k not in dropped}
        return replace(self, encoded=encoded)

    def describe(self) -> str:
        return (
            f"GPTQ rounding of {len(self.encoded)} weights (damping {DAMPING:g} of the mean "
            f"diagonal; X^T X of {self.activations} activations over {self.calibration_prompts} "
            f"calibration prompts, {self.tokens} tokens)"
        )


def _scale(block: np.ndarray) -> np.ndarray:
    """Per row of ``block`` (``[N, b]``): ``w_max / -128``, the weight of largest magnitude
    mapped to -128 (ONNX Runtime's symmetric convention); 1 for an all-zero row."""
    index = np.abs(block).argmax(axis=1)
    peak = block[np.arange(len(block)), index]
    scale = peak / -float(_ZERO)
    safe = np.where(scale == 0, 1.0, scale).astype(np.float32)
    return np.asarray(safe, dtype=np.float64)


def _round(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    codes: np.ndarray = np.clip(np.round(values / scale) + _ZERO, 0, 2 * _ZERO - 1)
    return codes


def rtn_blocks(weight: np.ndarray, block: int) -> Int8Blocks:
    """Round to nearest, as ONNX Runtime's quantizer does (the baseline GPTQ improves on)."""
    rows, cols = weight.shape
    blocks = np.asarray(weight, dtype=np.float64).T.reshape(cols, rows // block, block)
    scales = np.stack([_scale(blocks[:, b]) for b in range(rows // block)], axis=1)
    codes = _round(blocks, scales[..., None])
    return Int8Blocks(codes=codes.astype(np.uint8), scales=scales.astype(np.float32))


def _inverse_cholesky(hessian: np.ndarray, damping: float) -> np.ndarray:
    """The upper Cholesky factor ``U`` of ``(H + damping * mean(diag H) * I)^-1``."""
    h = np.array(hessian, dtype=np.float64)
    diagonal = np.diag(h).copy()
    dead = diagonal <= 0
    h[dead, dead] = 1.0
    mean = float(np.mean(np.diag(h)))
    h[np.diag_indices_from(h)] += damping * mean
    lower = np.linalg.cholesky(h)
    inverse_lower = np.linalg.inv(lower)
    inverse = inverse_lower.T @ inverse_lower
    return np.asarray(np.linalg.cholesky(inverse).T)


def gptq_blocks(
    weight: np.ndarray,
    hessian: np.ndarray,
    block: int,
    damping: float = DAMPING,
    act_order: bool = False,
) -> Int8Blocks:
    """``weight`` (``[K, N]``) rounded to symmetric 8-bit blocks of ``block`` input
    channels with GPTQ's error compensation on ``hessian`` (``[K, K]``, ``X^T X``).

    ``act_order``: round the channels with the largest ``H[k, k]`` first (their errors
    then spread over the most channels); the blocks' scales are fixed beforehand from the
    weights as given, since a block's channels are no longer rounded together.
    """
    rows, cols = weight.shape
    if rows % block or _LAZY % block:
        raise ValueError(f"GPTQ needs K ({rows}) and {_LAZY} to be multiples of {block}")
    w = np.array(weight, dtype=np.float64).T  # [N, K]: one row per output column
    h = np.asarray(hessian, dtype=np.float64)
    dead = np.diag(h) <= 0
    w[:, dead] = 0.0
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(rows)
    fixed = rtn_blocks(weight, block).scales.astype(np.float64) if act_order else None
    w = w[:, order]
    upper = _inverse_cholesky(h[np.ix_(order, order)], damping)
    codes = np.zeros((cols, rows), dtype=np.uint8)
    scales = np.zeros((cols, rows // block), dtype=np.float32) if fixed is None else fixed
    for start in range(0, rows, _LAZY):
        end = min(start + _LAZY, rows)
        batch = w[:, start:end].copy()
        errors = np.zeros_like(batch)
        inner = upper[start:end, start:end]
        scale = np.ones(cols)
        for i in range(end - start):
            channel = int(order[start + i])
            if fixed is not None:
                scale = fixed[:, channel // block]
            elif channel % block == 0:
                scale = _scale(batch[:, i : i + block])
                scales[:, channel // block] = scale
            column = batch[:, i]
            code = _round(column, scale)
            codes[:, channel] = code
            error = (column - (code - _ZERO) * scale) / inner[i, i]
            batch[:, i:] -= np.outer(error, inner[i, i:])
            errors[:, i] = error
        w[:, end:] -= errors @ upper[start:end, end:]
    return Int8Blocks(
        codes=codes.reshape(cols, rows // block, block), scales=scales.astype(np.float32)
    )


def input_hessians(
    model: onnx.ModelProto, activations: Sequence[str], prompts: Sequence[Sequence[int]]
) -> tuple[dict[str, np.ndarray], int]:
    """``X^T X`` (float64, ``[K, K]``) of each activation over ``prompts`` (token ids, one
    forward each, run as a worker runs the model), and the token rows summed."""
    from graylane.builder.runtime import activations_per_prompt

    hessians: dict[str, np.ndarray] = {}
    tokens = 0
    for ids, out in zip(prompts, activations_per_prompt(model, activations, prompts), strict=True):
        tokens += len(ids)
        for name in activations:
            value = np.asarray(out[name], dtype=np.float64)
            x = value.reshape(-1, value.shape[-1])
            product = x.T @ x
            previous = hessians.get(name)
            hessians[name] = product if previous is None else previous + product
    return hessians, tokens


def write_int8_blocks(model: onnx.ModelProto, encoded: Mapping[str, Int8Blocks]) -> list[str]:
    """Write each encoding (by the node's output, which the quantizer keeps) into its
    8-bit symmetric ``MatMulNBits`` node's ``B`` and ``scales`` (in place); returns the
    nodes written."""
    inits = {i.name: i for i in model.graph.initializer}
    written: list[str] = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or not node.output:
            continue
        blocks = encoded.get(node.output[0])
        if blocks is None:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        if attrs.get("bits") != 8 or (len(node.input) > 3 and node.input[3]):
            raise ValueError(f"{node.name}: not a symmetric 8-bit MatMulNBits")
        codes, scales = inits[node.input[1]], inits[node.input[2]]
        if tuple(codes.dims) != blocks.codes.shape:
            raise ValueError(f"{node.name}: B is {list(codes.dims)}, not {blocks.codes.shape}")
        _set(codes, blocks.codes)
        _set(scales, blocks.scales.reshape(tuple(scales.dims)))
        written.append(node.name)
    return written


def _set(init: onnx.TensorProto, array: np.ndarray) -> None:
    init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), init.name))
