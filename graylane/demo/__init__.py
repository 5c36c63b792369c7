"""Seeded demo models for running Graylane end to end without downloads.

The names below are loaded on first use, so ``python -m graylane.demo.gpt``
runs the module once rather than after a package-level import of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graylane.demo.gpt import (
        ATTENTION_MASK,
        BOS_ID,
        BYTE_VOCAB,
        CONFIGS,
        EOS_ID,
        INPUT_IDS,
        LOGITS,
        PAD_ID,
        VOCAB_SIZE,
        DemoModelError,
        DemoModelInfo,
        DemoSize,
        GptConfig,
        build_demo_gpt,
        config_for,
        count_parameters,
        decode_tokens,
        encode_text,
        write_demo_gpt,
    )

__all__ = [
    "ATTENTION_MASK",
    "BOS_ID",
    "BYTE_VOCAB",
    "CONFIGS",
    "EOS_ID",
    "INPUT_IDS",
    "LOGITS",
    "PAD_ID",
    "VOCAB_SIZE",
    "DemoModelError",
    "DemoModelInfo",
    "DemoSize",
    "GptConfig",
    "build_demo_gpt",
    "config_for",
    "count_parameters",
    "decode_tokens",
    "encode_text",
    "write_demo_gpt",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("graylane.demo.gpt"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
