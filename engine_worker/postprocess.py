"""Reducing a model's primary output per request row (pure numpy)."""

from __future__ import annotations

import numpy as np

from graylane.engine.errors import InvalidInputError
from graylane.serde import PostProcess

__all__ = ["MEAN_POOL", "TOKEN_IDS", "TOPK_IDS", "TOPK_VALUES", "post_process"]

TOKEN_IDS = "token_ids"
"""ARGMAX_LAST result: int64 [rows], the argmax at each row's last real position."""
TOPK_IDS = "topk_ids"
"""TOPK_LAST result: int64 [rows, k], best first (ties: lower id first)."""
TOPK_VALUES = "topk_values"
"""TOPK_LAST result: [rows, k] values matching ``topk_ids``."""
MEAN_POOL = "mean_pool"
"""MEAN_POOL result: [rows, features], the mean over each row's real positions."""


def post_process(
    out: np.ndarray, mask: np.ndarray | None, post: PostProcess, top_k: int
) -> dict[str, np.ndarray]:
    """Reduce ``out`` [rows, (seq,) features...] per row.

    With a sequence axis (rank >= 3), "last" is each row's last real position
    (last mask 1; the last position without a mask) and the mean runs over real
    positions. A rank-2 output is already one vector per row.
    """
    if out.ndim < 2:
        raise InvalidInputError(f"{post.value} needs an output of rank >= 2, got {out.shape}")
    if out.ndim < 3 or (mask is not None and mask.shape[1] != out.shape[1]):
        vectors = out  # no sequence axis: already one vector per row
        if post is PostProcess.MEAN_POOL:
            return {MEAN_POOL: out}
    else:
        real = np.ones(out.shape[:2], dtype=bool) if mask is None else mask != 0
        if post is PostProcess.MEAN_POOL:
            weights = real.astype(np.float64)
            counts = np.maximum(weights.sum(axis=1), 1.0)
            summed = np.einsum("rs,rs...->r...", weights, out.astype(np.float64))
            expand = counts.reshape((-1,) + (1,) * (summed.ndim - 1))
            return {MEAN_POOL: (summed / expand).astype(out.dtype)}
        last = out.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1)
        vectors = out[np.arange(out.shape[0]), last]
    flat = vectors.reshape(vectors.shape[0], -1)
    if post is PostProcess.ARGMAX_LAST:
        return {TOKEN_IDS: np.argmax(flat, axis=1).astype(np.int64)}
    k = min(top_k, flat.shape[1])
    order = np.argsort(-flat.astype(np.float64), axis=1, kind="stable")[:, :k]
    return {
        TOPK_IDS: order.astype(np.int64),
        TOPK_VALUES: np.take_along_axis(flat, order, axis=1),
    }
