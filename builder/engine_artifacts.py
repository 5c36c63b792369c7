"""TensorRT engines for a build's ONNX variants, published as their own artifacts."""

from __future__ import annotations

import shutil
from dataclasses import replace
from functools import partial
from pathlib import Path

from graylane.artifacts.digest import sha256_file
from graylane.artifacts.graph import IOSignature
from graylane.artifacts.manifest import Manifest, with_files
from graylane.artifacts.naming import Backend, Precision
from graylane.builder.host import detect_gpu
from graylane.builder.progress import ProgressSink
from graylane.builder.report import VariantReport
from graylane.builder.spec import BuildSpec
from graylane.builder.store import ArtifactStore, CacheKind
from graylane.builder.tensorrt_build import ENGINE_FILE, EngineOutcome, EngineRequest, build_engine
from graylane.builder.validation import ValidationResult
from graylane.builder.variants import VariantOutcome, VariantStatus

__all__ = ["compile_engines", "publish_engine"]


def compile_engines(
    spec: BuildSpec,
    progress: ProgressSink,
    artifacts: ArtifactStore,
    outcomes: dict[Precision, VariantOutcome],
    signature: IOSignature,
    trt_reason: str | None,
) -> dict[Precision, tuple[EngineOutcome, ...]]:
    if trt_reason is not None:
        progress.step("TensorRT engines")
        progress.done(f"TensorRT engines not built: {trt_reason}", ok=True)
        return {}
    gpu = detect_gpu()
    found: dict[Precision, tuple[EngineOutcome, ...]] = {}
    for precision, outcome in outcomes.items():
        progress.step(f"TensorRT engine {precision.value}")
        if outcome.path is None:
            progress.done(f"TensorRT {precision.value}: no ONNX variant to compile", ok=False)
            continue
        engine = build_engine(
            EngineRequest(
                precision=precision,
                onnx_path=outcome.path,
                onnx_sha256=sha256_file(outcome.path),
                signature=signature,
                profiles=spec.profiles,
                options=spec.tensorrt,
                engine_cache_dir=artifacts.cache_dir(CacheKind.TENSORRT_ENGINES),
                timing_cache_dir=artifacts.cache_dir(CacheKind.TENSORRT_TIMING),
            ),
            gpu=gpu,
        )
        found[precision] = (engine,)
        hit = " (engine cache hit)" if engine.cache_hit else ""
        progress.done(
            f"TensorRT {precision.value}: {engine.status.value}{hit}"
            + (f" — {engine.reason}" if engine.reason else ""),
            ok=engine.status is not VariantStatus.FAILED,
        )
    return found


def publish_engine(
    engine: EngineOutcome,
    onnx_manifest: Manifest,
    artifacts: ArtifactStore,
    spec: BuildSpec,
    result: ValidationResult | None,
    published: list[Path],
) -> VariantReport:
    if engine.path is None or engine.target is None:
        return VariantReport(engine.precision, Backend.TENSORRT, engine.status, engine.reason)
    name = replace(
        onnx_manifest.name, backend=Backend.TENSORRT, backend_version=engine.target.tensorrt_version
    )
    staged = engine.path.parent / f".{engine.path.stem}" / ENGINE_FILE
    staged.parent.mkdir(exist_ok=True)
    shutil.copyfile(engine.path, staged)
    base = replace(
        onnx_manifest,
        name=name,
        target=engine.target,
        build_duration_s=engine.duration_s,
        notes=(
            *onnx_manifest.notes,
            "validation inherited from the ONNX variant this engine was compiled from",
            "engine cache hit" if engine.cache_hit else "engine compiled",
        ),
    )
    try:
        folder = artifacts.publish(
            name,
            [staged],
            partial(with_files, base),
            compute_capability=engine.target.compute_capability,
            replace=spec.force,
        )
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)
    published.append(folder)
    return VariantReport(
        precision=engine.precision,
        backend=Backend.TENSORRT,
        status=engine.status,
        reason=engine.reason,
        artifact=name,
        folder=folder,
        validation=result,
        servable=base.servable,
        forced=base.forced,
        compute_capability=engine.target.compute_capability,
        calibration=base.calibration,
        duration_s=engine.duration_s,
    )
