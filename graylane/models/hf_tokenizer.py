"""A model's own tokenizer: a Hugging Face ``tokenizer.json`` read with the ``tokenizers`` library.

Models exported from transformers (Optimum) ship one beside their ONNX file; a build
spec that names it copies it into every artifact and records it with the model's
info (:class:`~graylane.artifacts.model_info.TokenizerFile`: file name, sha256, the
model's end-of-sequence id), so the worker finds it at load (:func:`find_tokenizer`)
after the manifest check has verified its digest. A completion's text is encoded with
the tokenizer's own special-token rules, a chat's rendered prompt without them (the
template placed them: :meth:`HfTokenizer.encode_rendered`), and text is decoded without
special tokens. The demo
GPT keeps its byte-level vocabulary (``DemoByteTokenizer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from graylane.artifacts.model_info import TOKENIZER_FILE, ModelInfo, eos_from_hf_configs
from graylane.errors import GraylaneError

__all__ = ["HfTokenizer", "TokenizerLoadError", "find_tokenizer", "tokenizer_beside"]


class TokenizerLoadError(GraylaneError):
    """A ``tokenizer.json`` cannot be read."""


class HfTokenizer:
    """Text to token ids and back with a ``tokenizer.json``; knows the model's EOS id."""

    def __init__(self, path: Path, eos_id: int | None = None) -> None:
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own exception types
            raise TokenizerLoadError(f"cannot read tokenizer {path}: {exc}") from exc
        self.path = path
        self._eos_id = eos_id

    @classmethod
    def beside(cls, path: Path) -> HfTokenizer:
        """The tokenizer at ``path``, its EOS id from the transformers configs beside it."""
        return cls(path, eos_from_hf_configs(path.parent, tokenizer=path))

    @property
    def eos_id(self) -> int | None:
        """The token that ends a generation (``None``: unknown, generation runs to its limit)."""
        return self._eos_id

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> tuple[int, ...]:
        """A completion's prompt: the tokenizer's own special tokens added (a BOS, if it
        adds one), as transformers' ``tokenizer(text)`` does."""
        return tuple(self._tokenizer.encode(text).ids)

    def encode_rendered(self, text: str) -> tuple[int, ...]:
        """A prompt a chat template rendered: no special tokens added, since the template
        placed them (transformers' ``apply_chat_template`` encodes so). Adding them again
        would open the prompt with a second BOS."""
        return tuple(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._tokenizer.decode([int(t) for t in tokens], skip_special_tokens=True))

    def __repr__(self) -> str:
        return f"HfTokenizer({str(self.path)!r}, eos_id={self._eos_id})"


def find_tokenizer(folder: Path, info: ModelInfo | None) -> HfTokenizer | None:
    """The tokenizer an artifact's info records, read from its folder; ``None`` if it has none."""
    if info is None or info.tokenizer is None:
        return None
    return HfTokenizer(folder / info.tokenizer.file, info.tokenizer.eos_token_id)


def tokenizer_beside(model: Path) -> HfTokenizer | None:
    """The ``tokenizer.json`` next to a model file (an Optimum export folder), if any."""
    path = model.parent / TOKENIZER_FILE
    return HfTokenizer.beside(path) if path.is_file() else None
