"""A 4-bit rung that reproduces weights already on a 4-bit grid (a GGUF's Q4_1 import).

A GGUF quantized with ``Q4_1`` stores each block of 32 weights as ``d * q + m``
(``q`` in 0..15, ``d`` and ``m`` per block): its fp32 import holds exactly those values.
Round-to-nearest into ``MatMulNBits`` cannot give them back: its zero point is an integer,
so each block is off by ``m - d * round(m / d)`` (up to half a step, the same sign for the
whole block), which is what cost SmolLM2's int4 rung a quarter of its agreement with fp32.

Here each block is written on the source's own grid: scale ``d``, codes ``q``, integer
zero point ``z = round(-m / d)``, and the remainder ``r = m + d * z`` goes to a small
float correction, ``x @ W = MatMulNBits(x) + blocksum(x) @ R``: ``blocksum`` adds each
block of ``x``'s input axis (``[..., K] -> [..., K / block]``) and ``R`` is
``[K / block, N]``. The weights the graph multiplies by are the source's, exactly.

A weight whose blocks are not on a 16-level grid (not imported from a 4-bit GGUF) is left
as the quantizer wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["GridEncoding", "encode_on_source_grid", "source_grid"]

_LEVELS = 15
_TOLERANCE = 1e-4
"""Largest distance from the grid, relative to the block's step, still counted as on it
(float32 rounding of ``d * q + m``; a weight off the grid is a quarter step off on average)."""


@dataclass(frozen=True)
class GridEncoding:
    """One ``[in, out]`` weight on its blocks' 4-bit grids."""

    codes: np.ndarray
    """``[out, in / block, block]`` in 0..15."""
    scales: np.ndarray
    """``[out, in / block]``."""
    zero_points: np.ndarray
    """``[out, in / block]`` integers in 0..15."""
    offsets: np.ndarray
    """``[in / block, out]``: what each block's integer zero point leaves over."""

    def weight(self) -> np.ndarray:
        """The ``[in, out]`` weight this encodes (``scale * (code - zero) + offset``)."""
        codes = self.codes.astype(np.float64) - self.zero_points.astype(np.float64)[..., None]
        blocks = self.scales[..., None] * codes
        blocks = blocks + self.offsets.T[..., None]
        out, count, block = self.codes.shape
        return np.asarray(blocks.reshape(out, count * block).T, dtype=np.float64)


def source_grid(weight: np.ndarray, block: int) -> GridEncoding | None:
    """``weight`` (``[in, out]``) on 16-level grids per block of ``block`` along ``in``, or
    ``None`` when some block is not on one (or ``in`` is not a multiple of ``block``)."""
    rows, cols = weight.shape
    if rows % block:
        return None
    blocks = np.asarray(weight, dtype=np.float64).T.reshape(cols, rows // block, block)
    low, high = blocks.min(axis=-1), blocks.max(axis=-1)
    step = (high - low) / _LEVELS
    safe = np.where(step > 0, step, 1.0)
    codes = np.round((blocks - low[..., None]) / safe[..., None])
    off_grid = np.abs(blocks - (low[..., None] + codes * step[..., None])).max(axis=-1) / safe
    if not np.all(off_grid <= _TOLERANCE):
        return None
    zero = np.clip(np.round(-low / safe), 0, _LEVELS)
    offsets = low + safe * zero
    return GridEncoding(
        codes=codes.astype(np.uint8),
        scales=safe.astype(np.float32),
        zero_points=zero.astype(np.uint8),
        offsets=offsets.T.astype(np.float32),
    )


def _pack(values: np.ndarray) -> np.ndarray:
    """Two 4-bit values a byte along the last axis, the first in the low nibble."""
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], -1)
    return np.asarray(values[..., 0::2] | (values[..., 1::2] << 4), dtype=np.uint8)


def encode_on_source_grid(
    model: onnx.ModelProto, source_weights: dict[str, np.ndarray]
) -> list[str]:
    """Rewrite each 4-bit ``MatMulNBits`` of ``model`` (in place) whose source weight
    (``source_weights`` by the node's output, which the quantizer keeps) is on a grid of
    its block size; returns their names."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    encoded: list[str] = []
    for node in graph.node:
        nodes.append(node)
        attrs = {a.name: a.i for a in node.attribute}
        weight = source_weights.get(node.output[0]) if node.output else None
        if node.op_type != "MatMulNBits" or attrs.get("bits") != 4 or weight is None:
            continue
        block = int(attrs["block_size"])
        grid = source_grid(weight, block)
        if grid is None:
            continue
        name = node.name
        count = grid.scales.shape[1]
        _set(inits[node.input[1]], _pack(grid.codes))
        _set(inits[node.input[2]], grid.scales.reshape(inits[node.input[2]].dims))
        zero_name = f"{name}.grid_zero_points"
        graph.initializer.append(numpy_helper.from_array(_pack(grid.zero_points), zero_name))
        inputs = list(node.input[:3])
        stale = node.input[3] if len(node.input) > 3 else ""
        if stale in inits:
            graph.initializer.remove(inits.pop(stale))
        del node.input[:]
        node.input.extend([*inputs, zero_name])
        result = node.output[0]
        node.output[0] = f"{name}.grid_out"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([0], np.int64), f"{name}.grid_start"),
                numpy_helper.from_array(np.array([-1], np.int64), f"{name}.grid_last"),
                numpy_helper.from_array(np.array([count, block], np.int64), f"{name}.grid_split"),
                numpy_helper.from_array(grid.offsets, f"{name}.grid_offsets"),
            ]
        )
        x = inputs[0]
        nodes.extend(
            [
                helper.make_node("Shape", [x], [f"{name}.grid_shape"], name=f"{name}/shape"),
                helper.make_node(
                    "Slice",
                    [f"{name}.grid_shape", f"{name}.grid_start", f"{name}.grid_last"],
                    [f"{name}.grid_lead"],
                    name=f"{name}/lead",
                ),
                helper.make_node(
                    "Concat",
                    [f"{name}.grid_lead", f"{name}.grid_split"],
                    [f"{name}.grid_blocks_shape"],
                    name=f"{name}/blocks_shape",
                    axis=0,
                ),
                helper.make_node(
                    "Reshape",
                    [x, f"{name}.grid_blocks_shape"],
                    [f"{name}.grid_blocks"],
                    name=f"{name}/blocks",
                ),
                helper.make_node(
                    "ReduceSum",
                    [f"{name}.grid_blocks", f"{name}.grid_last"],
                    [f"{name}.grid_sums"],
                    name=f"{name}/block_sums",
                    keepdims=0,
                ),
                helper.make_node(
                    "MatMul",
                    [f"{name}.grid_sums", f"{name}.grid_offsets"],
                    [f"{name}.grid_correction"],
                    name=f"{name}/offsets",
                ),
                helper.make_node(
                    "Add",
                    [f"{name}.grid_out", f"{name}.grid_correction"],
                    [result],
                    name=f"{name}/corrected",
                ),
            ]
        )
        encoded.append(name)
    del graph.node[:]
    graph.node.extend(nodes)
    return encoded


def _set(init: onnx.TensorProto, array: np.ndarray) -> None:
    init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), init.name))
