"""Inputs of a token model that no request carries: derived from the ids and the mask.

A decoder exported from transformers (Hugging Face Optimum) may take, besides
``input_ids`` and ``attention_mask``:

- ``position_ids`` [batch, seq]: each token's position, counted along the mask
  (right padding and holes in a running batch's cache never shift a real token);
- ``past_key_values.N.key|value`` [batch, kv_heads, past, head_dim]: the cache,
  empty for a forward pass over the whole sequence;
- ``use_cache_branch`` bool [1] (a merged decoder): false runs its first-pass
  branch, which ignores the past.

The worker (forward passes, warm-up, the decode loop) and the builder (samples,
calibration, validation) fill them the same way, from here.
"""

from __future__ import annotations

import numpy as np

from graylane.engine.signature import IOSignature

__all__ = [
    "PAST_PREFIX",
    "POSITION_IDS",
    "USE_CACHE_BRANCH",
    "derived_feeds",
    "derived_input_names",
    "empty_past",
    "positions_from_mask",
]

POSITION_IDS = "position_ids"
USE_CACHE_BRANCH = "use_cache_branch"
"""The bool [1] input of a merged decoder (Optimum's ``decoder_model_merged``): false runs
its first-pass graph (the past inputs are ignored), true the one that reads the past."""
PAST_PREFIX = "past_key_values."
_IDS = "input_ids"


def positions_from_mask(mask: np.ndarray, width: int, dtype: np.dtype[np.generic]) -> np.ndarray:
    """``position_ids`` of the last ``width`` columns: the real tokens before each (from 0).

    Rows may be right-padded and hold holes; a column the mask hides gets its
    neighbour's position (never read), and never a negative one.
    """
    positions = np.cumsum(mask, axis=1, dtype=np.int64)[:, -width:] - 1
    return np.maximum(positions, 0).astype(dtype)


def derived_input_names(io: IOSignature) -> tuple[str, ...]:
    """The inputs of ``io`` a token model derives (none for a model without ``input_ids``)."""
    if io.find_input(_IDS) is None:
        return ()
    return tuple(
        s.name
        for s in io.inputs
        if s.name in (POSITION_IDS, USE_CACHE_BRANCH) or s.name.startswith(PAST_PREFIX)
    )


def empty_past(io: IOSignature, rows: int) -> dict[str, np.ndarray]:
    """A past of length 0 for each ``past_key_values.*`` input (and ``use_cache_branch`` false).

    Heads and head size are the fixed axes 1 and 3 of each past input.
    """
    feeds: dict[str, np.ndarray] = {}
    for spec in io.inputs:
        if spec.name.startswith(PAST_PREFIX) and spec.rank == 4:
            heads, head_dim = spec.shape[1], spec.shape[3]
            if isinstance(heads, int) and isinstance(head_dim, int):
                feeds[spec.name] = np.zeros((rows, heads, 0, head_dim), spec.dtype)
    if feeds and io.find_input(USE_CACHE_BRANCH) is not None:
        feeds[USE_CACHE_BRANCH] = np.array([False])
    return feeds


def derived_feeds(io: IOSignature, mask: np.ndarray) -> dict[str, np.ndarray]:
    """What a forward pass over ``mask`` [rows, seq] feeds besides ids and mask.

    ``position_ids`` counted along the mask and, for a decoder with past inputs, an
    empty past (and ``use_cache_branch`` false), for the inputs ``io`` has.
    """
    feeds: dict[str, np.ndarray] = {}
    positions = io.find_input(POSITION_IDS)
    if positions is not None:
        feeds[POSITION_IDS] = positions_from_mask(mask, int(mask.shape[1]), positions.dtype)
    feeds.update(empty_past(io, int(mask.shape[0])))
    return feeds
