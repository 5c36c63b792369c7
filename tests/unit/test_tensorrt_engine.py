"""TensorRT backend: import-time behaviour everywhere, execution only on a GPU host."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from graylane.artifacts.build_info import InputShapeRange, ShapeProfile
from graylane.artifacts.model_info import io_signature
from graylane.artifacts.naming import Precision
from graylane.artifacts.verify import sha256_file
from graylane.builder.spec import TensorRTOptions
from graylane.builder.tensorrt_build import EngineRequest, build_engine
from graylane.builder.variants import VariantStatus
from graylane.engine import tensorrt as backend
from graylane.engine.errors import EngineLoadError, IncompatibleEngineError, InvalidInputError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.batch_generation import run_generate
from graylane.engine_worker.forward import run_forward
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.models.byte_vocab import BOS_ID, encode_text
from graylane.models.demo_gpt import build_demo_gpt

# (min, opt, max) of [batch, seq] per optimization profile, like worker buckets.
PROFILES = [((1, 1), (4, 16), (4, 16)), ((1, 17), (8, 64), (8, 64))]


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import <module>`` fail here, whatever is installed (None in sys.modules)."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _stand_in(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_tensorrt_version_is_read_from_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(monkeypatch, "tensorrt", __version__="10.13.0.35")
    assert backend.tensorrt_version() == "10.13.0.35"
    _stand_in(monkeypatch, "tensorrt", __version__="11.0.0")
    assert backend.tensorrt_version() == "11.0.0"
    _without(monkeypatch, "tensorrt")
    assert backend.tensorrt_version() is None


def test_compute_capability_from_pycuda_else_cuda_python_else_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Device:
        def __init__(self, device_id: int) -> None:
            if device_id != 0:
                raise RuntimeError("invalid device ordinal")

        def compute_capability(self) -> tuple[int, int]:
            return (8, 6)

    driver = _stand_in(monkeypatch, "pycuda.driver", init=lambda: None, Device=Device)
    _stand_in(monkeypatch, "pycuda", driver=driver)
    assert backend.gpu_compute_capability() == (8, 6)
    # pycuda without that device, and no cuda-python: no GPU.
    _without(monkeypatch, "cuda", "cuda.bindings", "cuda.bindings.runtime")
    assert backend.gpu_compute_capability(1) is None

    class Attr:
        cudaDevAttrComputeCapabilityMajor = "major"
        cudaDevAttrComputeCapabilityMinor = "minor"

    class Err:
        cudaSuccess = 0

    values = {"major": 9, "minor": 0}
    runtime = _stand_in(
        monkeypatch,
        "cuda.bindings.runtime",
        cudaDeviceAttr=Attr,
        cudaError_t=Err,
        cudaDeviceGetAttribute=lambda attr, device: (0, values[attr]),
    )
    _without(monkeypatch, "pycuda", "pycuda.driver")
    bindings = _stand_in(monkeypatch, "cuda.bindings", runtime=runtime)
    _stand_in(monkeypatch, "cuda", bindings=bindings)
    assert backend.gpu_compute_capability() == (9, 0)
    # a failing attribute query reads as no GPU
    runtime.cudaDeviceGetAttribute = lambda attr, device: (1 if attr == "minor" else 0, 9)  # type: ignore[attr-defined]
    assert backend.gpu_compute_capability() is None
    _without(monkeypatch, "cuda", "cuda.bindings", "cuda.bindings.runtime")
    assert backend.gpu_compute_capability() is None


def test_load_without_tensorrt_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "tensorrt")
    with pytest.raises(EngineLoadError, match="TensorRT backend unavailable"):
        backend.TensorRTEngine.load(b"plan", "fp16")


def test_load_checks_the_plan_target_before_touching_the_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With TensorRT importable, a plan for another GPU or TensorRT is refused as such."""

    def no_gpu_calls() -> None:
        raise AssertionError("the GPU was touched before the target check")

    driver = _stand_in(monkeypatch, "pycuda.driver", init=no_gpu_calls)
    _stand_in(monkeypatch, "pycuda", driver=driver)
    _stand_in(monkeypatch, "tensorrt", __version__="10.13.0")
    monkeypatch.setattr(backend, "gpu_compute_capability", lambda device_id=0: (8, 9))
    wrong = backend.PlanTarget(compute_capability=(9, 0), tensorrt_version="10.13.0")
    with pytest.raises(IncompatibleEngineError, match=r"compute capability \(9, 0\)"):
        backend.TensorRTEngine.load(b"unused", "fp32", expected=wrong)
    other = backend.PlanTarget(compute_capability=(8, 9), tensorrt_version="10.12.0")
    with pytest.raises(IncompatibleEngineError, match=r"TensorRT 10\.12\.0, this host has 10\.13"):
        backend.TensorRTEngine.load(b"unused", "fp32", expected=other)


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


@pytest.fixture(scope="module")
def engines(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[backend.TensorRTEngine, OnnxRuntimeEngine]]:
    """The tiny demo GPT compiled by the builder's own ``build_engine`` (fp32, two profiles)."""
    pytest.importorskip("tensorrt")
    pytest.importorskip("pycuda.driver")
    if backend.gpu_compute_capability() is None:
        pytest.skip("no CUDA GPU")
    folder = tmp_path_factory.mktemp("trt")
    model = build_demo_gpt("tiny", seed=0)
    onnx_path = folder / "model.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    profiles = tuple(
        ShapeProfile(
            f"p{i}",
            tuple(InputShapeRange(n, lo, opt, hi) for n in ("input_ids", "attention_mask")),
        )
        for i, (lo, opt, hi) in enumerate(PROFILES)
    )
    outcome = build_engine(
        EngineRequest(
            precision=Precision.FP32,
            onnx_path=onnx_path,
            onnx_sha256=sha256_file(onnx_path),
            signature=io_signature(model),
            profiles=profiles,
            options=TensorRTOptions(),
            engine_cache_dir=folder / "engines",
            timing_cache_dir=folder / "timing",
        )
    )
    assert outcome.status is VariantStatus.PRODUCED and outcome.path is not None, outcome.reason
    engine = backend.TensorRTEngine.load(outcome.path, "fp32", name="demo")
    reference = OnnxRuntimeEngine.load(
        model.SerializeToString(), "fp32", providers=["CPUExecutionProvider"]
    )
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
def test_corrupt_plan_and_wrong_target_are_refused_on_a_real_gpu(
    engines: tuple[backend.TensorRTEngine, OnnxRuntimeEngine],
) -> None:
    with pytest.raises(IncompatibleEngineError, match="could not deserialize"):
        backend.TensorRTEngine.load(b"\x00" * 64, "fp32")
    version = backend.tensorrt_version()
    assert version is not None and backend.gpu_compute_capability() is not None
    wrong = backend.PlanTarget(compute_capability=(1, 0), tensorrt_version=version)
    with pytest.raises(IncompatibleEngineError, match=r"compute capability \(1, 0\)"):
        backend.TensorRTEngine.load(b"unused", "fp32", expected=wrong)
