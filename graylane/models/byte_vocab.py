"""The byte-level vocabulary of the demo GPT: UTF-8 bytes, then BOS and EOS (pure).

Shared by the demo generator (which records it in the model's metadata) and by
the worker's tokenizer (which recognises that metadata), so that serving a demo
model never imports the code that writes one.
"""

from __future__ import annotations

from collections.abc import Iterable

from graylane.errors import GraylaneError

__all__ = [
    "BOS_ID",
    "BYTE_VOCAB",
    "EOS_ID",
    "META_PREFIX",
    "PAD_ID",
    "SPECIAL_IDS",
    "VOCAB_SIZE",
    "DemoModelError",
    "decode_tokens",
    "encode_text",
]

BYTE_VOCAB = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = EOS_ID
"""Padding id; any id works because padded keys are masked, EOS is the usual choice."""
VOCAB_SIZE = 258
SPECIAL_IDS = frozenset({BOS_ID, EOS_ID})
META_PREFIX = "graylane.demo."
"""Prefix of the demo model's ``metadata_props`` keys."""


class DemoModelError(GraylaneError, ValueError):
    """A demo model could not be configured or its metadata could not be read."""


def encode_text(text: str, *, add_bos: bool = False) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids, optionally after ``BOS_ID``."""
    ids = list(text.encode("utf-8"))
    return [BOS_ID, *ids] if add_bos else ids


def decode_tokens(tokens: Iterable[int]) -> str:
    """Text of byte tokens; special ids are skipped, broken UTF-8 is replaced."""
    data = bytearray()
    for t in tokens:
        t = int(t)
        if 0 <= t < BYTE_VOCAB:
            data.append(t)
        elif t not in SPECIAL_IDS:
            raise DemoModelError(f"token id {t} is outside the demo vocabulary")
    return data.decode("utf-8", errors="replace")
