"""TensorRT engines from typed ONNX variants, where TensorRT and a GPU are present.

Precision comes from the types in the ONNX graph (strongly typed network), not
from builder flags. Each engine is keyed by sha256(onnx) + precision + profiles +
TensorRT version + compute capability + hardware-compatibility level + workspace;
a matching engine in the cache is reused without rebuilding. The timing cache is
persisted per (TensorRT version, compute capability) and fed to every build.

``tensorrt`` is imported lazily: this module imports fine without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graylane.artifacts.build_info import HardwareCompatibility, ShapeProfile
from graylane.artifacts.manifest import EngineTarget, GpuInfo
from graylane.artifacts.naming import Precision
from graylane.builder.host import detect_gpu, tensorrt_version
from graylane.builder.spec import TensorRTOptions
from graylane.builder.variants import VariantStatus
from graylane.engine.signature import IOSignature
from graylane.errors import GraylaneError

__all__ = [
    "ENGINE_FILE",
    "EngineBuildError",
    "EngineOutcome",
    "EngineRequest",
    "build_engine",
    "engine_cache_key",
    "tensorrt_unavailable_reason",
]

ENGINE_FILE = "engine.plan"
_NOT_FOR_TENSORRT = {
    Precision.INT8_DYNAMIC: (
        "int8-dynamic is an ONNX Runtime CPU variant (MatMulInteger / DynamicQuantizeLinear); "
        "TensorRT uses the Q/DQ int8 variant instead"
    ),
    Precision.INT8_WEIGHT_ONLY: (
        "int8-weight-only is ONNX Runtime's MatMulNBits (a com.microsoft op TensorRT's ONNX "
        "parser does not read); TensorRT uses the fp16 or Q/DQ int8 variant instead"
    ),
    Precision.INT4: (
        "int4 here is ONNX Runtime's MatMulNBits (a com.microsoft op TensorRT's ONNX parser "
        "does not read); TensorRT-LLM serves int4 checkpoints as an engine server"
    ),
}


class EngineBuildError(GraylaneError):
    """TensorRT could not parse a variant or build its engine."""


@dataclass(frozen=True)
class EngineOutcome:
    precision: Precision
    status: VariantStatus
    reason: str | None = None
    path: Path | None = None
    target: EngineTarget | None = None
    cache_key: str | None = None
    cache_hit: bool = False
    timing_cache: Path | None = None
    duration_s: float = 0.0


@dataclass(frozen=True)
class EngineRequest:
    precision: Precision
    onnx_path: Path
    onnx_sha256: str
    signature: IOSignature
    profiles: tuple[ShapeProfile, ...]
    options: TensorRTOptions
    engine_cache_dir: Path
    timing_cache_dir: Path


def tensorrt_unavailable_reason() -> str | None:
    """Why engines cannot be built here, or ``None`` when they can."""
    if importlib.util.find_spec("tensorrt") is None:
        return "tensorrt is not installed"
    if detect_gpu() is None:
        return "no CUDA GPU found"
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:  # a half-installed TensorRT fails in many ways
        return f"tensorrt cannot be imported: {exc}"
    return None


def engine_cache_key(
    onnx_sha256: str,
    precision: Precision,
    profiles: Sequence[ShapeProfile],
    trt_version: str,
    compute_capability: str,
    options: TensorRTOptions,
) -> str:
    payload = {
        "onnx": onnx_sha256,
        "precision": precision.value,
        "profiles": [
            [p.name, [[s.input, s.min, s.opt, s.max] for s in p.shapes]] for p in profiles
        ],
        "tensorrt": trt_version,
        "compute_capability": compute_capability,
        "hardware_compatibility": options.hardware_compatibility.value,
        "workspace_bytes": options.workspace_bytes,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _check_profiles(request: EngineRequest) -> str | None:
    dynamic = [t.name for t in request.signature.inputs if any(isinstance(d, str) for d in t.shape)]
    if dynamic and not request.profiles:
        return f"inputs {dynamic} have dynamic dimensions; add 'profiles' to the spec"
    for profile in request.profiles:
        missing = [n for n in dynamic if profile.for_input(n) is None]
        if missing:
            return f"profile {profile.name!r} gives no shapes for dynamic inputs {missing}"
    return None


def build_engine(request: EngineRequest, gpu: GpuInfo | None = None) -> EngineOutcome:
    """Build (or reuse) the engine for one ONNX variant."""
    start = time.perf_counter()
    precision = request.precision
    if precision in _NOT_FOR_TENSORRT:
        return EngineOutcome(precision, VariantStatus.UNSUPPORTED, _NOT_FOR_TENSORRT[precision])
    reason = tensorrt_unavailable_reason()
    gpu = gpu or detect_gpu()
    trt_version = tensorrt_version()
    if reason is not None or gpu is None or trt_version is None:
        reason = reason or "no CUDA GPU found"
        return EngineOutcome(
            precision, VariantStatus.UNSUPPORTED, f"TensorRT engines not built: {reason}"
        )
    problem = _check_profiles(request)
    if problem is not None:
        return EngineOutcome(precision, VariantStatus.FAILED, problem)
    target = EngineTarget(
        compute_capability=gpu.compute_capability,
        tensorrt_version=trt_version,
        hardware_compatibility=request.options.hardware_compatibility,
    )
    key = engine_cache_key(
        request.onnx_sha256,
        precision,
        request.profiles,
        trt_version,
        gpu.compute_capability,
        request.options,
    )
    request.engine_cache_dir.mkdir(parents=True, exist_ok=True)
    request.timing_cache_dir.mkdir(parents=True, exist_ok=True)
    plan_path = request.engine_cache_dir / f"{key}.plan"
    timing_path = request.timing_cache_dir / (
        f"timing-trt{trt_version}-sm{gpu.compute_capability.replace('.', '')}.cache"
    )
    if plan_path.is_file():
        return EngineOutcome(
            precision,
            VariantStatus.PRODUCED,
            path=plan_path,
            target=target,
            cache_key=key,
            cache_hit=True,
            timing_cache=timing_path if timing_path.is_file() else None,
            duration_s=time.perf_counter() - start,
        )
    try:
        plan, timing = _compile(request, timing_path)
    except EngineBuildError as exc:
        return EngineOutcome(precision, VariantStatus.FAILED, str(exc), cache_key=key)
    except Exception as exc:  # TensorRT raises untyped errors
        return EngineOutcome(
            precision,
            VariantStatus.FAILED,
            f"TensorRT build failed: {type(exc).__name__}: {exc}",
            cache_key=key,
        )
    _write_atomic(plan_path, plan)
    _write_atomic(timing_path, timing)
    return EngineOutcome(
        precision,
        VariantStatus.PRODUCED,
        path=plan_path,
        target=target,
        cache_key=key,
        cache_hit=False,
        timing_cache=timing_path,
        duration_s=time.perf_counter() - start,
    )


_HW_LEVELS = {
    HardwareCompatibility.AMPERE_PLUS: "AMPERE_PLUS",
    HardwareCompatibility.SAME_COMPUTE_CAPABILITY: "SAME_COMPUTE_CAPABILITY",
}


def _compile(request: EngineRequest, timing_path: Path) -> tuple[bytes, bytes]:
    """Run the TensorRT builder; returns (serialized plan, serialized timing cache)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    # parse_from_file resolves external weight files next to the model.
    if not parser.parse_from_file(str(request.onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT cannot parse {request.onnx_path.name}: {errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, request.options.workspace_bytes)
    tf32 = getattr(getattr(trt, "BuilderFlag", None), "TF32", None)
    if request.precision is Precision.FP32 and tf32 is not None:
        config.clear_flag(tf32)  # an fp32 engine computes in fp32, like its ONNX variant
    level = _HW_LEVELS.get(request.options.hardware_compatibility)
    if level is not None:
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, level)

    for profile_spec in request.profiles:
        profile = builder.create_optimization_profile()
        for shape in profile_spec.shapes:
            profile.set_shape(shape.input, shape.min, shape.opt, shape.max)
        config.add_optimization_profile(profile)

    previous = timing_path.read_bytes() if timing_path.is_file() else b""
    cache: Any = config.create_timing_cache(previous)
    config.set_timing_cache(cache, ignore_mismatch=False)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError(
            f"TensorRT returned no engine for {request.onnx_path.name} "
            f"({request.precision.value}); see the TensorRT log above"
        )
    timing = config.get_timing_cache().serialize()
    return bytes(plan), bytes(timing)
