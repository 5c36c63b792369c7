"""Precision variants of the tiny demo GPT, and the int8 calibration cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from graylane.artifacts.build_info import CalibrationMethod
from graylane.artifacts.model_info import io_signature, metadata_int
from graylane.artifacts.naming import ONNX_PRECISIONS, Precision
from graylane.artifacts.verify import sha256_file
from graylane.builder.calibration import calibration_key
from graylane.builder.runtime import open_runner
from graylane.builder.samples import SampleSet, load_samples
from graylane.builder.spec import DataSpec, Generator, GeneratorData
from graylane.builder.variants import VariantInputs, VariantStatus, produce_variant
from graylane.models.demo_gpt import write_demo_gpt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("model") / "tiny.onnx", "tiny", 0)


@pytest.fixture(scope="module")
def calibration(tiny: Path) -> SampleSet:
    model = onnx.load(str(tiny), load_external_data=False)
    spec = DataSpec(GeneratorData(Generator.DEMO_TEXT, seq_len=32), samples=16, batch_size=8)
    return load_samples(spec, io_signature(model), metadata_int(model, "max_seq_len"))


def _inputs(tiny: Path, work: Path, calibration: SampleSet | None, **kw: object) -> VariantInputs:
    return VariantInputs(
        source=tiny,
        source_sha256=sha256_file(tiny),
        work_dir=work,
        cache_dir=work / "cache",
        calibration=calibration,
        **kw,  # type: ignore[arg-type]
    )


def _op_types(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("precision", ONNX_PRECISIONS, ids=lambda p: p.value)
def test_each_variant_is_produced_and_runs_in_onnxruntime(
    precision: Precision, tiny: Path, calibration: SampleSet, tmp_path: Path
) -> None:
    outcome = produce_variant(
        precision, _inputs(tiny, tmp_path, calibration, method=CalibrationMethod.MINMAX)
    )
    assert outcome.status is VariantStatus.PRODUCED, outcome.reason
    assert outcome.path is not None and outcome.files == (outcome.path,)

    ids = np.array([[256, 72, 105, 33, 257]], dtype=np.int64)
    out = open_runner(outcome.path)({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    assert out["logits"].shape == (1, 5, 258)
    assert out["logits"].dtype == np.float32  # IO types are kept in every variant

    ops = _op_types(outcome.path)
    if precision is Precision.FP16:
        model = onnx.load(str(outcome.path))
        weights = {i.name: i.data_type for i in model.graph.initializer}
        assert weights["wte"] == onnx.TensorProto.FLOAT16
    elif precision is Precision.INT8:
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops
        assert outcome.calibration is not None
        assert outcome.calibration.samples == 16
    elif precision is Precision.INT8_DYNAMIC:
        assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops


def test_int8_without_calibration_samples_is_unsupported(tiny: Path, tmp_path: Path) -> None:
    outcome = produce_variant(Precision.INT8, _inputs(tiny, tmp_path, None))
    assert outcome.status is VariantStatus.UNSUPPORTED
    assert outcome.reason is not None and "calibration" in outcome.reason


def test_a_broken_source_is_reported_as_failed(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    outcome = produce_variant(Precision.FP16, _inputs(broken, tmp_path, None))
    assert outcome.status is VariantStatus.FAILED
    assert outcome.reason


@pytest.mark.slow
def test_calibration_cache_is_reused(tiny: Path, calibration: SampleSet, tmp_path: Path) -> None:
    inputs = _inputs(tiny, tmp_path, calibration, method=CalibrationMethod.ENTROPY)
    first = produce_variant(Precision.INT8, inputs)
    second = produce_variant(Precision.INT8, inputs)
    assert first.calibration is not None and second.calibration is not None
    assert not first.calibration.cache_hit
    assert second.calibration.cache_hit
    assert second.calibration.cache_key == first.calibration.cache_key
    assert second.calibration.duration_s < first.calibration.duration_s
    assert first.path is not None and second.path is not None
    # Same ranges, same quantized graph.
    assert sha256_file(first.path) == sha256_file(second.path)


def test_calibration_key_changes_with_model_data_and_method() -> None:
    base = calibration_key("a" * 64, "d1", CalibrationMethod.ENTROPY, 99.999)
    assert base == calibration_key("a" * 64, "d1", CalibrationMethod.ENTROPY, 99.999)
    assert base != calibration_key("b" * 64, "d1", CalibrationMethod.ENTROPY, 99.999)
    assert base != calibration_key("a" * 64, "d2", CalibrationMethod.ENTROPY, 99.999)
    assert base != calibration_key("a" * 64, "d1", CalibrationMethod.MINMAX, 99.999)
    assert base != calibration_key("a" * 64, "d1", CalibrationMethod.ENTROPY, 99.999, ("MatMul",))
    pct = calibration_key("a" * 64, "d1", CalibrationMethod.PERCENTILE, 99.9)
    assert pct != calibration_key("a" * 64, "d1", CalibrationMethod.PERCENTILE, 99.99)


def test_sample_digest_tracks_content(tiny: Path) -> None:
    model = onnx.load(str(tiny), load_external_data=False)
    sig = io_signature(model)
    text = GeneratorData(Generator.DEMO_TEXT, seq_len=16)
    a = load_samples(DataSpec(text, samples=4, seed=0), sig, 256)
    b = load_samples(DataSpec(text, samples=4, seed=0), sig, 256)
    c = load_samples(DataSpec(text, samples=4, seed=1), sig, 256)
    assert a.digest == b.digest != c.digest
    assert a.count == 4


def test_npz_samples(tiny: Path, tmp_path: Path) -> None:
    from graylane.builder.samples import SampleError
    from graylane.builder.spec import NpzData

    model = onnx.load(str(tiny), load_external_data=False)
    sig = io_signature(model)
    ids = np.random.default_rng(0).integers(0, 256, size=(6, 12), dtype=np.int64)
    path = tmp_path / "calib.npz"
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids))
    samples = load_samples(DataSpec(NpzData(path), samples=5, batch_size=2), sig, 256)
    assert samples.count == 5 and len(samples.batches) == 3
    with pytest.raises(SampleError, match="holds 6 samples"):
        load_samples(DataSpec(NpzData(path), samples=7), sig, 256)
    np.savez(path, input_ids=ids)
    with pytest.raises(SampleError, match="attention_mask"):
        load_samples(DataSpec(NpzData(path), samples=2), sig, 256)


def test_fp16_keeps_ops_without_a_cpu_kernel_in_fp32(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import graylane.builder.variants as variants
    from graylane.builder.runtime import OrtRunner, VariantLoadError

    real = open_runner
    refusals: list[str] = []

    def picky_runtime(path: Path, threads: int | None = None) -> OrtRunner:
        # Pretend this CPU build has no float16 Softmax: refuse the first fp16 file.
        if path.parent.name == "fp16" and not refusals:
            refusals.append("Softmax")
            raise VariantLoadError("Could not find an implementation for Softmax(13) node")
        return real(path, threads)

    monkeypatch.setattr(variants, "open_runner", picky_runtime)
    outcome = produce_variant(Precision.FP16, _inputs(tiny, tmp_path, None))
    assert outcome.status is VariantStatus.PRODUCED, outcome.reason
    assert outcome.notes[0] == "kept in fp32: Softmax"
    assert refusals == ["Softmax"]
    assert outcome.path is not None
    model = onnx.shape_inference.infer_shapes(onnx.load(str(outcome.path)))
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    softmax_outputs = [n.output[0] for n in model.graph.node if n.op_type == "Softmax"]
    assert softmax_outputs
    assert all(types[name] == onnx.TensorProto.FLOAT for name in softmax_outputs)
