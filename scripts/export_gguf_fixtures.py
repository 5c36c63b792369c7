"""The GGUF test fixture, and what transformers' GGUF loader answers for it and for SmolLM2.

Two jobs, the second only in the fixtures environment:

1. ``--write-fixture`` (numpy and ``gguf`` only: the test environment can run it) writes
   ``tests/fixtures/llm/gguf/tiny-llama.gguf``: a Llama decoder of 2 layers, width 64,
   4 attention heads over 2 KV heads, seeded random weights (seed 0), stored as llama.cpp
   stores a converted model (query/key rows permuted for its rotary form) in a mix of
   tensor types (Q8_0 embeddings, Q4_0 / Q4_1 / Q5_1 / F16 projections, F32 norms),
   with the 512-token byte-level BPE of ``tests/fixtures/llm/llama`` as its tokenizer
   and a plain chat template.
2. ``--reference`` (torch, transformers, gguf: ``pip install -e ".[fixtures]"`` in a
   virtual environment of its own, never the test environment) loads each GGUF through
   transformers (``from_pretrained(..., gguf_file=...)``: dequantized to float32) and
   records beside the fixture what it answers, for the tests to compare Graylane's
   torch-free import with:

   - ``tests/fixtures/llm/gguf/reference.json``: for a few text prompts, their ids,
     transformers' greedy ``generate`` tokens and the last position's logits;
   - ``tests/fixtures/llm/gguf/smollm2-reference.json`` (when the SmolLM2 GGUF is in the
     cache, ``python deploy/engines/llamacpp.py model``): for chat prompts, the ids of
     ``apply_chat_template(..., add_generation_prompt=True)``, the greedy tokens and text
     of ``generate`` on them, and the last position's top logits.

Run::

    python scripts/export_gguf_fixtures.py --write-fixture           # any environment
    /tmp/fixtures-venv/bin/python scripts/export_gguf_fixtures.py --reference
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FIXTURE_DIR = REPO / "tests" / "fixtures" / "llm" / "gguf"
FIXTURE = FIXTURE_DIR / "tiny-llama.gguf"
TOKENIZER_SOURCE = REPO / "tests" / "fixtures" / "llm" / "llama" / "tokenizer.json"
SEED = 0
MAX_NEW_TOKENS = 16
SMOLLM2_NEW_TOKENS = 32
PROMPTS = (
    "Gray releases",
    "The worker groups requests into shape buckets",
    "A canary",
    "Kafka keeps one topic per version, and the router",
)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)
SMOLLM2_CHATS = (
    "What is the capital of France?",
    "Explain in one sentence why the sky is blue.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
    "Write a haiku about winter.",
    "What does a compiler do?",
    "Who wrote Romeo and Juliet?",
    "Give me a tip for learning a new language.",
)
SHAPE = {
    "vocab": 512,
    "hidden": 64,
    "ffn": 128,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "context": 128,
    "rope_base": 10000.0,
    "eps": 1e-6,
}


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order for a query/key projection (its ``permute``)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_fixture(path: Path = FIXTURE) -> Path:
    """The tiny Llama GGUF (see the module doc); deterministic."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    s = SHAPE
    rng = np.random.default_rng(SEED)
    tokenizer = json.loads(TOKENIZER_SOURCE.read_text(encoding="utf-8"))
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    for added in tokenizer["added_tokens"]:
        if added["id"] >= len(tokens):
            tokens.append(added["content"])
    special = {a["id"] for a in tokenizer["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    if len(tokens) != s["vocab"]:
        raise SystemExit(f"{TOKENIZER_SOURCE}: {len(tokens)} tokens, expected {s['vocab']}")

    def normal(*shape: int, std: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    head_dim = s["hidden"] // s["heads"]
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("graylane tiny llama fixture")
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_block_count(s["layers"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_freq_base(s["rope_base"])
    writer.add_layer_norm_rms_eps(s["eps"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(s["vocab"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def tensor(name: str, array: np.ndarray, kind: Any) -> None:
        if kind in (Q.F32, Q.F16):
            writer.add_tensor(name, array.astype(np.float16 if kind is Q.F16 else np.float32))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)

    tensor("token_embd.weight", normal(s["vocab"], s["hidden"], std=1.0), Q.Q8_0)
    for i in range(s["layers"]):
        tensor(f"blk.{i}.attn_norm.weight", 1.0 + normal(s["hidden"], std=0.1), Q.F32)
        q = normal(s["heads"] * head_dim, s["hidden"])
        k = normal(s["kv_heads"] * head_dim, s["hidden"])
        tensor(f"blk.{i}.attn_q.weight", _permute(q, s["heads"]), Q.Q8_0)
        tensor(f"blk.{i}.attn_k.weight", _permute(k, s["kv_heads"]), Q.Q4_1)
        tensor(f"blk.{i}.attn_v.weight", normal(s["kv_heads"] * head_dim, s["hidden"]), Q.Q5_1)
        tensor(f"blk.{i}.attn_output.weight", normal(s["hidden"], s["hidden"]), Q.F16)
        tensor(f"blk.{i}.ffn_norm.weight", 1.0 + normal(s["hidden"], std=0.1), Q.F32)
        tensor(f"blk.{i}.ffn_gate.weight", normal(s["ffn"], s["hidden"]), Q.Q4_0)
        tensor(f"blk.{i}.ffn_up.weight", normal(s["ffn"], s["hidden"]), Q.Q4_0)
        tensor(f"blk.{i}.ffn_down.weight", normal(s["hidden"], s["ffn"]), Q.Q8_0)
    tensor("output_norm.weight", 1.0 + normal(s["hidden"], std=0.1), Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load(gguf_file: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype="float32"
    )
    return tokenizer, model.eval()


def _made_with() -> dict[str, str]:
    from importlib.metadata import version

    return {d: version(d) for d in ("torch", "transformers", "gguf", "tokenizers")}


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """``apply_chat_template``'s ids (transformers 5 answers a BatchEncoding, 4 a list)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


def _greedy(model: Any, ids: Sequence[int], new_tokens: int, eos: int | None) -> list[int]:
    import torch

    input_ids = torch.tensor([list(ids)])
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    new = [int(t) for t in out[0, len(ids) :]]
    return new[: new.index(eos)] if eos is not None and eos in new else new


def _last_logits(model: Any, ids: Sequence[int]) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)])).logits[0, -1]


def fixture_reference(path: Path = FIXTURE) -> dict[str, Any]:
    import torch

    tokenizer, model = _load(path)
    eos = 0
    prompts = []
    for text in PROMPTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        logits = _last_logits(model, ids)
        generated = _greedy(model, ids, MAX_NEW_TOKENS, eos)
        top2 = torch.topk(logits, 2).values
        prompts.append(
            {
                "text": text,
                "ids": ids,
                "generated": generated,
                "argmax_last": int(torch.argmax(logits)),
                "logits_last": [round(float(v), 6) for v in logits],
                "margin_last": round(float(top2[0] - top2[1]), 6),
            }
        )
    chat = [{"role": "user", "content": "Gray releases"}]
    return {
        "gguf": path.name,
        "gguf_sha256": _sha256(path),
        "seed": SEED,
        "made_with": _made_with(),
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_token_id": eos,
        "prompts": prompts,
        "chat": {
            "messages": chat,
            "ids": _chat_ids(tokenizer, chat),
        },
    }


def smollm2_reference(path: Path) -> dict[str, Any]:
    import torch

    tokenizer, model = _load(path)
    eos = 2  # <|im_end|>: the GGUF's eos_token_id, what generate stops on
    chats = []
    for question in SMOLLM2_CHATS:
        messages = [{"role": "user", "content": question}]
        ids = _chat_ids(tokenizer, messages)
        logits = _last_logits(model, ids)
        top = torch.topk(logits, 10)
        generated = _greedy(model, ids, SMOLLM2_NEW_TOKENS, eos)
        chats.append(
            {
                "messages": messages,
                "ids": ids,
                "generated": generated,
                "text": tokenizer.decode(generated, skip_special_tokens=True),
                "top_ids": [int(i) for i in top.indices],
                "top_logits": [round(float(v), 5) for v in top.values],
            }
        )
    return {
        "gguf": path.name,
        "gguf_sha256": _sha256(path),
        "made_with": _made_with(),
        "max_new_tokens": SMOLLM2_NEW_TOKENS,
        "eos_token_id": eos,
        "chats": chats,
    }


def _smollm2_path() -> Path | None:
    import os

    root = Path(os.environ.get("GRAYLANE_CACHE_DIR", Path.home() / ".cache" / "graylane"))
    path = root / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-fixture", action="store_true", help="write tiny-llama.gguf")
    parser.add_argument("--reference", action="store_true", help="record transformers' answers")
    parser.add_argument(
        "--no-smollm2", action="store_true", help="with --reference: the tiny fixture's only"
    )
    args = parser.parse_args(argv)
    if not (args.write_fixture or args.reference):
        parser.error("give --write-fixture and/or --reference")
    if args.write_fixture:
        print(f"wrote {write_fixture()} ({FIXTURE.stat().st_size} bytes)")
    if args.reference:
        out = FIXTURE_DIR / "reference.json"
        out.write_text(json.dumps(fixture_reference(), indent=1) + "\n")
        print(f"wrote {out}")
        smollm2 = None if args.no_smollm2 else _smollm2_path()
        if args.no_smollm2:
            pass
        elif smollm2 is None:
            print(
                "SmolLM2 GGUF not cached (python deploy/engines/llamacpp.py model): "
                "no smollm2-reference.json"
            )
        else:
            out = FIXTURE_DIR / "smollm2-reference.json"
            out.write_text(json.dumps(smollm2_reference(smollm2), indent=1) + "\n")
            print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
