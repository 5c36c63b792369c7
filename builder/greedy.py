"""Greedy generation over any ``feeds -> outputs`` runner (full recompute, no KV cache)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from graylane.artifacts.graph import DECODER_INPUTS, DECODER_OUTPUT

__all__ = ["Runner", "greedy_generate"]

Runner = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def greedy_generate(
    run: Runner,
    prompts: Sequence[np.ndarray],
    new_tokens: int,
    pad_id: int = 0,
) -> np.ndarray:
    """Append ``new_tokens`` argmax tokens to every prompt; returns them as ``[n, new_tokens]``.

    Prompts are batched with right padding (attention_mask 0), which a causal model
    ignores at the real positions, so each row gets the tokens it would get alone.
    Generation never stops early: agreement is compared over a fixed length.
    """
    if not prompts:
        return np.zeros((0, new_tokens), dtype=np.int64)
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    if lengths.min() < 1:
        raise ValueError("every prompt needs at least one token")
    width = int(lengths.max()) + new_tokens
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
        mask[row, : len(prompt)] = 1
    generated = np.zeros((len(prompts), new_tokens), dtype=np.int64)
    rows = np.arange(len(prompts))
    for step in range(new_tokens):
        current = int(lengths.max())
        outputs = run({DECODER_INPUTS[0]: ids[:, :current], DECODER_INPUTS[1]: mask[:, :current]})
        logits = np.asarray(outputs[DECODER_OUTPUT])
        next_tokens = logits[rows, lengths - 1].argmax(axis=-1).astype(np.int64)
        ids[rows, lengths] = next_tokens
        mask[rows, lengths] = 1
        generated[:, step] = next_tokens
        lengths += 1
    return generated
