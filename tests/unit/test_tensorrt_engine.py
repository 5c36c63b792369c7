"""TensorRT backend: import-time behaviour everywhere, execution only on a GPU host."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from graylane.engine import (
    EngineLoadError,
    IncompatibleEngineError,
    InferenceEngine,
    InvalidInputError,
)
from graylane.engine import tensorrt as backend
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.batching import BucketPolicy
from graylane.engine_worker.tasks import run_forward, run_generate
from graylane.models.demo_gpt import BOS_ID, build_demo_gpt, encode_text

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAS_CUDA_BINDINGS = any(importlib.util.find_spec(name) is not None for name in ("pycuda", "cuda"))

# (min, opt, max) of [batch, seq] per optimization profile, like worker buckets.
PROFILES = [((1, 1), (4, 16), (4, 16)), ((1, 17), (8, 64), (8, 64))]


def test_tensorrt_version_is_the_installed_one_or_none() -> None:
    expected = str(importlib.import_module("tensorrt").__version__) if HAS_TENSORRT else None
    assert backend.tensorrt_version() == expected


@pytest.mark.skipif(HAS_CUDA_BINDINGS, reason="checks the behaviour without CUDA bindings")
def test_no_compute_capability_without_cuda_bindings() -> None:
    assert backend.gpu_compute_capability() is None


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")
def test_load_without_tensorrt_is_a_load_error() -> None:
    with pytest.raises(EngineLoadError, match="TensorRT backend unavailable"):
        backend.TensorRTEngine.load(b"plan", "fp16")


def _host(
    monkeypatch: pytest.MonkeyPatch, cc: tuple[int, int] | None, trt_version: str | None
) -> None:
    """Pretend this host has GPU `cc` and TensorRT `trt_version` (None: absent)."""
    monkeypatch.setattr(backend, "gpu_compute_capability", lambda device_id=0: cc)
    monkeypatch.setattr(backend, "tensorrt_version", lambda: trt_version)


HERE = backend.PlanTarget(compute_capability=(9, 0), tensorrt_version="10.13.0")


def test_plan_target_matching_this_host_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    _host(monkeypatch, (9, 0), "10.13.0")
    assert backend.check_plan_target(HERE) is None  # raises when refused


def test_plan_target_compute_capability_mismatch_is_incompatible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _host(monkeypatch, (8, 6), "10.13.0")
    with pytest.raises(IncompatibleEngineError, match=r"compute capability \(9, 0\).*is \(8, 6\)"):
        backend.check_plan_target(HERE)


def test_plan_target_tensorrt_version_mismatch_is_incompatible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _host(monkeypatch, (9, 0), "10.14.1")
    refused = r"TensorRT 10\.13\.0, this host has 10\.14\.1"
    with pytest.raises(IncompatibleEngineError, match=refused):
        backend.check_plan_target(HERE)


def test_plan_target_without_tensorrt_or_gpu_is_incompatible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _host(monkeypatch, (9, 0), None)
    with pytest.raises(IncompatibleEngineError, match="TensorRT is not installed"):
        backend.check_plan_target(HERE)
    _host(monkeypatch, None, "10.13.0")
    with pytest.raises(IncompatibleEngineError, match="no CUDA device 0"):
        backend.check_plan_target(HERE)


def _build_plan(trt: Any, model: bytes) -> bytes:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly_typed is not None:
        flags |= 1 << int(strongly_typed)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise AssertionError(f"ONNX parse failed: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 30)
    if hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # compare fp32 against ONNX Runtime
    for low, opt, high in PROFILES:
        profile = builder.create_optimization_profile()
        for name in ("input_ids", "attention_mask"):
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None, "TensorRT build failed"
    return bytes(plan)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[backend.TensorRTEngine, OnnxRuntimeEngine]]:
    trt = pytest.importorskip("tensorrt")
    pytest.importorskip("pycuda.driver")
    if backend.gpu_compute_capability() is None:
        pytest.skip("no CUDA GPU")
    model = build_demo_gpt("tiny", seed=0).SerializeToString()
    engine = backend.TensorRTEngine.load(_build_plan(trt, model), "fp32", name="demo")
    reference = OnnxRuntimeEngine.load(model, "fp32", providers=["CPUExecutionProvider"])
    yield engine, reference
    engine.close()


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(batch * 100 + seq).integers(0, 256, (batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


@pytest.mark.gpu
def test_signature_and_profiles(engines: tuple[backend.TensorRTEngine, OnnxRuntimeEngine]) -> None:
    engine, _ = engines
    assert isinstance(engine, InferenceEngine)
    assert set(engine.io.input_names) == {"input_ids", "attention_mask"}
    assert engine.io.output("logits").dtype == np.float32
    assert engine.num_profiles == len(PROFILES)
    assert engine.profile_ranges(1)["input_ids"] == ((1, 17), (8, 64))


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (3, 16), (2, 17), (8, 64), (4, 9)])
def test_matches_onnxruntime_on_every_profile(
    engines: tuple[backend.TensorRTEngine, OnnxRuntimeEngine], batch: int, seq: int
) -> None:
    engine, reference = engines
    feeds = _feeds(batch, seq)
    got = engine.run(feeds)["logits"]
    assert got.shape == (batch, seq, 258)
    np.testing.assert_allclose(got, reference.run(feeds)["logits"], atol=2e-3, rtol=1e-3)


@pytest.mark.gpu
def test_shapes_outside_every_profile_are_invalid_input(
    engines: tuple[backend.TensorRTEngine, OnnxRuntimeEngine],
) -> None:
    engine, _ = engines
    with pytest.raises(InvalidInputError):
        engine.run(_feeds(1, 65))
    with pytest.raises(InvalidInputError):
        engine.run(_feeds(9, 8))


@pytest.mark.gpu
def test_bucketed_tasks_agree_with_onnxruntime(
    engines: tuple[backend.TensorRTEngine, OnnxRuntimeEngine],
) -> None:
    engine, reference = engines
    policy = BucketPolicy(buckets=(16, 64), max_batch_size=4)
    prompts = [encode_text(t, add_bos=True) for t in ("hi", "a longer prompt than sixteen", "x")]
    requests = [{"input_ids": np.array([p], dtype=np.int64)} for p in prompts]
    for got, want in zip(
        run_forward(engine, requests, policy=policy), run_forward(reference, requests), strict=True
    ):
        np.testing.assert_allclose(got["logits"], want["logits"], atol=2e-3, rtol=1e-3)
    generated = run_generate(engine, [[BOS_ID, 72, 105]], 5, None, 64, policy=policy)
    assert len(generated[0].tokens) == 5


@pytest.mark.gpu
def test_corrupt_plan_and_wrong_target_are_refused(
    engines: tuple[backend.TensorRTEngine, OnnxRuntimeEngine],
) -> None:
    with pytest.raises(IncompatibleEngineError, match="could not deserialize"):
        backend.TensorRTEngine.load(b"\x00" * 64, "fp32")
    version = backend.tensorrt_version()
    assert version is not None
    wrong = backend.PlanTarget(compute_capability=(1, 0), tensorrt_version=version)
    with pytest.raises(IncompatibleEngineError, match=r"compute capability \(1, 0\)"):
        backend.TensorRTEngine.load(b"unused", "fp32", expected=wrong)
