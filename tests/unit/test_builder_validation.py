"""Validation metrics against the fp32 reference."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from graylane.artifacts.build_info import Metrics, Tolerance
from graylane.artifacts.model_info import io_signature, metadata_int
from graylane.artifacts.naming import Precision
from graylane.artifacts.verify import sha256_file
from graylane.builder.runtime import open_runner
from graylane.builder.samples import SampleSet, load_samples
from graylane.builder.spec import (
    DataSpec,
    GenerationCheck,
    Generator,
    GeneratorData,
    default_tolerances,
)
from graylane.builder.validation import (
    ReferenceOutputs,
    check_tolerance,
    compare_outputs,
    greedy_generate,
    reference_outputs,
    token_agreement,
    validate_variant,
)
from graylane.builder.variants import VariantInputs, VariantStatus, produce_variant
from graylane.models.byte_vocab import PAD_ID
from graylane.models.demo_gpt import write_demo_gpt


def test_identical_outputs_are_perfect() -> None:
    ref = [{"logits": np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)}]
    m = compare_outputs(ref, ref, [None])
    assert (m.max_abs, m.mean_rel, m.top1_agreement, m.rows) == (0.0, 0.0, 1.0, 6)
    assert m.cosine == pytest.approx(1.0)


def test_padded_positions_are_ignored() -> None:
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((2, 4, 6)).astype(np.float32)
    cand = ref.copy()
    cand[:, 3] = -ref[:, 3]  # garbage where the mask is 0
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 0]])
    m = compare_outputs([{"logits": ref}], [{"logits": cand}], [mask])
    assert m.rows == 6 and m.max_abs == 0.0 and m.top1_agreement == 1.0
    unmasked = compare_outputs([{"logits": ref}], [{"logits": cand}], [None])
    assert unmasked.top1_agreement < 1.0 and unmasked.cosine < 1.0


def test_metric_definitions() -> None:
    ref = np.array([[[1.0, 0.0], [0.0, 2.0]]], dtype=np.float32)
    cand = np.array([[[1.0, 0.5], [1.0, 0.0]]], dtype=np.float32)
    m = compare_outputs([{"y": ref}], [{"y": cand}], [None])
    assert m.max_abs == pytest.approx(2.0)
    assert m.mean_rel == pytest.approx((0.5 + 1.0 + 2.0) / 3.0)
    assert m.top1_agreement == 0.5
    assert m.cosine == pytest.approx((1 / np.sqrt(1.25) + 0.0) / 2)


def test_token_agreement_prefix_and_overall() -> None:
    ref = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    cand = np.array([[1, 2, 9, 4], [5, 6, 7, 8]])
    prefix, overall = token_agreement(ref, cand)
    assert prefix == pytest.approx((0.5 + 1.0) / 2)
    assert overall == pytest.approx(7 / 8)


def test_check_tolerance_lists_every_missed_limit() -> None:
    metrics = Metrics(
        max_abs=0.5, mean_rel=0.1, cosine=0.9, top1_agreement=0.7, rows=10, token_agreement=0.2
    )
    failures = check_tolerance(
        metrics,
        Tolerance(max_abs=0.1, min_cosine=0.99, min_top1_agreement=0.9, min_token_agreement=0.5),
    )
    assert [f.split()[0] for f in failures] == [
        "max_abs",
        "cosine",
        "top1_agreement",
        "token_agreement",
    ]
    assert check_tolerance(metrics, Tolerance()) == ()


def _next_token_model(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Logits that favour (token + 1) mod 10 at every position."""
    ids = feeds["input_ids"]
    logits = np.zeros((*ids.shape, 10), dtype=np.float32)
    np.put_along_axis(logits, ((ids + 1) % 10)[..., None], 1.0, axis=-1)
    return {"logits": logits}


def test_greedy_generation_with_right_padding_matches_single_prompts() -> None:
    prompts = [np.array([3]), np.array([1, 2, 7, 4, 5])]
    batched = greedy_generate(_next_token_model, prompts, 4, pad_id=0)
    assert batched.tolist() == [[4, 5, 6, 7], [6, 7, 8, 9]]
    for prompt, row in zip(prompts, batched, strict=True):
        assert greedy_generate(_next_token_model, [prompt], 4).tolist() == [row.tolist()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("model") / "tiny.onnx", "tiny", 0)


@pytest.fixture(scope="module")
def held_out(tiny: Path) -> SampleSet:
    model = onnx.load(str(tiny), load_external_data=False)
    spec = DataSpec(
        GeneratorData(Generator.DEMO_TEXT, seq_len=32), samples=16, seed=1, batch_size=8
    )
    return load_samples(spec, io_signature(model), metadata_int(model, "max_seq_len"))


def _reference(tiny: Path, held_out: SampleSet) -> ReferenceOutputs:
    model = onnx.load(str(tiny), load_external_data=False)
    return reference_outputs(
        open_runner(tiny), held_out, io_signature(model), GenerationCheck(4, 8), 256, PAD_ID
    )


def test_fp16_passes_its_default_tolerance(tiny: Path, held_out: SampleSet, tmp_path: Path) -> None:
    outcome = produce_variant(
        Precision.FP16,
        VariantInputs(tiny, sha256_file(tiny), tmp_path, tmp_path / "cache"),
    )
    assert outcome.status is VariantStatus.PRODUCED and outcome.path is not None
    result = validate_variant(
        Precision.FP16,
        open_runner(outcome.path),
        _reference(tiny, held_out),
        held_out,
        default_tolerances()[Precision.FP16],
        PAD_ID,
    )
    assert result.passed, result.failures
    assert result.metrics is not None
    assert result.metrics.cosine > 0.999 and result.metrics.token_agreement == 1.0


def test_a_corrupted_variant_fails(tiny: Path, held_out: SampleSet, tmp_path: Path) -> None:
    model = onnx.load(str(tiny))
    for init in model.graph.initializer:
        if init.name == "lm_head.weight":
            weights = numpy_helper.to_array(init)
            noisy = weights + np.random.default_rng(0).standard_normal(weights.shape) * 0.2
            init.CopyFrom(numpy_helper.from_array(noisy.astype(np.float32), init.name))
    corrupted = tmp_path / "corrupted.onnx"
    onnx.save(model, str(corrupted))
    result = validate_variant(
        Precision.FP16,
        open_runner(corrupted),
        _reference(tiny, held_out),
        held_out,
        default_tolerances()[Precision.FP16],
        PAD_ID,
    )
    assert not result.passed
    assert any(f.startswith("cosine") for f in result.failures)
    assert any(f.startswith("top1_agreement") for f in result.failures)


def test_a_variant_that_cannot_run_is_a_failed_validation(tiny: Path, held_out: SampleSet) -> None:
    def broken(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise RuntimeError("kernel exploded")

    result = validate_variant(
        Precision.INT8, broken, _reference(tiny, held_out), held_out, Tolerance(), PAD_ID
    )
    assert not result.passed
    assert result.error == "kernel exploded"


def test_a_decoders_kv_cache_outputs_are_not_judged() -> None:
    """Regression (issue 33): the argmax of ``present.*`` key vectors counted as a top-1
    agreement, and being the worst it was the decoder variant's (0.87 for SmolLM2's
    int8-weight-only, whose logits agree 0.97)."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((1, 5, 11)).astype(np.float32)
    keys = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    reference = [{"logits": logits, "present.0.key": keys}]
    candidate = [{"logits": logits, "present.0.key": keys[..., ::-1].copy()}]
    metrics = compare_outputs(reference, candidate, [np.ones((1, 5), dtype=np.int64)])
    assert metrics.top1_agreement == 1.0 and metrics.max_abs == 0.0
