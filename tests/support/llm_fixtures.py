"""The committed LLM fixtures (``tests/fixtures/llm``) and transformers' answers for them.

Made by ``scripts/export_llm_fixtures.py``: tiny GPT-2 and Llama (grouped-query
attention) decoders exported by optimum-onnx, a merged GPT-2 decoder, the BPE
tokenizer they share, and per prompt what transformers answered (greedy
``generate`` tokens, the last position's logits and their argmax).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llm"
ARCHES = ("gpt2", "llama", "gpt2-merged")


@dataclass(frozen=True)
class PromptReference:
    text: str
    ids: tuple[int, ...]
    generated: tuple[int, ...]
    """transformers' greedy tokens, cut before EOS."""
    finish_reason: str
    generated_text: str
    argmax_last: int
    logits_last: np.ndarray


@dataclass(frozen=True)
class Fixture:
    arch: str
    folder: Path
    max_new_tokens: int
    eos_token_id: int
    prompts: tuple[PromptReference, ...]

    @property
    def model(self) -> Path:
        return self.folder / "model.onnx"

    @property
    def tokenizer(self) -> Path:
        return self.folder / "tokenizer.json"


def fixture(arch: str) -> Fixture:
    folder = FIXTURES / arch
    raw = json.loads((folder / "reference.json").read_text())
    prompts = tuple(
        PromptReference(
            text=p["text"],
            ids=tuple(p["ids"]),
            generated=tuple(p["generated"]),
            finish_reason=p["finish_reason"],
            generated_text=p["generated_text"],
            argmax_last=int(p["argmax_last"]),
            logits_last=np.asarray(p["logits_last"], dtype=np.float32),
        )
        for p in raw["prompts"]
    )
    return Fixture(arch, folder, int(raw["max_new_tokens"]), int(raw["eos_token_id"]), prompts)
