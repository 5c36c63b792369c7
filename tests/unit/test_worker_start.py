"""A decoder worker starts like a server: bounded warm-up, a KV budget, chat ids as
transformers encodes them.

Regressions of issue 33: a SmolLM2 worker warmed every bucket up to its 8,192-token
context (5 min 24 s, 14.6 GB RSS), and a chat prompt rendered by the model's template was
encoded with the tokenizer's special tokens added again, so it opened with a second BOS.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.compute import WarmUpLimits, warm_up
from graylane.engine_worker.layouts import kv_bytes_per_token, kv_cache_layout, kv_tokens_for
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.requests import RequestFacts, request_facts
from graylane.models.gguf_import import GgufImport, import_gguf
from graylane.models.gguf_tokenizer import GgufVocab, tokenizer_from_gguf
from graylane.models.hf_tokenizer import HfTokenizer
from graylane.v1 import inference_pb2

GGUF_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "llm" / "gguf"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> GgufImport:
    return import_gguf(GGUF_DIR / "tiny-llama.gguf", tmp_path_factory.mktemp("w") / "tiny")


@pytest.fixture(scope="module")
def engine(imported: GgufImport) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine.load(imported.model.read_bytes(), name="tiny", intra_op_threads=1)


def test_the_kv_budget_bounds_rows_times_length(engine: OnnxRuntimeEngine) -> None:
    layout = kv_cache_layout(engine.io)
    assert layout is not None
    # keys and values x 2 layers x 2 KV heads x 16 dims x 4 bytes
    assert kv_bytes_per_token(layout) == 2 * 2 * 2 * 16 * 4
    assert kv_tokens_for(layout, 1.0) == (1 << 20) // 512
    assert kv_tokens_for(layout, 0.0001) == 1  # never below one position


def test_warm_up_runs_the_buckets_up_to_its_cap_and_stops_at_its_budget(
    engine: OnnxRuntimeEngine,
) -> None:
    policy = BucketPolicy(buckets=(8, 16, 32, 64, 128), max_batch_size=4)
    ran: list[int] = []

    class Counting:
        io = engine.io
        variant = "fp32"

        def run(self, feeds: dict[str, object]) -> object:
            ran.append(feeds["input_ids"].shape[1])  # type: ignore[attr-defined]
            return engine.run(feeds)  # type: ignore[arg-type]

    runs = warm_up([Counting()], policy, 128, limits=WarmUpLimits(max_len=32, budget_s=None))
    assert runs == 3 and ran == [8, 16, 32]  # shortest first, none past the cap
    ran.clear()
    assert warm_up([Counting()], policy, 128, limits=WarmUpLimits(budget_s=0.0)) == 0
    assert ran == []


def _chat_request(prompt: str) -> inference_pb2.InferenceRequest:
    return inference_pb2.InferenceRequest(
        request_id="r",
        model="m",
        prompt=prompt,
        task=inference_pb2.GENERATE,
        messages=[inference_pb2.ChatMessage(role="user", content="hi")],
    )


def test_a_chat_prompt_gets_no_second_bos(imported: GgufImport, tmp_path: Path) -> None:
    """A tokenizer that adds a BOS (as SmolLM2's Optimum export did) encodes a completion
    with it, and a template's rendering, which opens with it already, without."""
    raw = json.loads(imported.tokenizer.read_text())
    tokens = [t for t, _ in sorted(raw["model"]["vocab"].items(), key=lambda kv: kv[1])]
    vocab = GgufVocab(
        model="gpt2",
        pre="default",
        tokens=tokens,
        token_types=[3 if i == 0 else 1 for i in range(len(tokens))],
        merges=[m if isinstance(m, str) else " ".join(m) for m in raw["model"]["merges"]],
        bos_id=0,
        add_bos=True,
    )
    path = tmp_path / "tokenizer.json"
    tokenizer_from_gguf(vocab).save(str(path))
    tokenizer = HfTokenizer(path)
    rendered = "<|endoftext|>user: hi\nassistant:"
    assert tokenizer.encode(rendered)[:2] == (0, 0)  # the doubled BOS of the issue
    facts = request_facts(_chat_request(rendered), tokenizer)
    assert isinstance(facts, RequestFacts)
    assert tuple(facts.token_ids) == tokenizer.encode_rendered(rendered)
    assert facts.token_ids[0] == 0 and facts.token_ids[1] != 0
    completion = inference_pb2.InferenceRequest(
        request_id="c", model="m", prompt="hi", task=inference_pb2.GENERATE
    )
    plain = request_facts(completion, tokenizer)
    assert isinstance(plain, RequestFacts) and plain.token_ids[0] == 0  # BOS added once
