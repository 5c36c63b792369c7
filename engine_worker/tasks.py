"""Forward passes and greedy generation over any :class:`InferenceEngine`, batched.

Pure numpy over the engine protocol. Two ways to batch requests:

- generic models: requests whose inputs have the same non-batch shapes are
  concatenated on axis 0 and run once; the rest run one by one;
- token models (inputs exactly ``input_ids`` or ``input_ids`` + ``attention_mask``):
  rows of different lengths are right-padded into one batch with an attention
  mask, and every output with a sequence axis is cut back to each request's own
  width, so a request gets what its unbatched run gives. A token model without
  an ``attention_mask`` input batches only rows of equal width (no padding).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from graylane.engine.errors import InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import IOSignature
from graylane.engine_worker.batching import (
    BucketPolicy,
    InvalidPolicyError,
    PendingItem,
    pad_token_batch,
)
from graylane.engine_worker.postprocess import PostProcess, post_process

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"


class FinishReason(Enum):
    EOS = "eos"
    """The model produced ``eos_id`` (not included in the tokens)."""
    LENGTH = "length"
    """``max_new_tokens`` were generated."""
    MAX_SEQ = "max_seq"
    """Prompt plus generated tokens reached ``max_seq_len``."""


@dataclass(frozen=True, slots=True)
class GenerationResult:
    tokens: tuple[int, ...]
    """Generated tokens only (no prompt, no EOS)."""
    finished_reason: FinishReason


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """How a token model takes its inputs: id and mask dtypes, and the vocabulary if declared."""

    id_dtype: np.dtype[np.generic]
    mask_dtype: np.dtype[np.generic] | None
    vocab_size: int | None


@dataclass(frozen=True, slots=True)
class _Row:
    ids: np.ndarray
    mask: np.ndarray

    @property
    def width(self) -> int:
        return int(self.ids.shape[0])


def token_layout(io: IOSignature, vocab_size: int | None = None) -> TokenLayout | None:
    """How a token model takes its inputs, or ``None`` for any other model.

    ``vocab_size`` is the declared input vocabulary (``ModelInfo``), if known.
    """
    names = set(io.input_names)
    if names not in ({INPUT_IDS}, {INPUT_IDS, ATTENTION_MASK}):
        return None
    ids = io.input(INPUT_IDS)
    if ids.rank != 2 or ids.dtype.kind not in "iu":
        return None
    mask = io.input(ATTENTION_MASK).dtype if ATTENTION_MASK in names else None
    # The vocabulary is never read from an output's width (a tagger's "logits" are its
    # classes): it comes from the model's declared info (ModelInfo), checked at intake.
    return TokenLayout(ids.dtype, mask, vocab_size)


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
    primary = _primary_output(engine.io, output_name)
    if top_k < 1:
        raise InvalidInputError(f"top_k must be >= 1, got {top_k}")
    layout = token_layout(engine.io)
    if layout is None:
        raw = _forward_generic(engine, feeds_per_request, policy)
        masks: list[np.ndarray | None] = [None] * len(raw)
    else:
        requests = [_token_rows(layout, feeds, policy) for feeds in feeds_per_request]
        flat = [row for rows in requests for row in rows]
        outputs = _forward_token_rows(engine, layout, flat, policy, pad_id)
        raw, masks, start = [], [], 0
        for rows in requests:
            mine = outputs[start : start + len(rows)]
            start += len(rows)
            raw.append({k: np.concatenate([o[k] for o in mine]) for k in engine.io.output_names})
            masks.append(np.stack([row.mask for row in rows]))
    if post is PostProcess.NONE:
        return raw
    return [post_process(r[primary], m, post, top_k) for r, m in zip(raw, masks, strict=True)]


def run_generate(
    engine: InferenceEngine,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int] | int,
    eos_id: int | None,
    max_seq_len: int,
    *,
    output_name: str | None = None,
    policy: BucketPolicy | None = None,
    pad_id: int = 0,
) -> list[GenerationResult]:
    """Greedy decoding without a KV cache: every step reruns each active sequence.

    All active rows run together (right-padded, logits read at each row's last
    real position); a row that finishes is dropped from the next step. A model
    exported with a KV cache (``past_key_values.*``) runs one prefill and one
    incremental step per token instead (:mod:`~graylane.engine_worker.kv_generate`).
    """
    from graylane.engine_worker import kv_generate  # kv_generate builds on this module

    if kv_generate.kv_cache_layout(engine.io) is not None:
        return kv_generate.generate_with_cache(
            engine, prompts, max_new_tokens, eos_id, max_seq_len, policy=policy, pad_id=pad_id
        )
    layout = token_layout(engine.io)
    if layout is None:
        raise InvalidInputError(
            f"generation needs a token model, inputs are {engine.io.input_names}"
        )
    logits_name = _primary_output(engine.io, output_name)
    limits = (
        [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    )
    if len(limits) != len(prompts):
        raise InvalidInputError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts")
    if max_seq_len < 1:
        raise InvalidInputError(f"max_seq_len must be >= 1, got {max_seq_len}")
    if policy is not None and policy.max_seq_len < max_seq_len:
        raise InvalidPolicyError(
            f"largest bucket {policy.max_seq_len} is below max_seq_len {max_seq_len}"
        )
    seqs: list[list[int]] = []
    for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):
        tokens = [int(t) for t in prompt]
        if not tokens:
            raise InvalidInputError(f"prompt {i} is empty")
        if len(tokens) > max_seq_len:
            raise InvalidInputError(f"prompt {i} has {len(tokens)} tokens, max is {max_seq_len}")
        if limit < 0:
            raise InvalidInputError(f"max_new_tokens for prompt {i} is negative")
        _check_ids(layout, np.asarray(tokens), f"prompt {i}")
        seqs.append(tokens)

    generated: list[list[int]] = [[] for _ in prompts]
    done: dict[int, FinishReason] = {}
    for i, tokens in enumerate(seqs):
        if limits[i] == 0:
            done[i] = FinishReason.LENGTH
        elif len(tokens) >= max_seq_len:
            done[i] = FinishReason.MAX_SEQ
    active = [i for i in range(len(seqs)) if i not in done]
    while active:
        rows = [_full_row(layout, seqs[i]) for i in active]
        outputs = _forward_token_rows(engine, layout, rows, policy, pad_id)
        still: list[int] = []
        for i, out in zip(active, outputs, strict=True):
            token = int(np.argmax(out[logits_name][0, len(seqs[i]) - 1]))
            if eos_id is not None and token == eos_id:
                done[i] = FinishReason.EOS
                continue
            seqs[i].append(token)
            generated[i].append(token)
            if len(generated[i]) >= limits[i]:
                done[i] = FinishReason.LENGTH
            elif len(seqs[i]) >= max_seq_len:
                done[i] = FinishReason.MAX_SEQ
            else:
                still.append(i)
        active = still
    return [GenerationResult(tuple(generated[i]), done[i]) for i in range(len(seqs))]


def validate_request(
    io: IOSignature,
    feeds: Mapping[str, np.ndarray],
    policy: BucketPolicy | None = None,
    vocab_size: int | None = None,
) -> None:
    """Raise :class:`InvalidInputError` if ``feeds`` cannot be served by ``io``.

    Lets a worker answer one bad request with an error before batching the rest;
    ``vocab_size`` is the declared input vocabulary, if known.
    """
    layout = token_layout(io, vocab_size)
    if layout is None:
        io.check_feeds(feeds)
    else:
        _token_rows(layout, feeds, policy)


# --- token models -------------------------------------------------------------------


def _full_row(layout: TokenLayout, tokens: Sequence[int]) -> _Row:
    ids = np.asarray(tokens, dtype=layout.id_dtype)
    return _Row(ids, np.ones(ids.shape, dtype=layout.mask_dtype or np.int64))


def _check_ids(layout: TokenLayout, ids: np.ndarray, what: str) -> None:
    if ids.size and (ids.min() < 0 or (layout.vocab_size and ids.max() >= layout.vocab_size)):
        raise InvalidInputError(f"{what}: token ids outside [0, {layout.vocab_size})")


def _token_rows(
    layout: TokenLayout, feeds: Mapping[str, np.ndarray], policy: BucketPolicy | None
) -> list[_Row]:
    allowed = {INPUT_IDS} if layout.mask_dtype is None else {INPUT_IDS, ATTENTION_MASK}
    if INPUT_IDS not in feeds or not set(feeds) <= allowed:
        raise InvalidInputError(f"token model takes {sorted(allowed)}, got {sorted(feeds)}")
    ids = np.asarray(feeds[INPUT_IDS])
    if ids.ndim != 2 or ids.dtype != layout.id_dtype or ids.shape[1] < 1:
        raise InvalidInputError(
            f"{INPUT_IDS} must be {layout.id_dtype} [rows, seq>=1], got {ids.dtype} {ids.shape}"
        )
    _check_ids(layout, ids, INPUT_IDS)
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
    return [_Row(ids[r], mask[r]) for r in range(ids.shape[0])]


def _forward_token_rows(
    engine: InferenceEngine,
    layout: TokenLayout,
    rows: Sequence[_Row],
    policy: BucketPolicy | None,
    pad_id: int,
) -> list[dict[str, np.ndarray]]:
    """Outputs per row, each with a batch axis of 1 and sequence axes cut to the row width."""
    results: list[dict[str, np.ndarray] | None] = [None] * len(rows)
    for width, members in _token_groups(layout, rows, policy):
        ids, _ = pad_token_batch([rows[i].ids for i in members], width, pad_id)
        feeds = {INPUT_IDS: ids.astype(layout.id_dtype, copy=False)}
        if layout.mask_dtype is not None:
            mask = np.zeros((len(members), width), dtype=layout.mask_dtype)
            for j, i in enumerate(members):
                mask[j, : rows[i].width] = rows[i].mask
            feeds[ATTENTION_MASK] = mask
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
    layout: TokenLayout, rows: Sequence[_Row], policy: BucketPolicy | None
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


def _primary_output(io: IOSignature, name: str | None) -> str:
    if name is None:
        if not io.outputs:
            raise InvalidInputError("engine has no outputs")
        return io.outputs[0].name
    if name not in io.output_names:
        raise InvalidInputError(f"unknown output {name!r}; outputs are {io.output_names}")
    return name
