"""Forward passes of a batch of requests, batched where results stay exact (pure numpy).

Forward passes batch two ways:

- generic models: requests whose inputs have the same non-batch shapes are
  concatenated on axis 0 and run once; the rest run one by one;
- token models (:func:`~graylane.engine_worker.layouts.token_layout`): rows of
  different lengths are right-padded into one batch with an attention mask, and every
  output with a sequence axis is cut back to each request's own width, so a request
  gets what its unbatched run gives (a cached decoder's ``present.*`` outputs are its
  cache, not a result, and are dropped; its forward pass runs with an empty past and
  ``use_cache_branch`` false, a plain pass over the request's tokens). A token model
  without an ``attention_mask`` input batches only rows of equal width (no padding).

Token rows (:class:`TokenRow`) and their padded forward pass
(:func:`forward_token_rows`) serve per-batch generation too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from graylane.engine.derived_inputs import derived_feeds
from graylane.engine.errors import InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import IOSignature
from graylane.engine_worker.layouts import (
    ATTENTION_MASK,
    INPUT_IDS,
    TokenLayout,
    kv_cache_layout,
    token_layout,
)
from graylane.engine_worker.logic.batching import BucketPolicy, PendingItem, pad_token_batch
from graylane.engine_worker.postprocess import post_process
from graylane.serde import PostProcess

__all__ = [
    "TokenRow",
    "check_ids",
    "forward_token_rows",
    "full_row",
    "primary_output",
    "run_forward",
]


@dataclass(frozen=True, slots=True)
class TokenRow:
    ids: np.ndarray
    mask: np.ndarray

    @property
    def width(self) -> int:
        return int(self.ids.shape[0])


def run_forward(
    engine: InferenceEngine,
    feeds_per_request: Sequence[Mapping[str, np.ndarray]],
    post: PostProcess = PostProcess.NONE,
    top_k: int = 5,
    *,
    output_name: str | None = None,
    policy: BucketPolicy | None = None,
    pad_id: int = 0,
) -> list[dict[str, np.ndarray]]:
    """Run every request, batched where results stay exact; one result per request.

    ``post`` applies to ``output_name`` (default: the engine's first output).
    ``policy`` caps rows per batch and, for token models, pads to its buckets;
    without one, all rows go into one batch padded to the longest.
    """
    primary = primary_output(engine.io, output_name)
    if top_k < 1:
        raise InvalidInputError(f"top_k must be >= 1, got {top_k}")
    layout = token_layout(engine.io)
    if layout is None:
        raw = _forward_generic(engine, feeds_per_request, policy)
        masks: list[np.ndarray | None] = [None] * len(raw)
    else:
        requests = [_token_rows(layout, feeds, policy) for feeds in feeds_per_request]
        flat = [row for rows in requests for row in rows]
        cache = kv_cache_layout(engine.io)
        outputs = forward_token_rows(engine, layout, flat, policy, pad_id)
        names = [n for n in engine.io.output_names if cache is None or n not in cache.present_names]
        raw, masks, start = [], [], 0
        for rows in requests:
            mine = outputs[start : start + len(rows)]
            start += len(rows)
            raw.append({k: np.concatenate([o[k] for o in mine]) for k in names})
            masks.append(np.stack([row.mask for row in rows]))
    if post is PostProcess.NONE:
        return raw
    return [post_process(r[primary], m, post, top_k) for r, m in zip(raw, masks, strict=True)]


# --- token models -------------------------------------------------------------------


def full_row(layout: TokenLayout, tokens: Sequence[int]) -> TokenRow:
    ids = np.asarray(tokens, dtype=layout.id_dtype)
    return TokenRow(ids, np.ones(ids.shape, dtype=layout.mask_dtype or np.int64))


def check_ids(layout: TokenLayout, ids: np.ndarray, what: str) -> None:
    if ids.size and (ids.min() < 0 or (layout.vocab_size and ids.max() >= layout.vocab_size)):
        raise InvalidInputError(f"{what}: token ids outside [0, {layout.vocab_size})")


def _token_rows(
    layout: TokenLayout, feeds: Mapping[str, np.ndarray], policy: BucketPolicy | None
) -> list[TokenRow]:
    allowed = {INPUT_IDS} if layout.mask_dtype is None else {INPUT_IDS, ATTENTION_MASK}
    if INPUT_IDS not in feeds or not set(feeds) <= allowed:
        raise InvalidInputError(f"token model takes {sorted(allowed)}, got {sorted(feeds)}")
    ids = np.asarray(feeds[INPUT_IDS])
    if ids.ndim != 2 or ids.dtype != layout.id_dtype or ids.shape[1] < 1:
        raise InvalidInputError(
            f"{INPUT_IDS} must be {layout.id_dtype} [rows, seq>=1], got {ids.dtype} {ids.shape}"
        )
    check_ids(layout, ids, INPUT_IDS)
    if policy is not None and ids.shape[1] > policy.max_seq_len:
        raise InvalidInputError(
            f"{INPUT_IDS} has {ids.shape[1]} positions, the largest bucket is {policy.max_seq_len}"
        )
    mask_dtype = layout.mask_dtype or np.dtype(np.int64)
    if ATTENTION_MASK in feeds:
        mask = np.asarray(feeds[ATTENTION_MASK])
        if mask.shape != ids.shape or mask.dtype != mask_dtype:
            raise InvalidInputError(
                f"{ATTENTION_MASK} must be {mask_dtype} {ids.shape}, got {mask.dtype} {mask.shape}"
            )
    else:
        mask = np.ones(ids.shape, dtype=mask_dtype)
    return [TokenRow(ids[r], mask[r]) for r in range(ids.shape[0])]


def forward_token_rows(
    engine: InferenceEngine,
    layout: TokenLayout,
    rows: Sequence[TokenRow],
    policy: BucketPolicy | None,
    pad_id: int,
) -> list[dict[str, np.ndarray]]:
    """Outputs per row, each with a batch axis of 1 and sequence axes cut to the row width."""
    results: list[dict[str, np.ndarray] | None] = [None] * len(rows)
    for width, members in _token_groups(layout, rows, policy):
        ids, _ = pad_token_batch([rows[i].ids for i in members], width, pad_id)
        feeds = {INPUT_IDS: ids.astype(layout.id_dtype, copy=False)}
        mask = np.zeros((len(members), width), dtype=layout.mask_dtype or np.int64)
        for j, i in enumerate(members):
            mask[j, : rows[i].width] = rows[i].mask
        if layout.mask_dtype is not None:
            feeds[ATTENTION_MASK] = mask
        if layout.derived:
            feeds.update(derived_feeds(engine.io, mask))
        outputs = engine.run(feeds)
        seq_axis = {name: _has_seq_axis(engine.io, name, o, width) for name, o in outputs.items()}
        for j, i in enumerate(members):
            w = rows[i].width
            results[i] = {
                name: out[j : j + 1, :w] if seq_axis[name] else out[j : j + 1]
                for name, out in outputs.items()
            }
    return [r for r in results if r is not None]


def _token_groups(
    layout: TokenLayout, rows: Sequence[TokenRow], policy: BucketPolicy | None
) -> list[tuple[int, list[int]]]:
    """(padded width, row positions) per batch."""
    if layout.mask_dtype is None:
        # Without a mask input, padding could change results: batch equal widths only.
        by_width: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            by_width.setdefault(row.width, []).append(i)
        size = policy.max_batch_size if policy else max(len(rows), 1)
        return [
            (width, members[s : s + size])
            for width, members in by_width.items()
            for s in range(0, len(members), size)
        ]
    if policy is None:
        return [(max(r.width for r in rows), list(range(len(rows))))] if rows else []
    plan = policy.plan_batches([PendingItem(i, row.width) for i, row in enumerate(rows)])
    return [(batch.bucket_len, list(batch.indices)) for batch in plan]


def _has_seq_axis(io: IOSignature, name: str, out: np.ndarray, width: int) -> bool:
    if out.ndim < 2:
        return False
    declared = io.output(name).shape[1] if io.output(name).rank >= 2 else None
    if isinstance(declared, int):
        return False
    seq = io.input(INPUT_IDS).shape[1]
    if isinstance(declared, str) and isinstance(seq, str):
        return declared == seq
    return int(out.shape[1]) == width


# --- generic models -----------------------------------------------------------------


def _forward_generic(
    engine: InferenceEngine,
    feeds_per_request: Sequence[Mapping[str, np.ndarray]],
    policy: BucketPolicy | None,
) -> list[dict[str, np.ndarray]]:
    io = engine.io
    checked = [io.check_feeds(feeds) for feeds in feeds_per_request]
    if not checked:
        return []
    sizes = [_batch_size(feeds) for feeds in checked]
    stackable = all(not isinstance(spec.shape[0], int) for spec in io.inputs if spec.rank) and all(
        s is not None for s in sizes
    )
    signature = {tuple((k, v.shape[1:]) for k, v in sorted(f.items())) for f in checked}
    if not stackable or len(signature) != 1:
        return [engine.run(feeds) for feeds in checked]
    limit = policy.max_batch_size if policy else sum(s or 0 for s in sizes)
    results: list[dict[str, np.ndarray]] = []
    start = 0
    while start < len(checked):
        end, rows = start, 0
        while end < len(checked) and (end == start or rows + (sizes[end] or 0) <= limit):
            rows += sizes[end] or 0
            end += 1
        results.extend(_run_stacked(engine, checked[start:end], [s or 0 for s in sizes[start:end]]))
        start = end
    return results


def _batch_size(feeds: Mapping[str, np.ndarray]) -> int | None:
    """The common axis-0 length of all inputs, or ``None`` when they differ."""
    lengths = {int(arr.shape[0]) if arr.ndim else -1 for arr in feeds.values()}
    if len(lengths) != 1 or -1 in lengths:
        return None
    return lengths.pop()


def _run_stacked(
    engine: InferenceEngine, group: Sequence[dict[str, np.ndarray]], sizes: Sequence[int]
) -> list[dict[str, np.ndarray]]:
    if len(group) == 1:
        return [engine.run(group[0])]
    feeds = {name: np.concatenate([g[name] for g in group]) for name in group[0]}
    outputs = engine.run(feeds)
    total = sum(sizes)
    if any(out.ndim == 0 or out.shape[0] != total for out in outputs.values()):
        # Outputs without a batch axis cannot be split: rerun one by one.
        return [engine.run(g) for g in group]
    bounds = np.cumsum([0, *sizes])
    return [
        {name: out[bounds[i] : bounds[i + 1]] for name, out in outputs.items()}
        for i in range(len(group))
    ]


# --- post-processing ----------------------------------------------------------------


def primary_output(io: IOSignature, name: str | None) -> str:
    if name is None:
        if not io.outputs:
            raise InvalidInputError("engine has no outputs")
        return io.outputs[0].name
    if name not in io.output_names:
        raise InvalidInputError(f"unknown output {name!r}; outputs are {io.output_names}")
    return name
