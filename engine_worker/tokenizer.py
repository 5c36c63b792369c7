"""Text in and out of a token model, only where the model says how.

A result carries ``text`` only when its model version has a tokenizer: given in
:class:`~graylane.engine_worker.config.WorkerConfig`, or recognised from the
model's own metadata (the demo GPT records itself in ``metadata_props``).
Without one, results carry token ids only, and a ``prompt`` falls back to the
request contract's byte-level ids (``graylane.v1.InferenceRequest.prompt``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from graylane.engine.protocol import InferenceEngine
from graylane.models.demo_gpt import META_PREFIX, decode_tokens, encode_text

__all__ = ["DemoByteTokenizer", "Tokenizer", "detect_tokenizer", "tokenizer_from_metadata"]


class Tokenizer(Protocol):
    def encode(self, text: str) -> tuple[int, ...]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


class DemoByteTokenizer:
    """The demo GPT's vocabulary: UTF-8 bytes plus BOS/EOS (skipped when decoding)."""

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(encode_text(text))

    def decode(self, tokens: Sequence[int]) -> str:
        return decode_tokens(tokens)

    def __repr__(self) -> str:
        return "DemoByteTokenizer()"


@runtime_checkable
class _HasMetadata(Protocol):
    @property
    def metadata(self) -> Mapping[str, str]: ...


def tokenizer_from_metadata(metadata: Mapping[str, str]) -> Tokenizer | None:
    """The tokenizer a model's ``metadata_props`` names, if any."""
    if f"{META_PREFIX}vocab_size" in metadata:
        return DemoByteTokenizer()
    return None


def detect_tokenizer(engines: Iterable[InferenceEngine]) -> Tokenizer | None:
    """The first tokenizer found in the metadata of engines that expose it."""
    for engine in engines:
        if isinstance(engine, _HasMetadata):
            found = tokenizer_from_metadata(engine.metadata)
            if found is not None:
                return found
    return None
