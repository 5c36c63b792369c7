"""Validation sets with labels: the int8 limit is ≤ 1 pp of accuracy lost against fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from graylane.artifacts.build_info import Metrics, Tolerance
from graylane.artifacts.manifest import read_manifest
from graylane.artifacts.naming import Backend, Precision
from graylane.builder.build import BuildReport, run_build
from graylane.builder.samples import SampleError
from graylane.builder.spec import parse_spec
from graylane.builder.validation import check_tolerance, label_accuracy
from graylane.registry.repository import open_registry
from tests.support.settings import make_settings
from tests.support.small_models import TAGGER_CLASSES, TAGGER_VOCAB, write_tagger


def _metrics(top1: float, accuracy: float | None, reference: float | None) -> Metrics:
    return Metrics(
        max_abs=0.1,
        mean_rel=0.01,
        cosine=0.999,
        top1_agreement=top1,
        rows=100,
        accuracy=accuracy,
        reference_accuracy=reference,
    )


def test_accuracy_counts_labelled_unmasked_rows_only() -> None:
    logits = np.zeros((2, 3, 4), dtype=np.float32)
    logits[..., 1] = 1.0  # predicts class 1 everywhere
    labels = np.array([[1, 1, 2], [1, -100, 1]])
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    # counted: (0,0) ok, (0,1) ok, (0,2) wrong, (1,0) ok; -100 and the masked one are not
    assert label_accuracy([{"logits": logits}], [labels], [mask]) == pytest.approx(0.75)
    per_sample = np.array([1, 3])
    scores = np.eye(4, dtype=np.float32)[[1, 2]]
    assert label_accuracy([{"scores": scores}], [per_sample], [None]) == 0.5
    with pytest.raises(ValueError, match="leading shape"):
        label_accuracy([{"scores": scores}], [labels], [None])


def test_with_labels_the_accuracy_drop_replaces_top1_agreement() -> None:
    tolerance = Tolerance(min_top1_agreement=0.99, max_accuracy_drop=0.01)
    # 10 % of the argmaxes changed, but the task lost only half a point: within tolerance
    assert check_tolerance(_metrics(0.90, 0.895, 0.90), tolerance) == ()
    [failure] = check_tolerance(_metrics(0.999, 0.87, 0.90), tolerance)
    assert "3.00 pp below fp32" in failure and "limit 1 pp" in failure
    # without labels the agreement limit holds as before
    [failure] = check_tolerance(_metrics(0.90, None, None), tolerance)
    assert failure.startswith("top1_agreement 0.9000 < 0.99")


def _reference_predictions(model: Path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input_ids": ids})
    return np.asarray(logits).argmax(axis=-1)


def _build(tmp_path: Path, npz: Path) -> BuildReport:
    settings = make_settings("127.0.0.1:9", "labels", tmp_path)
    spec = {
        "model": "tagger",
        "version": "1.0.0",
        "source": "tagger.onnx",
        "task": "token-classification",
        "precisions": ["fp32", "fp16", "int8-dynamic"],
        "validation": {"npz": npz.name, "samples": 256, "batch_size": 32},
        "partial_quantization": {"enabled": False},
    }
    return run_build(
        parse_spec(spec, tmp_path),
        store=settings.artifact_dir,
        registry=open_registry(settings.db_url),
    )


def test_a_build_with_labelled_validation_judges_int8_by_accuracy(tmp_path: Path) -> None:
    model = write_tagger(tmp_path / "tagger.onnx")
    rng = np.random.default_rng(7)
    ids = rng.integers(0, TAGGER_VOCAB, size=(256, 12), dtype=np.int64)
    labels = _reference_predictions(model, ids)
    wrong = rng.random(labels.shape) < 0.2  # fp32 is right on about 80 % of the positions
    labels = np.where(wrong, (labels + 1) % TAGGER_CLASSES, labels)
    np.savez(tmp_path / "val.npz", input_ids=ids, labels=labels)

    report = _build(tmp_path, tmp_path / "val.npz")
    fp32_accuracy = 1.0 - float(wrong.mean())
    for precision in (Precision.FP16, Precision.INT8_DYNAMIC):
        variant = next(
            v
            for v in report.variants
            if v.precision is precision and v.backend is Backend.ONNXRUNTIME
        )
        validation = variant.validation
        assert validation is not None and validation.metrics is not None
        metrics = validation.metrics
        assert metrics.reference_accuracy == pytest.approx(fp32_accuracy)
        assert metrics.accuracy is not None
        drop = metrics.reference_accuracy - metrics.accuracy
        stored = read_manifest(variant.folder).validation  # type: ignore[arg-type, union-attr]
        assert stored is not None and stored.metrics == metrics  # kept in the manifest
        if precision is Precision.INT8_DYNAMIC:
            assert validation.tolerance.max_accuracy_drop == 0.01
            # the verdict follows the accuracy drop, not top-1 agreement
            assert validation.passed == (
                drop <= 0.01
                and not any("cosine" in f or "max_abs" in f for f in validation.failures)
            )
            assert not any(f.startswith("top1_agreement") for f in validation.failures)


def test_labels_must_be_integer_class_ids(tmp_path: Path) -> None:
    write_tagger(tmp_path / "tagger.onnx")
    ids = np.zeros((256, 4), dtype=np.int64)
    np.savez(tmp_path / "bad.npz", input_ids=ids, labels=np.zeros((256, 4), dtype=np.float32))
    with pytest.raises(SampleError, match="integer class ids"):
        _build(tmp_path, tmp_path / "bad.npz")
