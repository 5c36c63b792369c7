"""A GGUF file's tokenizer as a Hugging Face ``tokenizer.json`` (no transformers, no torch).

A GGUF carries its tokenizer as metadata: ``tokenizer.ggml.model`` (``gpt2``: byte-level
BPE), the ``tokens`` with their ``token_type`` (1 normal, 3 control, 4 user-defined),
the BPE ``merges``, the pre-tokenizer's name (``tokenizer.ggml.pre``, llama.cpp's
``LLAMA_VOCAB_PRE_TYPE_*``), the special ids and whether a BOS is added
(``add_bos_token``). :func:`tokenizer_from_gguf` rebuilds the tokenizer the model was
trained with from it:

- the BPE model over the tokens and merges, byte-level (GPT-2's byte-to-unicode map);
- the pre-tokenizer llama.cpp applies for that name, written as ``tokenizers``
  pre-tokenizers (:data:`PRE_TOKENIZERS`): e.g. ``smollm`` (StarCoder's) splits every
  digit apart, then GPT-2's regex;
- control and user-defined tokens as added tokens (control ones special, so they are
  matched whole in text and skipped when decoding);
- a BOS prepended by the post-processor only where ``add_bos_token`` says so.

A tokenizer kind or pre-tokenizer it does not know is refused with
:class:`GgufTokenizerError` naming it, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graylane.errors import GraylaneError

__all__ = [
    "PRE_TOKENIZERS",
    "GgufTokenizerError",
    "GgufVocab",
    "tokenizer_from_gguf",
]

_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRE_TOKENIZERS: Mapping[str, str] = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "smollm": "digits+gpt2",
    "starcoder": "digits+gpt2",
    "refact": "digits+gpt2",
    "llama3": "llama3",
    "llama-bpe": "llama3",
}
"""llama.cpp's pre-tokenizer names (``tokenizer.ggml.pre``) this module rebuilds, and how:
``gpt2`` is GPT-2's regex; ``digits+gpt2`` splits digits one by one first (llama.cpp's
``\\p{N}`` expression, StarCoder/SmolLM); ``llama3`` is Llama 3's regex."""

_CONTROL = 3
_USER_DEFINED = 4


class GgufTokenizerError(GraylaneError, ValueError):
    """The GGUF's tokenizer metadata names a kind this importer does not rebuild."""


@dataclass(frozen=True, kw_only=True)
class GgufVocab:
    """The tokenizer metadata of a GGUF file (``tokenizer.ggml.*``)."""

    model: str
    pre: str
    tokens: Sequence[str]
    token_types: Sequence[int]
    merges: Sequence[str]
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> GgufVocab:
        """From decoded GGUF key/values (``tokenizer.ggml.*``)."""

        def get(key: str, default: Any = None) -> Any:
            return fields.get(f"tokenizer.ggml.{key}", default)

        model = get("model")
        if model is None:
            raise GgufTokenizerError("the GGUF has no tokenizer (no tokenizer.ggml.model)")
        tokens = list(get("tokens", []))
        return cls(
            model=str(model),
            pre=str(get("pre", "default")),
            tokens=tokens,
            token_types=list(get("token_type", [1] * len(tokens))),
            merges=list(get("merges", [])),
            bos_id=_opt_int(get("bos_token_id")),
            eos_id=_opt_int(get("eos_token_id")),
            unk_id=_opt_int(get("unknown_token_id")),
            pad_id=_opt_int(get("padding_token_id")),
            add_bos=bool(get("add_bos_token", False)),
            add_eos=bool(get("add_eos_token", False)),
        )

    def token(self, token_id: int | None) -> str | None:
        """The text of a token id (``None`` for none or out of range)."""
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def tokenizer_from_gguf(vocab: GgufVocab) -> Any:
    """A ``tokenizers.Tokenizer`` equal to the one the GGUF describes (see the module doc)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    if vocab.model != "gpt2":
        raise GgufTokenizerError(
            f"tokenizer.ggml.model {vocab.model!r} is not supported: only byte-level BPE "
            "('gpt2', as SmolLM, Llama 3, Qwen use) is rebuilt"
        )
    kind = PRE_TOKENIZERS.get(vocab.pre)
    if kind is None:
        raise GgufTokenizerError(
            f"tokenizer.ggml.pre {vocab.pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}"
        )
    if len(vocab.token_types) != len(vocab.tokens):
        raise GgufTokenizerError("tokenizer.ggml.token_type and tokens differ in length")
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    pairs = [m.split(" ", 1) for m in vocab.merges]
    if any(len(p) != 2 for p in pairs):
        raise GgufTokenizerError("tokenizer.ggml.merges: every merge must be two tokens")
    merges = [(p[0], p[1]) for p in pairs]
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=kind != "llama3")
    if kind == "gpt2":
        tokenizer.pre_tokenizer = byte_level
    elif kind == "digits+gpt2":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        split = pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated", invert=False)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    added = [
        AddedToken(token, special=kind_ == _CONTROL, normalized=False)
        for token, kind_ in zip(vocab.tokens, vocab.token_types, strict=True)
        if kind_ in (_CONTROL, _USER_DEFINED)
    ]
    tokenizer.add_tokens(added)
    tokenizer.post_processor = _post_processor(vocab, processors)
    return tokenizer


def _post_processor(vocab: GgufVocab, processors: Any) -> Any:
    """ByteLevel offsets, and BOS/EOS where the GGUF adds them to every encoding."""
    byte_level = processors.ByteLevel(trim_offsets=False)
    bos = vocab.token(vocab.bos_id) if vocab.add_bos else None
    eos = vocab.token(vocab.eos_id) if vocab.add_eos else None
    if bos is None and eos is None:
        return byte_level
    head = f"{bos}:0 " if bos else ""
    tail = f" {eos}:0" if eos else ""
    special = [(t, i) for t, i in ((bos, vocab.bos_id), (eos, vocab.eos_id)) if t is not None]
    template = processors.TemplateProcessing(
        single=f"{head}$A:0{tail}",
        pair=f"{head}$A:0{tail} {head}$B:1{tail}".strip(),
        special_tokens=special,
    )
    return processors.Sequence([byte_level, template])
