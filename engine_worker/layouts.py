"""How a model takes its inputs: token models, and decoders exported with a KV cache.

Read from an engine's IO signature (pure). A token model takes ``input_ids``,
optionally ``attention_mask``, and inputs the worker derives itself (``position_ids``
from the mask; for a decoder with a KV cache an empty past and ``use_cache_branch``):
:class:`TokenLayout`. A decoder with past inputs and present outputs (the Hugging Face
Optimum convention) is a token model too, and :class:`KvCacheLayout` says how it takes
its cache: layers, heads, head size and dtype, read from the past inputs' shapes.
Any other model has neither layout: its inputs are tensors checked as declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from graylane.engine.derived_inputs import POSITION_IDS, USE_CACHE_BRANCH
from graylane.engine.signature import IOSignature

__all__ = [
    "ATTENTION_MASK",
    "INPUT_IDS",
    "LOGITS",
    "KvCacheLayout",
    "TokenLayout",
    "generation_layout",
    "kv_bytes_per_token",
    "kv_cache_layout",
    "kv_tokens_for",
    "request_inputs",
    "token_layout",
]

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"


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
