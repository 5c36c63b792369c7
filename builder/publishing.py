"""The last steps of a build: publish each variant with its manifest, then register.

A variant that was produced is written to the artifact store (its ONNX Runtime
artifact, then its TensorRT engines) with a manifest that records the build
host, the source, calibration and validation; a build whose variants all
passed (or were forced) is then recorded in the model registry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from graylane.artifacts.build_info import PartialQuantization
from graylane.artifacts.manifest import (
    CalibrationInfo,
    Manifest,
    ValidationInfo,
    read_manifest,
    with_files,
)
from graylane.artifacts.naming import ArtifactName, Backend, Precision
from graylane.builder.engine_artifacts import publish_engine
from graylane.builder.host import build_host, git_commit
from graylane.builder.plan import VariantPlan
from graylane.builder.progress import ProgressSink
from graylane.builder.registration import register_build
from graylane.builder.report import VariantReport, variants_ok
from graylane.builder.source import SourceModel
from graylane.builder.spec import BuildSpec
from graylane.builder.store import ArtifactStore
from graylane.builder.tensorrt_build import EngineOutcome
from graylane.builder.validation import ValidationResult
from graylane.builder.variants import VariantOutcome, VariantStatus
from graylane.registry import Registry

_REPO_ROOT = Path(__file__).resolve().parent.parent


def publish_variants(
    spec: BuildSpec,
    plan: VariantPlan,
    names: dict[Precision, ArtifactName],
    source: SourceModel,
    outcomes: dict[Precision, VariantOutcome],
    results: dict[Precision, ValidationResult | None],
    partials: dict[Precision, PartialQuantization],
    engines: dict[Precision, tuple[EngineOutcome, ...]],
    notes: list[str],
    artifacts: ArtifactStore,
    progress: ProgressSink,
) -> tuple[list[VariantReport], list[Path]]:
    """Publish every produced variant and its engines; (reports, published folders)."""
    progress.step("publishing artifacts")
    host = build_host(probe_gpu=True)
    commit = git_commit(_REPO_ROOT)
    reports: list[VariantReport] = [
        VariantReport(p, Backend.ONNXRUNTIME, VariantStatus.SKIPPED, why)
        for p, why in plan.skipped.items()
    ]
    published: list[Path] = []
    for precision, outcome in outcomes.items():
        result = results[precision]
        if outcome.path is None:
            reports.append(
                VariantReport(
                    precision,
                    Backend.ONNXRUNTIME,
                    outcome.status,
                    outcome.reason,
                    duration_s=outcome.duration_s,
                )
            )
            continue
        servable, forced = _servable(result, precision, spec.force, plan.reference)
        name = names[precision]
        manifest_base = Manifest(
            name=name,
            files=(),
            io=source.signature,
            profiles=spec.profiles,
            build_host=host,
            build_duration_s=outcome.duration_s,
            source_onnx_sha256=source.sha256,
            source_git_commit=commit,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            servable=servable,
            forced=forced,
            calibration=_calibration_info(outcome),
            validation=_validation_info(result),
            notes=outcome.notes + tuple(notes),
            model_info=source.info,
            partial_quantization=partials.get(precision),
        )
        folder = artifacts.publish(
            name,
            outcome.files,
            partial(with_files, manifest_base),
            replace=spec.force,
        )
        published.append(folder)
        reports.append(
            VariantReport(
                precision=precision,
                backend=Backend.ONNXRUNTIME,
                status=outcome.status,
                reason=outcome.reason,
                artifact=name,
                folder=folder,
                validation=result,
                servable=servable,
                forced=forced,
                calibration=_calibration_info(outcome),
                duration_s=outcome.duration_s,
            )
        )
        for engine in engines.get(precision, ()):
            reports.append(
                publish_engine(engine, manifest_base, artifacts, spec, result, published)
            )
    progress.done(f"published {len(published)} artifact(s) to {artifacts.root}")
    return reports, published


def register_step(
    spec: BuildSpec,
    registry: Registry | None,
    source: SourceModel,
    reports: list[VariantReport],
    published: list[Path],
    notes: list[str],
    progress: ProgressSink,
) -> bool:
    """Record the published artifacts in the registry unless a variant failed; registered?"""
    registered = False
    failed = not variants_ok(reports)
    progress.step("registering")
    if failed:
        notes.append("not registered: the build failed (a variant failed or is not servable)")
    elif registry is not None and published:
        register_build(
            registry,
            spec.model,
            spec.version,
            source.sha256,
            [(read_manifest(folder), folder) for folder in published],
            replace=spec.force,
        )
        registered = True
    progress.done(
        "registered in the model registry"
        if registered
        else "registry: not registered, the build failed"
        if failed
        else "registry: skipped",
        ok=not failed,
    )
    return registered


def _servable(
    result: ValidationResult | None, precision: Precision, force: bool, reference: Precision
) -> tuple[bool, bool]:
    """(servable, forced): the reference is always servable; others must pass unless forced."""
    if precision is reference and (result is None or result.passed):
        return True, False
    if result is not None and result.passed:
        return True, False
    return (True, True) if force else (False, False)


def _validation_info(result: ValidationResult | None) -> ValidationInfo | None:
    """The manifest's record of a validation result."""
    if result is None:
        return None
    return ValidationInfo(
        passed=result.passed,
        tolerance=result.tolerance,
        metrics=result.metrics,
        failures=result.failures,
        error=result.error,
        comparison=result.comparison,
    )


def _calibration_info(outcome: VariantOutcome) -> CalibrationInfo | None:
    """The manifest's record of how a variant was calibrated (None: not calibrated)."""
    record = outcome.calibration
    if record is None:
        return None
    return CalibrationInfo(
        method=record.method,
        samples=record.samples,
        data_digest=record.data_digest,
        cache_key=record.cache_key,
        cache_hit=record.cache_hit,
        duration_s=record.duration_s,
        percentile=record.percentile,
    )
