"""A GGUF file imported without torch answers what transformers' GGUF loader answers.

The fixture ``tests/fixtures/llm/gguf/tiny-llama.gguf`` (2 layers, grouped-query
attention, weights in Q8_0 / Q4_0 / Q4_1 / Q5_1 / F16 / F32) and transformers' answers for
it (``reference.json``) are made by ``scripts/export_gguf_fixtures.py``; the reference
runs in the fixtures environment, never here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest

from graylane.artifacts.model_info import ModelTask, read_model_info
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.forward import run_forward
from graylane.engine_worker.kv_decode import generate_with_cache
from graylane.engine_worker.layouts import INPUT_IDS, kv_cache_layout
from graylane.models.gguf_import import (
    GgufImport,
    GgufImportError,
    import_gguf,
    read_gguf,
    read_import,
)
from graylane.models.gguf_tokenizer import GgufTokenizerError, GgufVocab, tokenizer_from_gguf
from graylane.models.hf_tokenizer import HfTokenizer
from graylane.services.gateway.chat import ChatMessage, ChatRole, load_chat_template

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "llm" / "gguf"
GGUF = FIXTURE_DIR / "tiny-llama.gguf"
REFERENCE = json.loads((FIXTURE_DIR / "reference.json").read_text())


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> GgufImport:
    return import_gguf(GGUF, tmp_path_factory.mktemp("import") / "tiny")


@pytest.fixture(scope="module")
def engine(imported: GgufImport) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine.load(imported.model.read_bytes(), name="tiny", intra_op_threads=1)


def test_the_fixture_and_its_reference_belong_together() -> None:
    import hashlib

    assert hashlib.sha256(GGUF.read_bytes()).hexdigest() == REFERENCE["gguf_sha256"]


def test_the_import_is_an_optimum_style_decoder_the_worker_serves(
    imported: GgufImport, engine: OnnxRuntimeEngine
) -> None:
    layout = kv_cache_layout(engine.io)
    assert layout is not None
    # Grouped-query attention: 4 query heads over 2 KV heads; the cache has the 2.
    assert (layout.n_layers, layout.n_heads, layout.head_dim) == (2, 2, 16)
    assert layout.position_ids
    info = read_model_info(onnx.load(str(imported.model), load_external_data=False))
    assert info.task is ModelTask.CAUSAL_LM and info.vocab_size == 512
    files = {p.name for p in imported.folder.iterdir()}
    assert {"model.onnx", "tokenizer.json", "tokenizer_config.json", "config.json"} <= files
    assert (
        json.loads((imported.folder / "config.json").read_text())["max_position_embeddings"] == 128
    )
    assert imported.eos_id == 0


def test_forward_gives_transformers_last_logits(engine: OnnxRuntimeEngine) -> None:
    feeds = [{INPUT_IDS: np.asarray([p["ids"]], dtype=np.int64)} for p in REFERENCE["prompts"]]
    outputs = run_forward(engine, feeds)  # one right-padded batch of four widths
    for out, p in zip(outputs, REFERENCE["prompts"], strict=True):
        logits = out["logits"][0, -1]
        np.testing.assert_allclose(logits, np.asarray(p["logits_last"]), atol=2e-4)
        assert int(np.argmax(logits)) == p["argmax_last"]


@pytest.mark.parametrize("rows", [4, 1])
def test_greedy_through_the_kv_cache_gives_transformers_tokens(
    engine: OnnxRuntimeEngine, rows: int
) -> None:
    """Alone, or all four prompts padded into one running batch: transformers' tokens."""
    prompts = REFERENCE["prompts"]
    results = generate_with_cache(
        engine, [p["ids"] for p in prompts], REFERENCE["max_new_tokens"], 0, 128,
        max_batch_size=rows,
    )  # fmt: skip
    assert [list(r.tokens) for r in results] == [p["generated"] for p in prompts]


def test_the_tokenizer_gives_transformers_ids(imported: GgufImport) -> None:
    tokenizer = HfTokenizer(imported.tokenizer)
    for p in REFERENCE["prompts"]:
        assert list(tokenizer.encode(p["text"])) == p["ids"]
    # The GGUF's tokenizer is the one the fixture was converted from, token for token.
    source = HfTokenizer(FIXTURE_DIR.parent / "llama" / "tokenizer.json")
    text = "Kafka keeps one topic per version, 2026 times: <|endoftext|> and ünïcode."
    assert tokenizer.encode(text) == source.encode(text)
    assert tokenizer.decode(tokenizer.encode(text)) == source.decode(source.encode(text))


def test_the_chat_template_renders_transformers_ids(imported: GgufImport) -> None:
    template = load_chat_template(imported.folder)
    assert template is not None
    chat = REFERENCE["chat"]
    messages = [ChatMessage(ChatRole(m["role"]), m["content"]) for m in chat["messages"]]
    rendered = template.render(messages)
    assert list(HfTokenizer(imported.tokenizer).encode_rendered(rendered)) == chat["ids"]


def test_a_finished_import_is_read_back(imported: GgufImport) -> None:
    again = read_import(imported.folder)
    assert again is not None and again.cache_hit
    assert again.source_sha256 == imported.source_sha256 and again.config == imported.config


def test_other_architectures_and_tokenizers_are_refused(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GgufImportError, match="architecture 'gpt2' is not supported"):
        read_gguf(path).config()
    with pytest.raises(GgufImportError, match="not a readable GGUF"):
        read_gguf(_junk(tmp_path))
    spm = GgufVocab(model="llama", pre="default", tokens=["a"], token_types=[1], merges=[])
    with pytest.raises(GgufTokenizerError, match="'llama' is not supported"):
        tokenizer_from_gguf(spm)
    odd = GgufVocab(model="gpt2", pre="deepseek-coder", tokens=["a"], token_types=[1], merges=[])
    with pytest.raises(GgufTokenizerError, match="'deepseek-coder' is not supported"):
        tokenizer_from_gguf(odd)


def _junk(tmp_path: Path) -> Path:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a gguf file at all")
    return path


def _gguf_spec(**overrides: object) -> dict[str, object]:
    """A build spec of the tiny GGUF fixture, float TensorRT and partial passes off."""
    return {
        "model": "tiny",
        "version": "1.0.0",
        "strategy": "gguf",
        "source": {"gguf": str(GGUF)},
        "partial_quantization": {"enabled": False},
        "tensorrt": {"enabled": False},
        **overrides,
    }


def test_graylane_build_takes_a_gguf_source_once_and_records_its_rungs(tmp_path: Path) -> None:
    """The import is cached by the file's digest; the weight-only rungs record how they
    were made; validation is on prompts continued by fp32, labelled as such."""
    from graylane.artifacts.manifest import read_manifest
    from graylane.artifacts.naming import Precision
    from graylane.builder.build import run_build
    from graylane.builder.spec import parse_spec
    from graylane.builder.variants import VariantStatus

    (tmp_path / "prompts.txt").write_text("Gray releases\nA canary\nThe worker groups\n")
    raw = _gguf_spec(
        precisions=["fp32", "int8-weight-only", "int4"],
        validation={
            "prompts": "prompts.txt",
            "continuation": 4,
            "generation": {"prompts": 2, "new_tokens": 4},
        },
        tolerances={"int4": {"min_top1_agreement": 0.0, "min_cosine": 0.0}},
    )
    spec = parse_spec(raw, base_dir=tmp_path)
    report = run_build(spec, store=tmp_path / "store")
    produced = {v.precision: v for v in report.variants if v.status is VariantStatus.PRODUCED}
    assert set(produced) == {Precision.FP32, Precision.INT8_WEIGHT_ONLY, Precision.INT4}
    assert report.source_sha256 == REFERENCE["gguf_sha256"]
    assert any("GGUF" in note and "imported" in note for note in report.notes)
    fp32 = read_manifest(produced[Precision.FP32].folder)  # type: ignore[arg-type]
    assert fp32.validation is not None and fp32.validation.passed
    assert fp32.validation.data is not None and "prompts.txt" in fp32.validation.data
    assert "continued by fp32" in fp32.validation.data
    assert {f.path for f in fp32.files} >= {"model.onnx", "tokenizer.json", "tokenizer_config.json"}
    assert fp32.model_info is not None and fp32.model_info.tokenizer is not None
    int4 = read_manifest(produced[Precision.INT4].folder)  # type: ignore[arg-type]
    assert int4.weight_only is not None
    assert (int4.weight_only.bits, int4.weight_only.block_size) == (4, 32)
    assert int4.weight_only.quantized_nodes == 2 * 7  # every projection; the head is a Gemm
    int8 = read_manifest(produced[Precision.INT8_WEIGHT_ONLY].folder)  # type: ignore[arg-type]
    assert int8.weight_only is not None and int8.weight_only.bits == 8
    assert int8.weight_only.accuracy_level == 4 and int8.weight_only.symmetric

    again = run_build(
        parse_spec({**raw, "version": "1.0.1"}, base_dir=tmp_path), store=tmp_path / "store"
    )
    assert any("cache hit" in note for note in again.notes)


@pytest.mark.parametrize(
    ("budget_s", "max_trials", "trials", "why"),
    [(3600.0, 3, 3, "trial budget (3)"), (0.5, 40, 1, "time budget (0s)")],
)
def test_the_partial_search_ends_within_its_budgets(
    imported: GgufImport, tmp_path: Path, budget_s: float, max_trials: int, trials: int, why: str
) -> None:
    """Issue 33: the search on a 30-layer model ran as long as it liked. It now stops at
    its trial cap, or before a trial the mean so far says would end past its time."""
    import time

    from graylane.artifacts.build_info import Metrics, Tolerance
    from graylane.artifacts.naming import Precision
    from graylane.builder.sensitivity import search_partial
    from graylane.builder.spec import PartialQuantizationSpec
    from graylane.builder.validation import ValidationResult
    from graylane.builder.variants import VariantInputs, produce_variant

    inputs = VariantInputs(
        source=imported.model,
        source_sha256=imported.source_sha256,
        work_dir=tmp_path,
        cache_dir=tmp_path / "cache",
    )
    full = produce_variant(Precision.INT8_WEIGHT_ONLY, inputs)
    failing = Tolerance(min_top1_agreement=1.1)

    def evaluate(path: Path) -> ValidationResult:
        time.sleep(0.3)
        metrics = Metrics(max_abs=1.0, mean_rel=0.1, cosine=0.99, top1_agreement=0.9, rows=4)
        return ValidationResult(Precision.INT8_WEIGHT_ONLY, failing, metrics, ("top1",))

    notes: list[str] = []
    search = search_partial(
        Precision.INT8_WEIGHT_ONLY,
        inputs,
        (full, evaluate(full.path)),  # type: ignore[arg-type]
        evaluate,
        PartialQuantizationSpec(node_budget=21, time_budget_s=budget_s, max_trials=max_trials),
        note=notes.append,
    )
    assert search.info.trials == trials and not search.info.passed
    assert search.info.stopped_by == why.replace("(0s)", f"({budget_s:.0f}s)")
    assert len(notes) == trials and notes[0].startswith("trial 1: 1 node(s) of layers.1 in float")


def test_the_8_bit_rung_records_its_smoothing_and_float_layers(tmp_path: Path) -> None:
    """SmoothQuant before the 8-bit rung: fitted on its own prompts, recorded in the manifest."""
    from graylane.artifacts.manifest import read_manifest

    (tmp_path / "calibration.txt").write_text("# fit\nThe worker groups\nA broker\nTopics\n")
    weight_only = {
        "int8_smoothing": {"alpha": 0.75, "prompts": "calibration.txt"},
        "int8_keep_float": ["layers.0."],
    }
    int8 = read_manifest(_rung_built(tmp_path, "int8-weight-only", weight_only))
    record = int8.weight_only
    assert record is not None and record.bits == 8
    assert record.algorithm == "smoothquant+rtn" and record.smoothing_alpha == 0.75
    assert record.calibration_prompts == 3
    # Layer 1's two normed inputs (q/k/v and gate/up); layer 0 stays in float.
    assert record.smoothed_activations == 2
    assert record.quantized_nodes == 7
    assert sorted(record.kept_float) == sorted(
        f"layers.0.{p}"
        for p in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
        )
    )  # fmt: skip
    assert int8.validation is not None and int8.validation.metrics is not None
    assert int8.validation.metrics.top1_agreement >= 0.5


def test_the_8_bit_rung_rounds_with_gptq_when_asked(tmp_path: Path) -> None:
    """``int8_rounding: gptq``: codes fitted on the calibration prompts and fp32's
    continuation of them, written into the rung's MatMulNBits; recorded in the manifest."""
    from graylane.artifacts.manifest import read_manifest
    from graylane.artifacts.naming import Precision
    from graylane.builder.build import run_build
    from graylane.builder.spec import parse_spec
    from graylane.builder.variants import VariantStatus

    (tmp_path / "prompts.txt").write_text("Gray releases\nA canary\n")
    (tmp_path / "calibration.txt").write_text("The worker groups\nA broker\nTopics\n")
    raw = _gguf_spec(
        precisions=["fp32", "int8-weight-only"],
        validation={"prompts": "prompts.txt", "continuation": 4},
        weight_only={
            "int8_smoothing": {"alpha": 0.75, "prompts": "calibration.txt"},
            "int8_rounding": {"method": "gptq", "prompts": "calibration.txt", "continuation": 6},
        },
        tolerances={"int8-weight-only": {"min_top1_agreement": 0.5}},
    )
    report = run_build(parse_spec(raw, base_dir=tmp_path), store=tmp_path / "store")
    produced = {v.precision: v for v in report.variants if v.status is VariantStatus.PRODUCED}
    variant = produced[Precision.INT8_WEIGHT_ONLY]
    record = read_manifest(variant.folder).weight_only  # type: ignore[arg-type]
    assert record is not None and record.algorithm == "smoothquant+gptq"
    manifest = (variant.folder / "manifest.json").read_text()  # type: ignore[operator]
    assert "GPTQ rounding of 14 weights" in manifest and "3 calibration prompts" in manifest


def test_greedy_continuation_through_the_cache_is_the_full_recompute(
    imported: GgufImport,
) -> None:
    from graylane.builder.runtime import open_runner
    from graylane.builder.validation import greedy_continue, greedy_generate

    runner = open_runner(imported.model, threads=1)
    prompts = [np.asarray([1, 5, 9, 2], np.int64), np.asarray([7], np.int64)]
    cached = greedy_continue(runner, runner.engine.io, prompts, 5)
    np.testing.assert_array_equal(cached, greedy_generate(runner, prompts, 5))


def test_the_4_bit_rung_keeps_q4_1_weights_on_their_own_grid(tmp_path: Path) -> None:
    """The fixture's attn_k projections are Q4_1: written exactly; the Q4_0/Q5_1/Q8_0/F16
    ones are not on a 0..15 grid of their blocks and are rounded to nearest."""
    from graylane.artifacts.manifest import read_manifest

    weight_only = {"int4_source_grid": True, "int4_accuracy_level": 1}
    int4 = read_manifest(_rung_built(tmp_path, "int4", weight_only))
    assert int4.weight_only is not None
    assert int4.weight_only.algorithm == "source-grid" and int4.weight_only.accuracy_level == 1
    assert any("2 of 14 weights were on 4-bit block grids" in n for n in int4.notes)


def test_the_8_bit_rung_keeps_its_measured_most_sensitive_layer_in_float(tmp_path: Path) -> None:
    """int8_sensitive_layers: each layer quantized alone on calibration text, the one that
    moves fp32's next-token distributions most kept in float and recorded."""
    from graylane.artifacts.manifest import read_manifest

    (tmp_path / "calibration.txt").write_text("The worker groups\nA broker\nTopics\n")
    weight_only = {
        "int8_smoothing": {"alpha": 0.75, "prompts": "calibration.txt"},
        "int8_sensitive_layers": {"count": 1, "prompts": "calibration.txt"},
    }
    folder = _rung_built(tmp_path, "int8-weight-only", weight_only)
    record = read_manifest(folder).weight_only
    assert record is not None
    assert record.algorithm == "smoothquant+sensitivity+rtn"
    assert record.sensitivity_prompts == 3
    assert len(record.sensitive_layers) == 1 and record.sensitive_layers[0] in (
        "layers.0",
        "layers.1",
    )
    layer = record.sensitive_layers[0]
    assert record.quantized_nodes == 7  # the other layer's seven projections
    assert len(record.kept_float) == 7
    assert all(n.startswith(f"{layer}.") for n in record.kept_float)
    manifest = (folder / "manifest.json").read_text()
    assert f"kept in float by measured sensitivity: {layer} (2 layers measured" in manifest


def _rung_built(tmp_path: Path, precision: str, weight_only: Mapping[str, object]) -> Path:
    """``graylane build`` of the fixture with fp32 and ``precision`` (weight-only options
    ``weight_only``; any agreement passes: the tests check what was built): its folder."""
    from graylane.artifacts.naming import Precision
    from graylane.builder.build import run_build
    from graylane.builder.spec import parse_spec
    from graylane.builder.variants import VariantStatus

    (tmp_path / "prompts.txt").write_text("Gray releases\nA canary\n")
    raw = {
        "model": "tiny",
        "version": "1.0.0",
        "strategy": "gguf",
        "source": {"gguf": str(GGUF)},
        "precisions": ["fp32", precision],
        "validation": {"prompts": "prompts.txt", "continuation": 4},
        "weight_only": dict(weight_only),
        "tolerances": {precision: {"min_top1_agreement": 0.0, "min_cosine": 0.0}},
        "partial_quantization": {"enabled": False},
        "tensorrt": {"enabled": False},
    }
    report = run_build(parse_spec(raw, base_dir=tmp_path), store=tmp_path / "store")
    produced = {v.precision: v for v in report.variants if v.status is VariantStatus.PRODUCED}
    folder = produced[Precision(precision)].folder
    assert folder is not None
    return folder
