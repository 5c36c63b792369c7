"""Decoders exported by Hugging Face Optimum, run by ONNX Runtime, answer like transformers.

The fixtures (``tests/fixtures/llm``, made by ``scripts/export_llm_fixtures.py``) are
tiny GPT-2 and Llama (grouped-query attention) models with seeded random weights,
exported by optimum-onnx with a KV cache, and a merged GPT-2 decoder
(``use_cache_branch``). Beside each lies what transformers itself answered: greedy
``generate`` tokens and the last position's logits. Every engine output here is the
real ONNX Runtime run of the exported graph.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from graylane.artifacts.decoder_axes import MASK_AXIS, correct_mask_axis, mask_axis_conflict
from graylane.artifacts.model_info import (
    ModelInfo,
    ModelTask,
    eos_from_hf_configs,
    read_model_info,
)
from graylane.engine.derived_inputs import POSITION_IDS, USE_CACHE_BRANCH
from graylane.engine.errors import BadShape
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.forward import run_forward
from graylane.engine_worker.kv_decode import KvDecodeLoop, generate_with_cache
from graylane.engine_worker.layouts import INPUT_IDS, kv_cache_layout, token_layout
from graylane.engine_worker.loading import load_from_paths, onnx_model_info
from graylane.engine_worker.postprocess import TOKEN_IDS
from graylane.engine_worker.requests import (
    Limits,
    RequestFacts,
    TaskKind,
    WorkItem,
    prepare,
    request_facts,
)
from graylane.models.hf_tokenizer import HfTokenizer, tokenizer_beside
from graylane.serde import PostProcess
from graylane.v1 import inference_pb2
from tests.support.llm_fixtures import ARCHES, Fixture, fixture


def load_engine(fx: Fixture) -> OnnxRuntimeEngine:
    """The fixture's graph; a merged decoder with its mask axis corrected (as a build does)."""
    model = onnx.load(str(fx.model))
    correct_mask_axis(model)
    return OnnxRuntimeEngine.load(model.SerializeToString(), name=fx.arch, intra_op_threads=1)


@pytest.fixture(scope="module", params=ARCHES)
def fx(request: pytest.FixtureRequest) -> Fixture:
    return fixture(request.param)


@pytest.fixture(scope="module")
def engine(fx: Fixture) -> OnnxRuntimeEngine:
    return load_engine(fx)


# --- layouts -----------------------------------------------------------------------------


def test_the_cache_layouts_of_the_exports_are_read_from_their_signatures() -> None:
    gpt2 = kv_cache_layout(load_engine(fixture("gpt2")).io)
    llama = kv_cache_layout(load_engine(fixture("llama")).io)
    merged = kv_cache_layout(load_engine(fixture("gpt2-merged")).io)
    assert gpt2 is not None and llama is not None and merged is not None
    assert (gpt2.n_layers, gpt2.n_heads, gpt2.head_dim) == (2, 4, 8)
    # Grouped-query attention: 4 query heads share 2 key/value heads; the cache has 2.
    assert (llama.n_layers, llama.n_heads, llama.head_dim) == (2, 2, 8)
    assert gpt2.position_ids and llama.position_ids and merged.position_ids
    assert not gpt2.cache_branch and not llama.cache_branch and merged.cache_branch
    assert USE_CACHE_BRANCH in merged.tokens.derived and POSITION_IDS in gpt2.tokens.derived


def test_a_cached_decoder_is_a_token_model_whose_derived_inputs_no_request_gives(
    engine: OnnxRuntimeEngine,
) -> None:
    layout = token_layout(engine.io, vocab_size=512)
    assert layout is not None and layout.vocab_size == 512
    assert set(engine.io.input_names) - set(layout.derived) == {INPUT_IDS, "attention_mask"}


def test_an_export_with_a_cache_declares_itself_a_causal_lm(fx: Fixture) -> None:
    info = read_model_info(onnx.load(str(fx.model), load_external_data=False))
    assert info.task is ModelTask.CAUSAL_LM and info.vocab_size == 512
    # Its positions come from the transformers config beside it (n_positions or
    # max_position_embeddings): the worker never runs a sequence past them.
    assert onnx_model_info(fx.model).max_seq_len == 128
    assert ModelInfo.from_dict(onnx_model_info(fx.model).to_dict()).max_seq_len == 128


# --- generation and forward passes ---------------------------------------------------------


@pytest.mark.parametrize("rows", [4, 2])
def test_batched_greedy_generation_gives_transformers_tokens(
    fx: Fixture, engine: OnnxRuntimeEngine, rows: int
) -> None:
    """All prompts (6 to 20 tokens) in one running batch, or two rows joining as others
    finish: each gets exactly the tokens transformers' own generate gave it alone."""
    results = generate_with_cache(
        engine,
        [p.ids for p in fx.prompts],
        fx.max_new_tokens,
        fx.eos_token_id,
        128,
        max_batch_size=rows,
    )
    assert [r.tokens for r in results] == [p.generated for p in fx.prompts]
    assert [r.finished_reason.value for r in results] == [p.finish_reason for p in fx.prompts]


def test_the_llama_fixture_stops_one_prompt_at_eos() -> None:
    """So EOS handling is exercised by a real model's choice, not an injected one."""
    assert [p.finish_reason for p in fixture("llama").prompts].count("eos") == 1


def test_a_decode_loop_with_late_joiners_gives_the_same_tokens(
    fx: Fixture, engine: OnnxRuntimeEngine
) -> None:
    loop = KvDecodeLoop(engine, max_batch_size=4, max_seq_len=128)
    first = loop.submit(fx.prompts[0].ids, fx.max_new_tokens, fx.eos_token_id)
    results = dict(loop.step())
    later = [loop.submit(p.ids, fx.max_new_tokens, fx.eos_token_id) for p in fx.prompts[1:]]
    results.update(loop.run())
    assert [results[i].tokens for i in (first, *later)] == [p.generated for p in fx.prompts]
    assert loop.stats.prefill_calls == 2


def test_forward_gives_transformers_last_logits_and_their_argmax(
    fx: Fixture, engine: OnnxRuntimeEngine
) -> None:
    feeds = [{INPUT_IDS: np.asarray([p.ids], dtype=np.int64)} for p in fx.prompts]
    raw = run_forward(engine, feeds)  # one padded batch of four widths
    for out, p in zip(raw, fx.prompts, strict=True):
        assert set(out) == {"logits"}  # the present.* cache is not a result
        assert out["logits"].shape == (1, len(p.ids), 512)
        np.testing.assert_allclose(out["logits"][0, -1], p.logits_last, atol=1e-4)
    argmax = run_forward(engine, feeds, PostProcess.ARGMAX_LAST)
    assert [int(a[TOKEN_IDS][0]) for a in argmax] == [p.argmax_last for p in fx.prompts]


def test_a_merged_decoder_declares_its_mask_as_wide_as_its_ids() -> None:
    """Why a build corrects the merged graph: as exported, its first cached step is refused."""
    fx = fixture("gpt2-merged")
    model = onnx.load(str(fx.model))
    assert mask_axis_conflict(model) == "sequence_length"
    raw = OnnxRuntimeEngine.load(str(fx.model), intra_op_threads=1)
    with pytest.raises(BadShape, match="sequence_length"):
        generate_with_cache(raw, [fx.prompts[0].ids], 2, None, 128)
    correction = correct_mask_axis(model)
    assert correction is not None and correction.after == MASK_AXIS
    assert mask_axis_conflict(model) is None
    assert correct_mask_axis(onnx.load(str(fixture("gpt2").model))) is None


def test_an_unbuilt_merged_export_is_loaded_with_its_mask_axis_corrected() -> None:
    """``graylane worker --variant fp32=EXPORT/model.onnx`` serves it as a build would."""
    fx = fixture("gpt2-merged")
    engine = load_from_paths({"fp32": fx.model}, model="merged")["fp32"]
    (result,) = generate_with_cache(engine, [fx.prompts[2].ids], 16, fx.eos_token_id, 128)
    assert result.tokens == fx.prompts[2].generated


# --- the tokenizer ------------------------------------------------------------------------


def test_the_tokenizer_gives_the_ids_and_text_transformers_used() -> None:
    fx = fixture("gpt2")
    tokenizer = HfTokenizer.beside(fx.tokenizer)
    assert tokenizer.eos_id == fx.eos_token_id == 0 and tokenizer.vocab_size == 512
    for p in fx.prompts:
        assert tokenizer.encode(p.text) == p.ids
        assert tokenizer.decode(p.ids) == p.text
        assert tokenizer.decode(p.generated) == p.generated_text
    text = "Gray releases move traffic to a new model version, a little at a time: 1% → 5%."
    assert tokenizer.decode(tokenizer.encode(text)) == text  # byte-level: any text
    assert tokenizer.decode([*tokenizer.encode("A canary"), 0]) == "A canary"  # EOS skipped


def test_eos_comes_from_the_transformers_configs_beside_the_tokenizer(tmp_path: Path) -> None:
    tokenizer = fixture("gpt2").tokenizer
    assert eos_from_hf_configs(tmp_path, tokenizer) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    assert eos_from_hf_configs(tmp_path, tokenizer) == 0
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert eos_from_hf_configs(tmp_path, tokenizer) == 7
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    assert eos_from_hf_configs(tmp_path, tokenizer) == 5
    assert tokenizer_beside(tmp_path / "model.onnx") is None
    found = tokenizer_beside(fixture("llama").model)
    assert found is not None and found.eos_id == 0


def _request(**fields: object) -> inference_pb2.InferenceRequest:
    return inference_pb2.InferenceRequest(request_id="r", model="m", **fields)  # type: ignore[arg-type]


def test_a_text_prompt_is_encoded_and_stops_at_the_models_eos_unless_the_request_says() -> None:
    fx = fixture("gpt2")
    tokenizer = HfTokenizer.beside(fx.tokenizer)
    gen = inference_pb2.GenerationParams(max_new_tokens=4)
    facts = request_facts(
        _request(prompt=fx.prompts[1].text, task=inference_pb2.GENERATE, generation=gen),
        tokenizer,
    )
    assert isinstance(facts, RequestFacts)
    assert tuple(facts.token_ids) == fx.prompts[1].ids and facts.eos_id == 0
    own = inference_pb2.GenerationParams(max_new_tokens=4, eos_token_id=9, has_eos=True)
    chosen = request_facts(_request(token_ids=[1, 2], generation=own), tokenizer)
    assert isinstance(chosen, RequestFacts) and chosen.eos_id == 9


def test_a_forward_request_with_a_prompt_is_accepted_by_a_cached_decoder(
    fx: Fixture, engine: OnnxRuntimeEngine
) -> None:
    tokenizer = HfTokenizer.beside(fx.tokenizer)
    facts = request_facts(_request(prompt=fx.prompts[0].text), tokenizer)
    assert isinstance(facts, RequestFacts)
    item = prepare(0, facts, engine.io, Limits(max_seq_len=128), now_ms=0)
    assert isinstance(item, WorkItem) and item.task is TaskKind.FORWARD
    assert set(item.feeds) == {INPUT_IDS, "attention_mask"}
    (out,) = run_forward(engine, [item.feeds], PostProcess.ARGMAX_LAST)
    assert int(out[TOKEN_IDS][0]) == fx.prompts[0].argmax_last
