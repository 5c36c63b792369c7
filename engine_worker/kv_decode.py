"""Generation over a KV cache: one prefill per prompt, then one step per token.

:class:`KvDecodeLoop` is a running decode batch over one engine whose model was exported
with past inputs and present outputs (:class:`~graylane.engine_worker.layouts.KvCacheLayout`):
a sequence costs one prefill over its prompt, then one incremental step per new token.
Every step runs all running sequences together; rows joining and leaving between steps
as the :class:`~graylane.engine_worker.logic.scheduler.DecodeScheduler` decides. Rows of
the batch have different past lengths: the cache is right-padded and may have holes
(prompt padding, columns added while a row waited), which the attention mask hides;
positions follow the mask; the cache is repacked once holes dominate it
(:func:`should_compact`).

Each generating row chooses its own tokens
(:class:`~graylane.engine_worker.logic.sampling.TokenSampler`: greedy unless its
:class:`~graylane.engine_worker.logic.sampling.SamplingParams` say otherwise), so rows
with different sampling, seeds, EOS and stop ids share one batch. A row stops at
its EOS or one of its stop token ids (neither is kept), or once the text of its tokens
holds one of its stop strings: its result (:class:`GenerationResult`) then carries the
text cut before the stop string, and the tokens that begin before the cut (a token
straddling the cut is kept, those wholly after it are dropped). Stop strings need
``decode`` (the tokenizer's). Per-batch generation without a cache follows the same
rules (:mod:`~graylane.engine_worker.batch_generation`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

import numpy as np

from graylane.engine.derived_inputs import POSITION_IDS, USE_CACHE_BRANCH, positions_from_mask
from graylane.engine.errors import InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.layouts import ATTENTION_MASK, INPUT_IDS, LOGITS, kv_cache_layout
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.logic.sampling import (
    GREEDY,
    SamplingError,
    SamplingParams,
    TokenSampler,
)
from graylane.engine_worker.logic.scheduler import DecodeScheduler, SchedulerLimits

__all__ = [
    "Decode",
    "FinishReason",
    "GenerationResult",
    "KvDecodeLoop",
    "LoopStats",
    "generate_with_cache",
    "per_prompt",
    "sampler_for",
    "should_compact",
]

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


def per_prompt(value: T | Sequence[T | None] | None, n: int, what: str) -> list[T | None]:
    """One value for every prompt, or one per prompt."""
    if value is None or not isinstance(value, Sequence):
        return [value] * n
    if len(value) != n:
        raise InvalidInputError(f"{len(value)} {what} for {n} prompts")
    return list(value)


def sampler_for(params: SamplingParams | None, decode: Decode | None, what: str) -> TokenSampler:
    try:
        return TokenSampler(params or GREEDY, decode)
    except SamplingError as exc:
        raise InvalidInputError(f"{what}: {exc}") from None


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
        sampler = sampler_for(sampling, self._to_text, "sampling")
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
    eos_ids = per_prompt(eos_id, len(prompts), "eos ids")
    params = per_prompt(sampling, len(prompts), "sampling params")
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
