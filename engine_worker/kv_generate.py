"""Greedy generation with a KV cache and iteration-level batching.

For decoder models exported with past inputs and present outputs (the Hugging
Face Optimum convention: ``input_ids``, ``attention_mask`` [batch, past + seq],
``past_key_values.{i}.key|value`` [batch, heads, past, head_dim] in; ``logits``,
``present.{i}.key|value`` out; optionally ``position_ids``). A sequence costs
one prefill over its prompt, then one incremental step per new token.

Every step runs all running sequences together: each feeds its newest token
and gets its next one. Sequences leave the batch as soon as they finish and
waiting ones join (prefilled first) between steps; :mod:`decode_scheduler`
decides who. Rows of the batch have different past lengths: the cache is
right-padded and may have holes (prompt padding, columns added while a row
waited), which the attention mask hides; positions follow the mask.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from graylane.engine.errors import InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import IOSignature
from graylane.engine_worker.batching import BucketPolicy
from graylane.engine_worker.decode_scheduler import (
    DecodeScheduler,
    SchedulerLimits,
    should_compact,
)
from graylane.engine_worker.tasks import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    FinishReason,
    GenerationResult,
    TokenLayout,
    token_layout,
)

__all__ = [
    "POSITION_IDS",
    "KvCacheLayout",
    "KvDecodeLoop",
    "LoopStats",
    "generate_with_cache",
    "generation_layout",
    "kv_cache_layout",
]

POSITION_IDS = "position_ids"
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

    @property
    def past_names(self) -> tuple[str, ...]:
        return tuple(f"past_key_values.{i}.{k}" for i in range(self.n_layers) for k in _KINDS)

    @property
    def present_names(self) -> tuple[str, ...]:
        return tuple(f"present.{i}.{k}" for i in range(self.n_layers) for k in _KINDS)


def kv_cache_layout(io: IOSignature) -> KvCacheLayout | None:
    """The cache layout of a decoder-with-past model, or ``None`` for any other model."""
    names = set(io.input_names)
    if not {INPUT_IDS, ATTENTION_MASK} <= names:
        return None
    past = {m.group(1, 2): s for s in io.inputs if (m := _PAST.fullmatch(s.name))}
    if not past:
        return None
    n_layers = max(int(layer) for layer, _ in past) + 1
    expected = {(str(i), k) for i in range(n_layers) for k in _KINDS}
    if set(past) != expected or names - {INPUT_IDS, ATTENTION_MASK, POSITION_IDS} != {
        s.name for s in past.values()
    }:
        return None
    ids, mask = io.input(INPUT_IDS), io.input(ATTENTION_MASK)
    if ids.rank != 2 or ids.dtype.kind not in "iu" or mask.rank != 2:
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
    return KvCacheLayout(
        tokens=TokenLayout(ids.dtype, mask.dtype, None),  # vocabulary: declared, not read here
        n_layers=n_layers,
        n_heads=heads,
        head_dim=head_dim,
        cache_dtype=first.dtype,
        position_ids=POSITION_IDS in names,
    )


def generation_layout(io: IOSignature) -> TokenLayout | None:
    """Token dtypes and vocabulary of a model that can generate: plain or with a cache.

    For request validation: ``tasks.token_layout`` alone refuses the cached form.
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
        on_logits: Callable[[int, np.ndarray], None] | None = None,
    ) -> None:
        """``on_logits(seq_id, logits)`` sees the vector each new token is chosen from."""
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
            SchedulerLimits(max_batch_size=max_batch_size, max_prefill_tokens=max_prefill_tokens)
        )
        self.stats = LoopStats()
        self._on_logits = on_logits
        self._seqs: dict[int, _Sequence] = {}
        self._done_early: list[tuple[int, GenerationResult]] = []
        self._next_id = 0
        self._cache: dict[str, np.ndarray] = {}
        """Past name -> [rows, heads, width, head_dim]; row r is scheduler.running[r]."""
        self._mask = np.zeros((0, 0), dtype=layout.tokens.mask_dtype)

    @property
    def idle(self) -> bool:
        return self.scheduler.idle and not self._done_early

    def submit(self, prompt: Sequence[int], max_new_tokens: int, eos_id: int | None = None) -> int:
        """Queue a prompt; returns its sequence id. Raises :class:`InvalidInputError`."""
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
        seq_id = self._next_id
        self._next_id += 1
        if max_new_tokens == 0:
            self._done_early.append((seq_id, GenerationResult((), FinishReason.LENGTH)))
        elif len(tokens) >= self.max_seq_len:
            self._done_early.append((seq_id, GenerationResult((), FinishReason.MAX_SEQ)))
        else:
            self._seqs[seq_id] = _Sequence(tokens, max_new_tokens, eos_id)
            self.scheduler.submit(seq_id, len(tokens))
        return seq_id

    def step(self) -> list[tuple[int, GenerationResult]]:
        """Admit and prefill joiners, then one decode step; the sequences finished meanwhile."""
        finished, self._done_early = self._done_early, []
        admission = self.scheduler.admit()
        if admission.joining:
            finished += self._prefill(admission.joining)
        if self.scheduler.running:
            finished += self._decode()
        return finished

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
            positions = np.cumsum(mask, axis=1, dtype=np.int64)[:, -ids.shape[1] :] - 1
            dtype = self.engine.io.input(POSITION_IDS).dtype
            feeds[POSITION_IDS] = np.maximum(positions, 0).astype(dtype)
        return self.engine.run(feeds)

    # --- bookkeeping ------------------------------------------------------------------

    def _advance(
        self, seq_ids: Sequence[int], logits: Sequence[np.ndarray]
    ) -> list[tuple[int, GenerationResult]]:
        """Each row's greedy token (the rules of ``tasks.run_generate``); drop finished rows."""
        finished: list[tuple[int, GenerationResult]] = []
        for seq_id, row in zip(seq_ids, logits, strict=True):
            if self._on_logits is not None:
                self._on_logits(seq_id, row)
            token = int(np.argmax(row))
            seq = self._seqs[seq_id]
            reason: FinishReason | None = None
            if seq.eos_id is not None and token == seq.eos_id:
                reason = FinishReason.EOS
            else:
                seq.tokens.append(token)
                seq.generated.append(token)
                seq.pending = token
                if len(seq.generated) >= seq.limit:
                    reason = FinishReason.LENGTH
                elif len(seq.tokens) >= self.max_seq_len:
                    reason = FinishReason.MAX_SEQ
            if reason is not None:
                finished.append((seq_id, GenerationResult(tuple(seq.generated), reason)))
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
    eos_id: int | None,
    max_seq_len: int,
    *,
    policy: BucketPolicy | None = None,
    pad_id: int = 0,
    max_batch_size: int | None = None,
) -> list[GenerationResult]:
    """Drop-in for ``tasks.run_generate`` on a decoder-with-past model.

    Same arguments, same results (greedy, token for token); the running batch
    holds at most ``max_batch_size`` rows (default: the policy's, else all prompts).
    """
    limits = (
        [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    )
    if len(limits) != len(prompts):
        raise InvalidInputError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts")
    if not prompts:
        return []
    rows = max_batch_size or (policy.max_batch_size if policy else len(prompts))
    loop = KvDecodeLoop(engine, max_batch_size=rows, max_seq_len=max_seq_len, pad_id=pad_id)
    ids = []
    for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):
        try:
            ids.append(loop.submit(prompt, limit, eos_id))
        except InvalidInputError as exc:
            raise InvalidInputError(f"prompt {i}: {exc}") from None
    results = loop.run()
    return [results[i] for i in ids]
