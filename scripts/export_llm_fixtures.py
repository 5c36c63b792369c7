"""Export the LLM test fixtures: tiny GPT-2 and Llama decoders through Hugging Face Optimum.

Nothing is downloaded. The script trains a byte-level BPE tokenizer on the repository's
README, builds each model from a config with seeded random weights, exports it with
``optimum-onnx`` (task ``text-generation-with-past``: one ``model.onnx`` taking
``input_ids``, ``attention_mask``, ``position_ids`` and ``past_key_values.N.key|value``,
giving ``logits`` and ``present.N.key|value``) and records beside it what transformers
itself answers: greedy ``generate`` tokens and the argmax (and logits) of the last
position of a forward pass, for a few text prompts.

One more fixture is a merged decoder (``use_cache_branch``: one graph with an ``If`` on
whether the past is used), the form older Optimum releases wrote as
``decoder_model_merged.onnx``. optimum-onnx 0.1 no longer writes it for decoders; the
script merges a decoder exported without past inputs and the one with them through
``optimum.onnx.merge_decoders``, as those releases did.

It needs torch, transformers, optimum-onnx and tokenizers (``pip install -e
".[fixtures]"`` in a virtual environment of its own; never in the test environment)::

    python scripts/export_llm_fixtures.py [--out tests/fixtures/llm]

Re-running it rewrites the fixtures; the tests compare Graylane against the recorded
references, so a fixture and its reference always come from the same run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "README.md"
VOCAB_SIZE = 512
EOS = "<|endoftext|>"
MAX_POSITIONS = 128
MAX_NEW_TOKENS = 16
SEED = 0
PROMPTS = (
    "Gray releases",
    "The worker groups requests into shape buckets",
    "A canary",
    "Kafka keeps one topic per version, and the router",
)


@dataclass(frozen=True)
class Arch:
    name: str
    merged: bool = False


def train_tokenizer(corpus: Path, out: Path) -> Any:
    """A byte-level BPE (GPT-2 style, no BOS added) trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.read_text(encoding="utf-8").splitlines(), trainer)
    tokenizer.save(str(out))
    return tokenizer


def build_model(arch: str, vocab: int, eos_id: int) -> Any:
    """A 2-layer decoder with seeded random weights (init scaled up for peaky logits)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    common = {"vocab_size": vocab, "bos_token_id": eos_id, "eos_token_id": eos_id}
    if arch == "gpt2":
        config = GPT2Config(
            n_positions=MAX_POSITIONS,
            n_embd=32,
            n_layer=2,
            n_head=4,
            initializer_range=0.2,
            pad_token_id=eos_id,
            **common,
        )
        model = GPT2LMHeadModel(config)
    elif arch == "llama":
        config = LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,  # grouped-query attention: 2 KV heads for 4 query heads
            max_position_embeddings=MAX_POSITIONS,
            initializer_range=0.2,
            pad_token_id=eos_id,
            **common,
        )
        model = LlamaForCausalLM(config)
    else:
        raise SystemExit(f"unknown architecture {arch!r}")
    return model.eval()


def export(model: Any, tokenizer_file: Path, out: Path, *, merged: bool) -> None:
    """``model.onnx`` and the configs in ``out`` (Optimum's export, then its merge if asked)."""
    from optimum.exporters.onnx import onnx_export_from_model
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file), eos_token=EOS, bos_token=EOS, pad_token=EOS
    )
    task = "text-generation-with-past"
    with tempfile.TemporaryDirectory() as tmp:
        with_past = Path(tmp, "with-past")
        onnx_export_from_model(model, with_past, task=task, preprocessors=[fast])
        if merged:
            from optimum.exporters.tasks import TasksManager
            from optimum.onnx import merge_decoders

            constructor = TasksManager.get_exporter_config_constructor(
                exporter="onnx", model=model, task=task, library_name="transformers"
            )
            # The first pass's graph: no past inputs, present outputs.
            no_past_config = constructor(
                model.config, task="text-generation", use_past=True, use_past_in_inputs=False
            )
            no_past = Path(tmp, "no-past")
            onnx_export_from_model(
                model,
                no_past,
                task=task,
                custom_onnx_configs={"model": no_past_config},
                do_validation=False,
            )
            merge_decoders(
                no_past / "model.onnx", with_past / "model.onnx", save_path=out / "model.onnx"
            )
        else:
            shutil.copyfile(with_past / "model.onnx", out / "model.onnx")
        for name in ("config.json", "generation_config.json"):
            shutil.copyfile(with_past / name, out / name)


def references(model: Any, tokenizer: Any, eos_id: int) -> dict[str, Any]:
    """What transformers answers for each prompt, run alone (no padding)."""
    import torch

    prompts: list[dict[str, Any]] = []
    for text in PROMPTS:
        ids = tokenizer.encode(text).ids
        input_ids = torch.tensor([ids])
        with torch.no_grad():
            logits = model(input_ids=input_ids).logits[0, -1]
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=MAX_NEW_TOKENS,
                eos_token_id=eos_id,
                pad_token_id=eos_id,
            )
        new = [int(t) for t in out[0, len(ids) :]]
        stopped = eos_id in new
        generated = new[: new.index(eos_id)] if stopped else new
        top2 = torch.topk(logits, 2).values
        prompts.append(
            {
                "text": text,
                "ids": ids,
                "generated": generated,
                "finish_reason": "eos" if stopped else "length",
                "generated_text": tokenizer.decode(generated, skip_special_tokens=True),
                "argmax_last": int(torch.argmax(logits)),
                "logits_last": [round(float(v), 6) for v in logits],
                "margin_last": round(float(top2[0] - top2[1]), 6),
            }
        )
    return {"max_new_tokens": MAX_NEW_TOKENS, "eos_token_id": eos_id, "prompts": prompts}


def write_fixture(arch: Arch, out_root: Path, tokenizer_file: Path, tokenizer: Any) -> Path:
    import optimum.version
    import torch
    import transformers

    eos_id = tokenizer.token_to_id(EOS)
    base = "gpt2" if arch.name.startswith("gpt2") else arch.name
    model = build_model(base, tokenizer.get_vocab_size(), eos_id)
    out = out_root / arch.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    export(model, tokenizer_file, out, merged=arch.merged)
    shutil.copyfile(tokenizer_file, out / "tokenizer.json")
    reference = {
        "architecture": base,
        "merged_decoder": arch.merged,
        "seed": SEED,
        "made_with": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "optimum-onnx": _version("optimum-onnx"),
            "optimum": optimum.version.__version__,
            "tokenizers": _version("tokenizers"),
        },
        "tokenizer_corpus_sha256": hashlib.sha256(CORPUS.read_bytes()).hexdigest(),
        "model_onnx_sha256": hashlib.sha256((out / "model.onnx").read_bytes()).hexdigest(),
        **references(model, tokenizer, eos_id),
    }
    (out / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    return out


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "llm")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_file = Path(tmp, "tokenizer.json")
        tokenizer = train_tokenizer(CORPUS, tokenizer_file)
        for arch in (Arch("gpt2"), Arch("llama"), Arch("gpt2-merged", merged=True)):
            folder = write_fixture(arch, args.out, tokenizer_file, tokenizer)
            size = sum(f.stat().st_size for f in folder.iterdir())
            recorded = json.loads((folder / "reference.json").read_text())["prompts"]
            margins = [p["margin_last"] for p in recorded]
            print(f"{folder}: {size / 1024:.0f} KiB, top-2 margins of the last logits {margins}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
