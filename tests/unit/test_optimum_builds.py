"""``graylane build`` of decoders exported by Hugging Face Optimum, with their tokenizer.

The fixtures are those of ``tests/unit/test_optimum_decoders.py``. A build copies the
spec's ``tokenizer.json`` into every artifact and records it (sha256, EOS id) with
the model's info; a merged decoder is built from a copy whose mask axis is
corrected; an int8 variant the quantizers leave in float is refused, never
published as int8.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from graylane.artifacts.decoder_axes import MASK_AXIS
from graylane.artifacts.manifest import read_manifest
from graylane.artifacts.naming import Backend, Precision
from graylane.artifacts.verify import sha256_file
from graylane.builder.build import BuildError, BuildReport, VariantReport, run_build
from graylane.builder.spec import FileSource, SpecError, TokenizerSpec, load_spec, parse_spec
from graylane.builder.variants import VariantStatus
from tests.support.llm_fixtures import fixture

MERGED = fixture("gpt2-merged")


def merged_spec(**extra: object) -> dict[str, object]:
    return {
        "model": "merged-gpt2",
        "version": "1.0.0",
        "source": str(MERGED.model),
        "tokenizer": str(MERGED.tokenizer),
        "precisions": ["fp32", "int8", "int8-dynamic"],
        "calibration": {"generator": "text", "samples": 8, "batch_size": 8, "min_samples": 8},
        "validation": {"generator": "text", "samples": 8, "batch_size": 8, "seed": 1},
        "partial_quantization": {"enabled": False},
        "tensorrt": {"enabled": False},
        **extra,
    }


def variant(report: BuildReport, precision: Precision) -> VariantReport:
    return next(
        v for v in report.variants if v.precision is precision and v.backend is Backend.ONNXRUNTIME
    )


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> BuildReport:
    root = tmp_path_factory.mktemp("merged-build")
    return run_build(parse_spec(merged_spec(), root), store=root / "artifacts")


def test_the_spec_names_the_tokenizer_and_text_samples_need_it(tmp_path: Path) -> None:
    base = {"model": "m", "version": "1.0.0", "source": "model.onnx"}
    assert parse_spec({**base, "tokenizer": "tok/tokenizer.json"}, tmp_path).tokenizer == (
        TokenizerSpec(tmp_path / "tok" / "tokenizer.json")
    )
    own = parse_spec({**base, "tokenizer": {"path": "t.json", "eos_token_id": 2}}, tmp_path)
    assert own.tokenizer == TokenizerSpec(tmp_path / "t.json", 2)
    with pytest.raises(SpecError, match=r"tokenizer\.path"):
        parse_spec({**base, "tokenizer": "manifest.json"}, tmp_path)
    with pytest.raises(SpecError, match="'text' encodes with the model's tokenizer"):
        parse_spec({**base, "validation": {"generator": "text", "samples": 4}}, tmp_path)


def test_the_example_spec_names_the_gpt2_fixture_and_its_tokenizer() -> None:
    spec = load_spec(Path(__file__).resolve().parents[2] / "builder/examples/optimum-gpt2.yaml")
    gpt2 = fixture("gpt2")
    assert isinstance(spec.source, FileSource) and spec.source.path == gpt2.model
    assert spec.tokenizer == TokenizerSpec(gpt2.tokenizer)


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path: Path) -> None:
    spec = parse_spec({**merged_spec(), "precisions": ["fp32"], "vocab_size": 100}, tmp_path)
    with pytest.raises(BuildError, match="512 tokens, the model takes 100"):
        run_build(spec, store=tmp_path / "artifacts")


@pytest.mark.slow
def test_a_merged_decoder_builds_in_fp32_with_its_mask_axis_corrected(merged: BuildReport) -> None:
    fp32 = variant(merged, Precision.FP32)
    assert fp32.status is VariantStatus.PRODUCED and fp32.servable and fp32.folder is not None
    assert fp32.validation is not None and fp32.validation.passed
    assert any("attention_mask axis 1" in note for note in merged.notes), merged.notes
    model = onnx.load(str(fp32.folder / "model.onnx"), load_external_data=False)
    mask = next(v for v in model.graph.input if v.name == "attention_mask")
    assert mask.type.tensor_type.shape.dim[1].dim_param == MASK_AXIS
    # The version is the file the spec names, not the corrected copy.
    assert merged.source_sha256 == sha256_file(MERGED.model)


@pytest.mark.slow
def test_every_artifact_carries_the_tokenizer_its_manifest_records(merged: BuildReport) -> None:
    folder = variant(merged, Precision.FP32).folder
    assert folder is not None
    manifest = read_manifest(folder)
    assert manifest.model_info is not None and manifest.model_info.tokenizer is not None
    recorded = manifest.model_info.tokenizer
    assert (recorded.file, recorded.eos_token_id) == ("tokenizer.json", 0)
    assert manifest.model_info.max_seq_len == 128  # n_positions of the config.json beside it
    assert recorded.sha256 == sha256_file(MERGED.tokenizer) == sha256_file(folder / recorded.file)
    assert "tokenizer.json" in {f.path for f in manifest.files}  # verified before loading


@pytest.mark.slow
def test_int8_variants_the_quantizers_cannot_reach_into_the_branches_are_refused(
    merged: BuildReport,
) -> None:
    """Every MatMul of a merged decoder sits in an ``If`` branch: static calibration sees
    none of them, and dynamic quantization leaves them all in float."""
    static, dynamic = variant(merged, Precision.INT8), variant(merged, Precision.INT8_DYNAMIC)
    assert static.status is VariantStatus.FAILED and static.folder is None
    assert dynamic.status is VariantStatus.FAILED and dynamic.folder is None
    assert dynamic.reason is not None and "left every node in float" in dynamic.reason
    assert not merged.ok and not merged.registered
