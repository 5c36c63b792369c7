"""What a model does for a request: forward passes and generation, batched (pure).

Pure numpy over the engine protocol. Forward passes batch two ways:

- generic models: requests whose inputs have the same non-batch shapes are
  concatenated on axis 0 and run once; the rest run one by one;
- token models (inputs ``input_ids``, optionally ``attention_mask``, and inputs the
  worker derives itself: ``position_ids`` from the mask, and for a decoder exported
  with a KV cache an empty past and ``use_cache_branch`` false, which makes its
  forward pass a plain pass over the request's tokens): rows of different lengths
  are right-padded into one batch with an attention mask, and every output with a
  sequence axis is cut back to each request's own width, so a request gets what its
  unbatched run gives (a cached decoder's ``present.*`` outputs are its cache, not a
  result, and are dropped). A token model without an ``attention_mask`` input
  batches only rows of equal width (no padding).

Generation reruns every active sequence per step (:func:`run_generate`), unless
the model was exported with a KV cache: then one prefill and one incremental step
per token (:class:`KvDecodeLoop`), with rows joining and leaving the running batch
between steps as :class:`DecodeScheduler` decides.

Each generating row chooses its own tokens (:class:`~graylane.engine_worker.sampling.TokenSampler`:
greedy unless its :class:`~graylane.engine_worker.sampling.SamplingParams` say otherwise),
so rows with different sampling, seeds, EOS and stop ids share one batch. A row stops at
its EOS or one of its stop token ids (neither is kept), or once the text of its tokens
holds one of its stop strings: its result then carries the text cut before the stop
string, and the tokens that begin before the cut (a token straddling the cut is kept,
those wholly after it are dropped). Stop strings need ``decode`` (the tokenizer's).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TypeVar

import numpy as np

from graylane.engine.derived_inputs import (
    POSITION_IDS,
    USE_CACHE_BRANCH,
    derived_feeds,
    positions_from_mask,
)
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
from graylane.engine_worker.sampling import GREEDY, SamplingError, SamplingParams, TokenSampler
from graylane.errors import GraylaneError

__all__ = [
    "ATTENTION_MASK",
    "INPUT_IDS",
    "LOGITS",
    "POSITION_IDS",
    "USE_CACHE_BRANCH",
    "DecodeJoin",
    "DecodeScheduler",
    "FinishReason",
    "GenerationResult",
    "KvCacheLayout",
    "KvDecodeLoop",
    "LoopStats",
    "SchedulerError",
    "SchedulerLimits",
    "TokenLayout",
    "generate_with_cache",
    "generation_layout",
    "kv_bytes_per_token",
    "kv_cache_layout",
    "kv_tokens_for",
    "request_inputs",
    "run_forward",
    "run_generate",
    "should_compact",
    "token_layout",
    "validate_request",
]

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"

T = TypeVar("T")


class FinishReason(Enum):
    EOS = "eos"
    """The model produced ``eos_id`` (not included in the tokens)."""
    LENGTH = "length"
    """``max_new_tokens`` were generated."""
    MAX_SEQ = "max_seq"
    """Prompt plus generated tokens reached ``max_seq_len``."""
    STOP = "stop"
    """The model produced a stop token id (not included) or its text a stop string."""
    CANCELLED = "cancelled"
    """Stopped from outside (:meth:`KvDecodeLoop.cancel`) with the tokens so far."""


@dataclass(frozen=True, slots=True)
class GenerationResult:
    tokens: tuple[int, ...]
    """Generated tokens only (no prompt, no EOS or stop token id; a stop string's cut
    drops the tokens that begin after it)."""
    finished_reason: FinishReason
    text: str | None = None
    """Set when a stop string cut the text: the decoded text before the stop string."""


Decode = Callable[[Sequence[int]], str]
"""A tokenizer's ``decode``: generated tokens to text (stop strings are matched on it)."""


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """How a token model takes its inputs: id and mask dtypes, and the vocabulary if declared."""

    id_dtype: np.dtype[np.generic]
    mask_dtype: np.dtype[np.generic] | None
    vocab_size: int | None
    derived: tuple[str, ...] = ()
    """Inputs the worker fills in itself, never a request: ``position_ids`` (from the
    mask) and, for a decoder with past inputs, the past (empty for a forward pass) and
    ``use_cache_branch``."""


@dataclass(frozen=True, slots=True)
class _Row:
    ids: np.ndarray
    mask: np.ndarray

    @property
    def width(self) -> int:
        return int(self.ids.shape[0])


def token_layout(io: IOSignature, vocab_size: int | None = None) -> TokenLayout | None:
    """How a token model takes its inputs, or ``None`` for any other model.

    ``vocab_size`` is the declared input vocabulary (``ModelInfo``), if known. A
    decoder exported with a KV cache is a token model too: its forward pass runs
    with an empty past (:func:`kv_cache_layout`).
    """
    cached = kv_cache_layout(io)
    if cached is not None:
        return replace(cached.tokens, vocab_size=vocab_size)
    names = set(io.input_names)
    derived = (POSITION_IDS,) if POSITION_IDS in names else ()
    if names - set(derived) not in ({INPUT_IDS}, {INPUT_IDS, ATTENTION_MASK}):
        return None
    ids = io.input(INPUT_IDS)
    if ids.rank != 2 or ids.dtype.kind not in "iu":
        return None
    if derived and not _positions_input(io):
        return None
    mask = io.input(ATTENTION_MASK).dtype if ATTENTION_MASK in names else None
    # The vocabulary is never read from an output's width (a tagger's "logits" are its
    # classes): it comes from the model's declared info (ModelInfo), checked at intake.
    return TokenLayout(ids.dtype, mask, vocab_size, derived)


def _positions_input(io: IOSignature) -> bool:
    """Whether ``position_ids``, if the model takes it, is an integer [batch, seq] input."""
    spec = io.find_input(POSITION_IDS)
    return spec is None or (spec.rank == 2 and spec.dtype.kind in "iu")


def request_inputs(io: IOSignature) -> IOSignature:
    """The inputs a request may give: the model's, less those the worker derives itself."""
    layout = token_layout(io)
    if layout is None or not layout.derived:
        return io
    return IOSignature(
        inputs=tuple(s for s in io.inputs if s.name not in layout.derived), outputs=io.outputs
    )


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
        cache = kv_cache_layout(engine.io)
        outputs = _forward_token_rows(engine, layout, flat, policy, pad_id)
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


def run_generate(
    engine: InferenceEngine,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int] | int,
    eos_id: int | Sequence[int | None] | None,
    max_seq_len: int,
    *,
    output_name: str | None = None,
    policy: BucketPolicy | None = None,
    pad_id: int = 0,
    sampling: SamplingParams | Sequence[SamplingParams | None] | None = None,
    decode: Decode | None = None,
) -> list[GenerationResult]:
    """Decoding without a KV cache: every step reruns each active sequence.

    All active rows run together (right-padded, logits read at each row's last
    real position); a row that finishes is dropped from the next step. A model
    exported with a KV cache (``past_key_values.*``) runs one prefill and one
    incremental step per token instead (:func:`generate_with_cache`).

    ``eos_id`` and ``sampling`` are one for all prompts or one per prompt
    (``None``: no EOS; greedy). Stop strings need ``decode``.
    """
    if kv_cache_layout(engine.io) is not None:
        return generate_with_cache(
            engine,
            prompts,
            max_new_tokens,
            eos_id,
            max_seq_len,
            policy=policy,
            pad_id=pad_id,
            sampling=sampling,
            decode=decode,
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
    eos_ids = _per_prompt(eos_id, len(prompts), "eos ids")
    samplers = [
        _sampler(params, decode, f"prompt {i}")
        for i, params in enumerate(_per_prompt(sampling, len(prompts), "sampling params"))
    ]
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
    texts: dict[int, str] = {}
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
            token = samplers[i].choose(out[logits_name][0, len(seqs[i]) - 1])
            if eos_ids[i] is not None and token == eos_ids[i]:
                done[i] = FinishReason.EOS
                continue
            if samplers[i].stops_on(token):
                done[i] = FinishReason.STOP
                continue
            seqs[i].append(token)
            generated[i].append(token)
            cut = samplers[i].cut(generated[i])
            if cut is not None:
                done[i], texts[i] = FinishReason.STOP, cut.text
                del generated[i][cut.tokens :]
            elif len(generated[i]) >= limits[i]:
                done[i] = FinishReason.LENGTH
            elif len(seqs[i]) >= max_seq_len:
                done[i] = FinishReason.MAX_SEQ
            else:
                still.append(i)
        active = still
    return [GenerationResult(tuple(generated[i]), done[i], texts.get(i)) for i in range(len(seqs))]


def _per_prompt(value: T | Sequence[T | None] | None, n: int, what: str) -> list[T | None]:
    """One value for every prompt, or one per prompt."""
    if value is None or not isinstance(value, Sequence):
        return [value] * n
    if len(value) != n:
        raise InvalidInputError(f"{len(value)} {what} for {n} prompts")
    return list(value)


def _sampler(params: SamplingParams | None, decode: Decode | None, what: str) -> TokenSampler:
    try:
        return TokenSampler(params or GREEDY, decode)
    except SamplingError as exc:
        raise InvalidInputError(f"{what}: {exc}") from None


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


# --- iteration-level scheduling of a running decode batch -------------------------------
#
# Between two decode steps, finished sequences leave the batch and waiting ones join it
# (first in, first out) while there are free rows, so a short request never waits for
# the longest one in its batch. The scheduler only decides *who* runs; the decode loop
# keeps the caches, with row ``r`` of every cache tensor belonging to ``running[r]``.
# Row order is stable: leaving removes rows without reordering the others, and joiners
# are appended after the running rows in arrival order.


class SchedulerError(GraylaneError, ValueError):
    """A sequence id is unknown, duplicated, or a limit is not positive."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerLimits:
    """How much one step may hold."""

    max_batch_size: int
    """Rows in the running decode batch."""
    max_prefill_tokens: int | None = None
    """Prompt tokens admitted per step (at least one prompt always joins); ``None``: no cap."""
    max_kv_tokens: int | None = None
    """Cache positions the running rows may reserve together (each row reserves its prompt
    plus its ``max_new_tokens``; one row always runs); ``None``: no cap."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise SchedulerError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise SchedulerError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.max_kv_tokens is not None and self.max_kv_tokens < 1:
            raise SchedulerError(f"max_kv_tokens must be >= 1, got {self.max_kv_tokens}")


@dataclass(frozen=True, slots=True)
class DecodeJoin:
    """The sequences that join before the next decode step, in row order after the running ones."""

    joining: tuple[int, ...]
    first_row: int
    """Row of ``joining[0]`` once joined (the running batch's size before they join)."""


class DecodeScheduler:
    """Waiting queue and running rows of one decode loop."""

    def __init__(self, limits: SchedulerLimits) -> None:
        self.limits = limits
        self._waiting: deque[tuple[int, int]] = deque()  # (seq_id, prompt_len)
        self._running: list[int] = []
        self._known: set[int] = set()
        self._reserved: dict[int, int] = {}
        """Cache positions each known sequence may grow to (prompt + max new tokens)."""

    @property
    def running(self) -> tuple[int, ...]:
        """Sequence ids by row."""
        return tuple(self._running)

    @property
    def waiting(self) -> tuple[int, ...]:
        return tuple(seq_id for seq_id, _ in self._waiting)

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    @property
    def reserved_kv_tokens(self) -> int:
        """Cache positions the running rows reserve together."""
        return sum(self._reserved[s] for s in self._running)

    def submit(self, seq_id: int, prompt_len: int, reserve: int | None = None) -> None:
        """Queue a sequence; it joins at a later :meth:`admit`.

        ``reserve``: the cache positions it may grow to (default: its prompt).
        """
        if seq_id in self._known:
            raise SchedulerError(f"sequence {seq_id} was already submitted")
        if prompt_len < 1:
            raise SchedulerError(f"sequence {seq_id}: prompt must be non-empty")
        self._known.add(seq_id)
        self._reserved[seq_id] = max(prompt_len, reserve or 0)
        self._waiting.append((seq_id, prompt_len))

    def withdraw(self, seq_id: int) -> bool:
        """Remove a waiting sequence (it never ran); False if it is not waiting."""
        for entry in self._waiting:
            if entry[0] == seq_id:
                self._waiting.remove(entry)
                self._known.discard(seq_id)
                self._reserved.pop(seq_id, None)
                return True
        return False

    def admit(self) -> DecodeJoin:
        """Move waiting sequences into free rows; the caller prefills them next."""
        first_row = len(self._running)
        free = self.limits.max_batch_size - first_row
        budget = self.limits.max_prefill_tokens
        kv_budget = self.limits.max_kv_tokens
        kv = self.reserved_kv_tokens
        joining: list[int] = []
        tokens = 0
        while self._waiting and len(joining) < free:
            seq_id, length = self._waiting[0]
            if joining and budget is not None and tokens + length > budget:
                break
            reserve = self._reserved[seq_id]
            if kv_budget is not None and (self._running or joining) and kv + reserve > kv_budget:
                break
            self._waiting.popleft()
            joining.append(seq_id)
            tokens += length
            kv += reserve
        self._running.extend(joining)
        return DecodeJoin(tuple(joining), first_row)

    def leave(self, seq_ids: Iterable[int]) -> tuple[int, ...]:
        """Remove finished sequences; returns the rows that stay, in their old positions."""
        gone = set(seq_ids)
        unknown = gone - set(self._running)
        if unknown:
            raise SchedulerError(f"sequences {sorted(unknown)} are not running")
        kept = tuple(row for row, seq_id in enumerate(self._running) if seq_id not in gone)
        self._running = [self._running[row] for row in kept]
        self._known -= gone
        for seq_id in gone:
            self._reserved.pop(seq_id, None)
        return kept


def should_compact(width: int, lengths: Sequence[int], *, min_waste: int = 16) -> bool:
    """Whether a cache ``width`` columns wide should be repacked to its rows' real ``lengths``.

    Rows leave holes (padding, finished neighbours); repacking costs one copy of
    the cache, so do it once at least half the width and ``min_waste`` columns
    are holes in every row.
    """
    if not lengths:
        return width > 0
    waste = width - max(lengths)
    return waste >= min_waste and 2 * waste >= width


# --- generation with a KV cache -------------------------------------------------------
#
# For decoder models exported with past inputs and present outputs (the Hugging
# Face Optimum convention: ``input_ids``, ``attention_mask`` [batch, past + seq],
# ``past_key_values.{i}.key|value`` [batch, heads, past, head_dim] in; ``logits``,
# ``present.{i}.key|value`` out; optionally ``position_ids``). A sequence costs one
# prefill over its prompt, then one incremental step per new token. Every step runs
# all running sequences together; rows of the batch have different past lengths:
# the cache is right-padded and may have holes (prompt padding, columns added while
# a row waited), which the attention mask hides; positions follow the mask.

_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")
_KINDS = ("key", "value")


@dataclass(frozen=True, slots=True)
class KvCacheLayout:
    """How a decoder-with-past model takes its cache, read from its IO signature."""

    tokens: TokenLayout
    n_layers: int
    n_heads: int
    head_dim: int
    cache_dtype: np.dtype[np.generic]
    position_ids: bool
    """Whether the model takes ``position_ids`` [batch, seq] (else it derives them)."""
    cache_branch: bool = False
    """Whether the model takes :data:`USE_CACHE_BRANCH` (a merged decoder)."""

    @property
    def past_names(self) -> tuple[str, ...]:
        return tuple(f"past_key_values.{i}.{k}" for i in range(self.n_layers) for k in _KINDS)

    @property
    def present_names(self) -> tuple[str, ...]:
        return tuple(f"present.{i}.{k}" for i in range(self.n_layers) for k in _KINDS)


def kv_cache_layout(io: IOSignature) -> KvCacheLayout | None:
    """The cache layout of a decoder-with-past model, or ``None`` for any other model.

    Besides ``input_ids``, ``attention_mask`` and the past, the model may take
    ``position_ids`` and, as a merged decoder, :data:`USE_CACHE_BRANCH`. Heads and
    head size come from the past inputs' shapes: with grouped-query attention the
    cache has fewer heads than the attention.
    """
    names = set(io.input_names)
    if not {INPUT_IDS, ATTENTION_MASK} <= names:
        return None
    past = {m.group(1, 2): s for s in io.inputs if (m := _PAST.fullmatch(s.name))}
    if not past:
        return None
    n_layers = max(int(layer) for layer, _ in past) + 1
    expected = {(str(i), k) for i in range(n_layers) for k in _KINDS}
    optional = {POSITION_IDS, USE_CACHE_BRANCH}
    if set(past) != expected or names - {INPUT_IDS, ATTENTION_MASK, *optional} != {
        s.name for s in past.values()
    }:
        return None
    ids, mask = io.input(INPUT_IDS), io.input(ATTENTION_MASK)
    if ids.rank != 2 or ids.dtype.kind not in "iu" or mask.rank != 2:
        return None
    if not _positions_input(io):
        return None
    branch = io.find_input(USE_CACHE_BRANCH)
    if branch is not None and (branch.dtype != np.bool_ or branch.shape not in ((1,), ("1",))):
        return None
    specs = list(past.values())
    first = specs[0]
    if any(s.rank != 4 or s.dtype != first.dtype for s in specs) or first.dtype.kind != "f":
        return None
    heads, head_dim = first.shape[1], first.shape[3]
    if not isinstance(heads, int) or not isinstance(head_dim, int):
        return None
    if any(s.shape[1] != heads or s.shape[3] != head_dim for s in specs):
        return None
    outputs = set(io.output_names)
    presents = {f"present.{i}.{k}" for i in range(n_layers) for k in _KINDS}
    if LOGITS not in outputs or not presents <= outputs or io.output(LOGITS).rank != 3:
        return None
    layout = KvCacheLayout(
        tokens=TokenLayout(ids.dtype, mask.dtype, None),  # vocabulary: declared, not read here
        n_layers=n_layers,
        n_heads=heads,
        head_dim=head_dim,
        cache_dtype=first.dtype,
        position_ids=POSITION_IDS in names,
        cache_branch=branch is not None,
    )
    derived = tuple(s.name for s in io.inputs if s.name not in (INPUT_IDS, ATTENTION_MASK))
    return replace(layout, tokens=replace(layout.tokens, derived=derived))


def kv_bytes_per_token(layout: KvCacheLayout) -> int:
    """Cache bytes one position of one sequence holds: keys and values of every layer."""
    return 2 * layout.n_layers * layout.n_heads * layout.head_dim * layout.cache_dtype.itemsize


def kv_tokens_for(layout: KvCacheLayout, budget_mb: float) -> int:
    """Cache positions (summed over the running sequences) that ``budget_mb`` MiB holds.

    SmolLM2-135M (30 layers, 3 KV heads of 64, float32): 45 KiB a position, so 512 MiB
    hold 11,650 positions: 8 sequences of 1,456 tokens, not 8 of its 8,192-token context
    (2.9 GiB).
    """
    return max(1, int(budget_mb * (1 << 20)) // kv_bytes_per_token(layout))


def generation_layout(io: IOSignature) -> TokenLayout | None:
    """Token dtypes and vocabulary of a model that can generate: plain or with a cache.

    For request validation: ``token_layout`` alone refuses the cached form.
    """
    cached = kv_cache_layout(io)
    return cached.tokens if cached is not None else token_layout(io)


@dataclass(slots=True)
class LoopStats:
    """Engine calls and rows of a loop so far."""

    prefill_calls: int = 0
    decode_calls: int = 0
    decode_rows: int = 0
    """Sum over decode steps of the rows that ran (mean batch = decode_rows / decode_calls)."""
    compactions: int = 0


@dataclass(slots=True)
class _Sequence:
    tokens: list[int]
    limit: int
    eos_id: int | None
    generated: list[int] = field(default_factory=list)
    pending: int = -1
    """Newest token, produced but not yet in the cache."""
    sampler: TokenSampler = field(default_factory=TokenSampler)


class KvDecodeLoop:
    """A running decode batch over one engine: :meth:`submit`, then :meth:`step` until idle.

    Not thread-safe; one loop per engine, driven by one caller. New sequences may
    be submitted between steps; they join the running batch at the next step.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        *,
        max_batch_size: int,
        max_seq_len: int,
        pad_id: int = 0,
        max_prefill_tokens: int | None = None,
        max_kv_tokens: int | None = None,
        on_logits: Callable[[int, np.ndarray], None] | None = None,
        decode: Decode | None = None,
    ) -> None:
        """``on_logits(seq_id, logits)`` sees the vector each new token is chosen from;
        ``max_kv_tokens`` caps the cache positions the running rows reserve together;
        ``decode`` (the tokenizer's) lets sequences stop on stop strings."""
        layout = kv_cache_layout(engine.io)
        if layout is None:
            raise InvalidInputError(
                f"KV-cache generation needs past_key_values inputs, got {engine.io.input_names}"
            )
        if max_seq_len < 1:
            raise InvalidInputError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.engine = engine
        self.layout = layout
        self.max_seq_len = max_seq_len
        self.pad_id = pad_id
        self.scheduler = DecodeScheduler(
            SchedulerLimits(
                max_batch_size=max_batch_size,
                max_prefill_tokens=max_prefill_tokens,
                max_kv_tokens=max_kv_tokens,
            )
        )
        self.stats = LoopStats()
        self._on_logits = on_logits
        self._to_text = decode
        self._seqs: dict[int, _Sequence] = {}
        self._done_early: list[tuple[int, GenerationResult]] = []
        self._next_id = 0
        self._cache: dict[str, np.ndarray] = {}
        """Past name -> [rows, heads, width, head_dim]; row r is scheduler.running[r]."""
        self._mask = np.zeros((0, 0), dtype=layout.tokens.mask_dtype)

    @property
    def idle(self) -> bool:
        return self.scheduler.idle and not self._done_early

    def submit(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        eos_id: int | None = None,
        *,
        sampling: SamplingParams | None = None,
    ) -> int:
        """Queue a prompt; returns its sequence id. Raises :class:`InvalidInputError`.

        ``sampling``: how it chooses its tokens and where it stops (``None``: greedy).
        """
        tokens = [int(t) for t in prompt]
        if not tokens:
            raise InvalidInputError("prompt is empty")
        if len(tokens) > self.max_seq_len:
            raise InvalidInputError(f"prompt has {len(tokens)} tokens, max is {self.max_seq_len}")
        if max_new_tokens < 0:
            raise InvalidInputError("max_new_tokens is negative")
        vocab = self.layout.tokens.vocab_size
        if min(tokens) < 0 or (vocab and max(tokens) >= vocab):
            raise InvalidInputError(f"prompt: token ids outside [0, {vocab})")
        sampler = _sampler(sampling, self._to_text, "sampling")
        seq_id = self._next_id
        self._next_id += 1
        if max_new_tokens == 0:
            self._done_early.append((seq_id, GenerationResult((), FinishReason.LENGTH)))
        elif len(tokens) >= self.max_seq_len:
            self._done_early.append((seq_id, GenerationResult((), FinishReason.MAX_SEQ)))
        else:
            self._seqs[seq_id] = _Sequence(tokens, max_new_tokens, eos_id, sampler=sampler)
            reserve = min(self.max_seq_len, len(tokens) + max_new_tokens)
            self.scheduler.submit(seq_id, len(tokens), reserve)
        return seq_id

    def tokens_of(self, seq_id: int) -> tuple[int, ...]:
        """The tokens a running or waiting sequence generated so far (empty once finished)."""
        seq = self._seqs.get(seq_id)
        return () if seq is None else tuple(seq.generated)

    def cancel(self, seq_id: int) -> GenerationResult | None:
        """Stop a waiting or running sequence now, freeing its cache rows; its result
        (the tokens so far, :attr:`FinishReason.CANCELLED`), or None if it is not live."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            return None
        if not self.scheduler.withdraw(seq_id):
            kept = self.scheduler.leave([seq_id])
            self._keep_rows(np.asarray(kept, dtype=np.int64))
        del self._seqs[seq_id]
        return GenerationResult(tuple(seq.generated), FinishReason.CANCELLED)

    def step(self) -> list[tuple[int, GenerationResult]]:
        """Admit and prefill joiners, then one decode step; the sequences finished meanwhile."""
        finished = self.prefill_step()
        return finished + self.decode_step()

    def prefill_step(self) -> list[tuple[int, GenerationResult]]:
        """The first half of :meth:`step`: admit and prefill joiners (each gets its first
        token, so a streaming caller can publish it before the decode step)."""
        finished, self._done_early = self._done_early, []
        joining_step = self.scheduler.admit()
        if joining_step.joining:
            finished += self._prefill(joining_step.joining)
        return finished

    def decode_step(self) -> list[tuple[int, GenerationResult]]:
        """The second half of :meth:`step`: one token for every running row."""
        return self._decode() if self.scheduler.running else []

    def run(self) -> dict[int, GenerationResult]:
        """Step until idle; results by sequence id."""
        results: dict[int, GenerationResult] = {}
        while not self.idle:
            results.update(self.step())
        return results

    # --- engine calls -----------------------------------------------------------------

    def _prefill(self, joining: Sequence[int]) -> list[tuple[int, GenerationResult]]:
        seqs = [self._seqs[s] for s in joining]
        width = max(len(s.tokens) for s in seqs)
        ids = np.full((len(seqs), width), self.pad_id, dtype=self.layout.tokens.id_dtype)
        mask = np.zeros((len(seqs), width), dtype=self._mask.dtype)
        for row, seq in enumerate(seqs):
            ids[row, : len(seq.tokens)] = seq.tokens
            mask[row, : len(seq.tokens)] = 1
        empty = np.zeros(
            (len(seqs), self.layout.n_heads, 0, self.layout.head_dim), self.layout.cache_dtype
        )
        outputs = self._run(ids, mask, dict.fromkeys(self.layout.past_names, empty))
        self.stats.prefill_calls += 1
        self._append_rows(outputs, mask)
        last = [outputs[LOGITS][row, len(seq.tokens) - 1] for row, seq in enumerate(seqs)]
        return self._advance(list(joining), last)

    def _decode(self) -> list[tuple[int, GenerationResult]]:
        running = list(self.scheduler.running)
        ids = np.array(
            [[self._seqs[s].pending] for s in running], dtype=self.layout.tokens.id_dtype
        )
        mask = np.concatenate([self._mask, np.ones((len(running), 1), self._mask.dtype)], axis=1)
        outputs = self._run(ids, mask, self._cache)
        self.stats.decode_calls += 1
        self.stats.decode_rows += len(running)
        self._cache = {
            past: outputs[present]
            for past, present in zip(self.layout.past_names, self.layout.present_names, strict=True)
        }
        self._mask = mask
        return self._advance(running, list(outputs[LOGITS][:, -1]))

    def _run(
        self, ids: np.ndarray, mask: np.ndarray, past: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        feeds = {INPUT_IDS: ids, ATTENTION_MASK: mask, **past}
        if self.layout.position_ids:
            dtype = self.engine.io.input(POSITION_IDS).dtype
            feeds[POSITION_IDS] = positions_from_mask(mask, ids.shape[1], dtype)
        if self.layout.cache_branch:
            # A merged decoder's first pass (an empty past) runs its no-past branch.
            width = next(iter(past.values())).shape[2] if past else 0
            feeds[USE_CACHE_BRANCH] = np.array([width > 0])
        return self.engine.run(feeds)

    # --- bookkeeping ------------------------------------------------------------------

    def _advance(
        self, seq_ids: Sequence[int], logits: Sequence[np.ndarray]
    ) -> list[tuple[int, GenerationResult]]:
        """Each row's token by its sampler (the rules of :func:`run_generate`); drop finished."""
        finished: list[tuple[int, GenerationResult]] = []
        for seq_id, row in zip(seq_ids, logits, strict=True):
            if self._on_logits is not None:
                self._on_logits(seq_id, row)
            seq = self._seqs[seq_id]
            token = seq.sampler.choose(row)
            reason: FinishReason | None = None
            text: str | None = None
            if seq.eos_id is not None and token == seq.eos_id:
                reason = FinishReason.EOS
            elif seq.sampler.stops_on(token):
                reason = FinishReason.STOP
            else:
                seq.tokens.append(token)
                seq.generated.append(token)
                seq.pending = token
                cut = seq.sampler.cut(seq.generated)
                if cut is not None:
                    reason, text = FinishReason.STOP, cut.text
                    del seq.generated[cut.tokens :]
                elif len(seq.generated) >= seq.limit:
                    reason = FinishReason.LENGTH
                elif len(seq.tokens) >= self.max_seq_len:
                    reason = FinishReason.MAX_SEQ
            if reason is not None:
                finished.append((seq_id, GenerationResult(tuple(seq.generated), reason, text)))
                del self._seqs[seq_id]
        if finished:
            kept = self.scheduler.leave(s for s, _ in finished)
            self._keep_rows(np.asarray(kept, dtype=np.int64))
        self._maybe_compact()
        return finished

    def _append_rows(self, outputs: dict[str, np.ndarray], mask: np.ndarray) -> None:
        """Join prefilled rows below the running ones, padding the narrower side with holes."""
        width = max(self._mask.shape[1], mask.shape[1])
        fresh = {
            past: outputs[present]
            for past, present in zip(self.layout.past_names, self.layout.present_names, strict=True)
        }
        if not len(self._mask):
            self._cache, self._mask = fresh, mask
            return
        self._cache = {
            name: np.concatenate([_pad_width(self._cache[name], width), _pad_width(new, width)])
            for name, new in fresh.items()
        }
        self._mask = np.concatenate([_pad_width(self._mask, width), _pad_width(mask, width)])

    def _keep_rows(self, kept: np.ndarray) -> None:
        if not len(kept):
            self._cache, self._mask = {}, np.zeros((0, 0), dtype=self._mask.dtype)
            return
        self._cache = {name: arr[kept] for name, arr in self._cache.items()}
        self._mask = self._mask[kept]

    def _maybe_compact(self) -> None:
        """Repack the cache to the rows' real lengths once holes dominate it."""
        if not len(self._mask):
            return
        lengths = (self._mask != 0).sum(axis=1)
        if not should_compact(self._mask.shape[1], [int(n) for n in lengths]):
            return
        width = int(lengths.max())
        # Stable sort puts each row's real columns first, in order.
        order = np.argsort(self._mask == 0, axis=1, kind="stable")[:, :width]
        self._cache = {
            name: np.take_along_axis(arr, order[:, None, :, None], axis=2)
            for name, arr in self._cache.items()
        }
        self._mask = (np.arange(width)[None, :] < lengths[:, None]).astype(self._mask.dtype)
        self.stats.compactions += 1


def _pad_width(arr: np.ndarray, width: int) -> np.ndarray:
    """Zero-pad axis 2 of a cache tensor (axis 1 of a mask) on the right to ``width``."""
    axis = 1 if arr.ndim == 2 else 2
    missing = width - arr.shape[axis]
    if missing <= 0:
        return arr
    pad = [(0, 0)] * arr.ndim
    pad[axis] = (0, missing)
    return np.pad(arr, pad)


def generate_with_cache(
    engine: InferenceEngine,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int] | int,
    eos_id: int | Sequence[int | None] | None,
    max_seq_len: int,
    *,
    policy: BucketPolicy | None = None,
    pad_id: int = 0,
    max_batch_size: int | None = None,
    sampling: SamplingParams | Sequence[SamplingParams | None] | None = None,
    decode: Decode | None = None,
) -> list[GenerationResult]:
    """Drop-in for :func:`run_generate` on a decoder-with-past model.

    Same arguments, same results (greedy: token for token; seeded: the same draws
    from the same logits); the running batch holds at most ``max_batch_size`` rows
    (default: the policy's, else all prompts).
    """
    limits = (
        [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    )
    if len(limits) != len(prompts):
        raise InvalidInputError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts")
    eos_ids = _per_prompt(eos_id, len(prompts), "eos ids")
    params = _per_prompt(sampling, len(prompts), "sampling params")
    if not prompts:
        return []
    rows = max_batch_size or (policy.max_batch_size if policy else len(prompts))
    loop = KvDecodeLoop(
        engine, max_batch_size=rows, max_seq_len=max_seq_len, pad_id=pad_id, decode=decode
    )
    ids = []
    for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):
        try:
            ids.append(loop.submit(prompt, limit, eos_ids[i], sampling=params[i]))
        except InvalidInputError as exc:
            raise InvalidInputError(f"prompt {i}: {exc}") from None
    results = loop.run()
    return [results[i] for i in ids]
