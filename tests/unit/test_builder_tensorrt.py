"""TensorRT engine building: plain refusal without TensorRT, caching, and the builder calls."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import graylane.builder.tensorrt_build as tb
from graylane.artifacts.build_info import HardwareCompatibility, InputShapeRange, ShapeProfile
from graylane.artifacts.manifest import GpuInfo
from graylane.artifacts.naming import Precision
from graylane.builder.spec import TensorRTOptions
from graylane.builder.variants import VariantStatus
from graylane.engine.signature import IOSignature, TensorSpec

SIGNATURE = IOSignature(
    inputs=(
        TensorSpec("input_ids", "int64", ("batch", "seq")),
        TensorSpec("attention_mask", "int64", ("batch", "seq")),
    ),
    outputs=(TensorSpec("logits", "float32", ("batch", "seq", 258)),),
)
PROFILE = ShapeProfile(
    "short",
    tuple(
        InputShapeRange(name, (1, 1), (4, 16), (8, 32)) for name in ("input_ids", "attention_mask")
    ),
)
GPU = GpuInfo("NVIDIA H100", "9.0")


def _request(tmp_path: Path, precision: Precision = Precision.FP16, **kw: Any) -> tb.EngineRequest:
    onnx_path = tmp_path / "model.onnx"
    onnx_path.write_bytes(b"onnx")
    fields: dict[str, Any] = {
        "precision": precision,
        "onnx_path": onnx_path,
        "onnx_sha256": "a" * 64,
        "signature": SIGNATURE,
        "profiles": (PROFILE,),
        "options": TensorRTOptions(),
        "engine_cache_dir": tmp_path / "engines",
        "timing_cache_dir": tmp_path / "timing",
    }
    fields.update(kw)
    return tb.EngineRequest(**fields)


def test_without_tensorrt_the_reason_is_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorrt" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(tb, "detect_gpu", lambda: GPU)  # a GPU does not make TensorRT appear
    assert tb.tensorrt_unavailable_reason() == "tensorrt is not installed"
    outcome = tb.build_engine(_request(tmp_path))
    assert outcome.status is VariantStatus.UNSUPPORTED
    assert outcome.reason == "TensorRT engines not built: tensorrt is not installed"


def test_no_gpu_is_said_plainly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(tb, "detect_gpu", lambda: None)
    assert tb.tensorrt_unavailable_reason() == "no CUDA GPU found"


def test_int8_dynamic_is_not_a_tensorrt_variant(tmp_path: Path) -> None:
    outcome = tb.build_engine(_request(tmp_path, Precision.INT8_DYNAMIC))
    assert outcome.status is VariantStatus.UNSUPPORTED
    assert outcome.reason is not None and "Q/DQ int8" in outcome.reason


def test_engine_cache_key_covers_every_input() -> None:
    opts = TensorRTOptions()
    base = tb.engine_cache_key("a", Precision.FP16, [PROFILE], "10.13.0", "9.0", opts)
    other_profile = ShapeProfile("short", (InputShapeRange("input_ids", (1, 1), (4, 16), (8, 64)),))
    variants = [
        tb.engine_cache_key("b", Precision.FP16, [PROFILE], "10.13.0", "9.0", opts),
        tb.engine_cache_key("a", Precision.INT8, [PROFILE], "10.13.0", "9.0", opts),
        tb.engine_cache_key("a", Precision.FP16, [other_profile], "10.13.0", "9.0", opts),
        tb.engine_cache_key("a", Precision.FP16, [PROFILE], "10.14.1", "9.0", opts),
        tb.engine_cache_key("a", Precision.FP16, [PROFILE], "10.13.0", "8.6", opts),
        tb.engine_cache_key(
            "a",
            Precision.FP16,
            [PROFILE],
            "10.13.0",
            "9.0",
            TensorRTOptions(hardware_compatibility=HardwareCompatibility.AMPERE_PLUS),
        ),
    ]
    assert len({base, *variants}) == len(variants) + 1


class _FakeTensorRT:
    """Records the builder calls the real TensorRT Python API would receive."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        fake = types.ModuleType("tensorrt")
        calls = self.calls

        class Logger:
            WARNING = 2

            def __init__(self, level: int) -> None:
                pass

        class Flag:
            STRONGLY_TYPED = 5

        class MemoryPoolType:
            WORKSPACE = "workspace"

        class BuilderFlag:
            TF32 = "tf32"

        class HardwareCompatibilityLevel:
            AMPERE_PLUS = "ampere_plus"
            SAME_COMPUTE_CAPABILITY = "same_cc"

        class TimingCache:
            def __init__(self, data: bytes) -> None:
                self.data = data

            def serialize(self) -> bytes:
                return self.data + b"+timing"

        class Profile:
            def set_shape(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
                calls.append(("set_shape", (name, tuple(lo), tuple(opt), tuple(hi))))

        class Config:
            def __init__(self) -> None:
                self._cache: TimingCache | None = None
                self.hardware_compatibility_level = None

            def set_memory_pool_limit(self, pool: str, size: int) -> None:
                calls.append(("pool", (pool, size)))

            def clear_flag(self, flag: str) -> None:
                calls.append(("clear_flag", flag))

            def add_optimization_profile(self, profile: Profile) -> None:
                calls.append(("add_profile", None))

            def create_timing_cache(self, data: bytes) -> TimingCache:
                calls.append(("create_timing_cache", data))
                return TimingCache(data)

            def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> None:
                calls.append(("set_timing_cache", ignore_mismatch))
                self._cache = cache

            def get_timing_cache(self) -> TimingCache:
                if self._cache is None:
                    raise AssertionError("timing cache was never set")
                return self._cache

        class Builder:
            def __init__(self, logger: Logger) -> None:
                calls.append(("builder", None))

            def create_network(self, flags: int) -> object:
                calls.append(("create_network", flags))
                return object()

            def create_builder_config(self) -> Config:
                return Config()

            def create_optimization_profile(self) -> Profile:
                return Profile()

            def build_serialized_network(self, network: object, config: Config) -> bytes:
                calls.append(("build", config.hardware_compatibility_level))
                return b"PLAN"

        class OnnxParser:
            num_errors = 0

            def __init__(self, network: object, logger: Logger) -> None:
                pass

            def parse_from_file(self, path: str) -> bool:
                calls.append(("parse_from_file", path))
                return True

        fake.Logger = Logger  # type: ignore[attr-defined]
        fake.NetworkDefinitionCreationFlag = Flag  # type: ignore[attr-defined]
        fake.MemoryPoolType = MemoryPoolType  # type: ignore[attr-defined]
        fake.BuilderFlag = BuilderFlag  # type: ignore[attr-defined]
        fake.HardwareCompatibilityLevel = HardwareCompatibilityLevel  # type: ignore[attr-defined]
        fake.Builder = Builder  # type: ignore[attr-defined]
        fake.OnnxParser = OnnxParser  # type: ignore[attr-defined]
        self.module = fake

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> _FakeTensorRT:
    fake = _FakeTensorRT()
    monkeypatch.setitem(sys.modules, "tensorrt", fake.module)
    monkeypatch.setattr(tb, "tensorrt_unavailable_reason", lambda: None)
    monkeypatch.setattr(tb, "tensorrt_version", lambda: "10.13.0.35")
    return fake


def test_strongly_typed_build_with_profiles_and_a_persisted_timing_cache(
    tmp_path: Path, fake_trt: _FakeTensorRT
) -> None:
    options = TensorRTOptions(
        workspace_bytes=1 << 28, hardware_compatibility=HardwareCompatibility.AMPERE_PLUS
    )
    first = tb.build_engine(_request(tmp_path, options=options), gpu=GPU)
    assert first.status is VariantStatus.PRODUCED and not first.cache_hit
    assert first.path is not None and first.path.read_bytes() == b"PLAN"
    assert first.target is not None
    assert (first.target.compute_capability, first.target.tensorrt_version) == ("9.0", "10.13.0.35")
    calls = dict(fake_trt.calls)
    assert calls["create_network"] == 1 << 5
    assert calls["pool"] == ("workspace", 1 << 28)
    assert calls["create_timing_cache"] == b""
    assert calls["set_timing_cache"] is False
    assert calls["build"] == "ampere_plus"
    assert "clear_flag" not in calls  # fp16: TF32 stays as TensorRT sets it
    assert ("set_shape", ("input_ids", (1, 1), (4, 16), (8, 32))) in fake_trt.calls
    assert first.timing_cache is not None
    assert first.timing_cache.read_bytes() == b"+timing"

    # Same inputs: the engine comes from the cache, TensorRT is not called.
    fake_trt.calls.clear()
    again = tb.build_engine(_request(tmp_path, options=options), gpu=GPU)
    assert again.cache_hit and again.path == first.path
    assert fake_trt.calls == []

    # Another precision is compiled, seeded with the saved timing cache.
    int8 = tb.build_engine(_request(tmp_path, Precision.INT8, options=options), gpu=GPU)
    assert not int8.cache_hit
    assert dict(fake_trt.calls)["create_timing_cache"] == b"+timing"

    # fp32 is compiled without TF32, so it matches ONNX Runtime's fp32.
    fp32 = tb.build_engine(_request(tmp_path, Precision.FP32, options=options), gpu=GPU)
    assert fp32.status is VariantStatus.PRODUCED
    assert ("clear_flag", "tf32") in fake_trt.calls


def test_dynamic_inputs_need_profiles(tmp_path: Path, fake_trt: _FakeTensorRT) -> None:
    outcome = tb.build_engine(_request(tmp_path, profiles=()), gpu=GPU)
    assert outcome.status is VariantStatus.FAILED
    assert outcome.reason is not None and "add 'profiles'" in outcome.reason
    assert fake_trt.calls == []
