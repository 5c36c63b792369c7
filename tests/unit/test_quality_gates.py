"""Quality gates without a broker: schemas that cannot be compared, the calibration-size
minimum, the 1 % int8 default, the partial-quantization spec and manifest record."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.artifacts.build_info import GroupSensitivity, PartialQuantization
from graylane.artifacts.manifest import partial_from_dict, partial_to_dict
from graylane.artifacts.naming import Backend, Precision
from graylane.builder.build import run_build
from graylane.builder.calibration import CalibrationTooSmall
from graylane.builder.consistency import (
    ConsistencyVerdict,
    ServedVariant,
    check_consistency,
    schema_differences,
)
from graylane.builder.samples import SampleSet
from graylane.builder.sensitivity import layer_groups
from graylane.builder.spec import (
    DEFAULT_MIN_CALIBRATION_SAMPLES,
    PartialQuantizationSpec,
    SpecError,
    default_tolerances,
    parse_spec,
)
from graylane.engine.signature import IOSignature, TensorSpec

DECODER = IOSignature(
    inputs=(
        TensorSpec("input_ids", "int64", ("batch", "seq")),
        TensorSpec("attention_mask", "int64", ("batch", "seq")),
    ),
    outputs=(TensorSpec("logits", "float32", ("batch", "seq", 258)),),
)


def test_identical_signatures_have_no_schema_differences() -> None:
    assert schema_differences(DECODER, DECODER) == ()


def test_incompatible_outputs_are_reported_and_not_compared(tmp_path: Path) -> None:
    tagger = IOSignature(
        inputs=DECODER.inputs, outputs=(TensorSpec("logits", "float32", ("batch", "seq", 15)),)
    )
    renamed = IOSignature(
        inputs=DECODER.inputs, outputs=(TensorSpec("scores", "float16", ("batch", 2)),)
    )
    assert schema_differences(DECODER, tagger) == ("output 'logits': axis 2 is 258 vs 15",)
    assert schema_differences(DECODER, renamed) == ("outputs differ: ['logits'] vs ['scores']",)
    missing = tmp_path / "never-loaded.onnx"  # an incompatible pair never runs
    base = ServedVariant("1.0.0", Precision.FP32, Backend.ONNXRUNTIME, missing, DECODER)
    cand = ServedVariant("2.0.0", Precision.FP32, Backend.ONNXRUNTIME, missing, tagger)
    report = check_consistency("m", base, cand, SampleSet(batches=(), digest=""))
    assert report.verdict is ConsistencyVerdict.INCOMPATIBLE and report.verdict.exit_code == 3
    assert report.outputs == () and report.schema_problems


def test_int8_defaults_allow_at_most_one_percent_disagreement() -> None:
    table = default_tolerances()
    assert table[Precision.INT8].min_top1_agreement == 0.99
    assert table[Precision.INT8_DYNAMIC].min_top1_agreement == 0.99


def _spec(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {
        "model": "m",
        "version": "1.0.0",
        "source": {"demo": "tiny"},
        "precisions": ["fp32", "int8"],
        "calibration": {"generator": "demo-text", "samples": 16, "seq_len": 16},
        "tensorrt": {"enabled": False},
        **extra,
    }


def test_spec_reads_the_calibration_minimum_and_the_partial_budget(tmp_path: Path) -> None:
    plain = parse_spec(_spec(tmp_path), tmp_path)
    assert plain.calibration_min_samples == DEFAULT_MIN_CALIBRATION_SAMPLES == 500
    assert plain.partial_quantization == PartialQuantizationSpec()
    raw = _spec(tmp_path, partial_quantization={"node_budget": 3, "enabled": False})
    raw["calibration"] = {"generator": "demo-text", "samples": 16, "min_samples": 16}
    spec = parse_spec(raw, tmp_path)
    assert spec.calibration_min_samples == 16
    assert spec.partial_quantization == PartialQuantizationSpec(enabled=False, node_budget=3)
    with pytest.raises(SpecError, match="partial_quantization"):
        parse_spec(_spec(tmp_path, partial_quantization={"budget": 3}), tmp_path)


@pytest.mark.slow
def test_the_builder_refuses_a_small_calibration_set_unless_forced(tmp_path: Path) -> None:
    spec = parse_spec(_spec(tmp_path), tmp_path)
    with pytest.raises(CalibrationTooSmall, match="16 samples, under the minimum of 500"):
        run_build(spec, store=tmp_path / "store")
    forced = run_build(spec, store=tmp_path / "store", force=True)
    int8 = next(v for v in forced.variants if v.precision is Precision.INT8)
    assert int8.calibration is not None and int8.calibration.samples == 16


def test_layer_groups_are_single_nodes_until_there_are_too_many() -> None:
    nodes = ["h0.attn.qkv.matmul_1", "h0.mlp.fc_in.matmul_2", "h1.attn.qkv.matmul_3", "lm_head"]
    assert layer_groups(nodes, 8) == [(n, (n,)) for n in nodes]
    assert layer_groups(nodes, 2) == [
        ("h0", ("h0.attn.qkv.matmul_1", "h0.mlp.fc_in.matmul_2")),
        ("h1", ("h1.attn.qkv.matmul_3",)),
        ("lm_head", ("lm_head",)),
    ]
    onnx_style = ["/model/layers.0/q_proj/MatMul", "/model/layers.1/q_proj/MatMul"]
    assert [g for g, _ in layer_groups(onnx_style, 1)] == ["layers.0", "layers.1"]


def test_the_partial_quantization_record_round_trips() -> None:
    record = PartialQuantization(
        full_failures=("top1_agreement 0.96 < 0.99",),
        full_top1_agreement=0.96,
        quantizable_nodes=13,
        node_budget=8,
        kept_float=("lm_head",),
        passed=True,
        trials=2,
        sensitivity=(GroupSensitivity("lm_head", ("lm_head",), 0.995, 0.9999),),
        fp32_ms=10.0,
        variant_ms=4.0,
        full_ms=3.5,
    )
    raw = partial_to_dict(record)
    assert raw is not None and raw["speedup_vs_fp32"] == 2.5
    assert partial_from_dict(raw) == record
    assert partial_from_dict(None) is None
