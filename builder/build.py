"""One build: source ONNX → precision variants → validation → engines → artifacts → registry."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import onnxruntime

from graylane.artifacts.digest import sha256_file
from graylane.artifacts.graph import io_signature, load_header, metadata_int
from graylane.artifacts.manifest import (
    CalibrationInfo,
    Manifest,
    ValidationInfo,
    read_manifest,
    with_files,
)
from graylane.artifacts.model_info import read_model_info
from graylane.artifacts.naming import ArtifactName, Backend, Precision
from graylane.builder.calibration import check_calibration_size
from graylane.builder.engine_artifacts import compile_engines, publish_engine
from graylane.builder.host import build_host, git_commit
from graylane.builder.plan import (
    VariantPlan,
    default_validation,
    plan_variants,
    with_declared_vocab,
)
from graylane.builder.polygraphy_check import outputs_of, run_model, validate_with_polygraphy
from graylane.builder.progress import NullProgress, ProgressSink
from graylane.builder.registration import register_build
from graylane.builder.report import BuildReport, VariantReport, variants_ok
from graylane.builder.runtime import open_runner
from graylane.builder.samples import SampleSet, load_samples
from graylane.builder.sensitivity import QUANTIZED, evaluator, refine_quantized
from graylane.builder.spec import BuildSpec, DemoSource, FileSource
from graylane.builder.store import ArtifactExistsError, ArtifactStore, CacheKind
from graylane.builder.tensorrt_build import tensorrt_unavailable_reason
from graylane.builder.validation import ValidationResult, reference_outputs
from graylane.builder.variants import (
    EXTERNAL_DATA_THRESHOLD,
    VariantInputs,
    VariantOutcome,
    VariantStatus,
    produce_variant,
)
from graylane.registry import Registry

__all__ = ["BuildError", "BuildReport", "VariantReport", "resolve_source", "run_build"]

_REPO_ROOT = Path(__file__).resolve().parent.parent


class BuildError(RuntimeError):
    """The build cannot start or cannot finish; the message says why."""


def resolve_source(spec: BuildSpec, store: ArtifactStore) -> Path:
    """The source ONNX path; the demo model is generated into the store's cache once."""
    if isinstance(spec.source, FileSource):
        if not spec.source.path.is_file():
            raise BuildError(f"source model {spec.source.path} does not exist")
        return spec.source.path
    if isinstance(spec.source, DemoSource):
        from graylane.models.demo_gpt import write_demo_gpt

        form = "-kv" if spec.source.kv_cache else ""
        target = store.cache_dir(CacheKind.SOURCES) / (
            f"demo-gpt-{spec.source.size}-seed{spec.source.seed}{form}.onnx"
        )
        if not target.is_file():
            partial = target.with_suffix(".partial")
            write_demo_gpt(
                partial, spec.source.size, spec.source.seed, kv_cache=spec.source.kv_cache
            )
            partial.replace(target)
        return target
    raise BuildError(f"unknown source {spec.source!r}")


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


def _describe(result: ValidationResult | None) -> str:
    if result is None:
        return "not validated"
    if result.error is not None:
        return f"validation error: {result.error}"
    m = result.metrics
    if m is None:
        return "no metrics"
    text = f"cos {m.cosine:.5f} top1 {m.top1_agreement:.3f} max|Δ| {m.max_abs:.3g}"
    if m.token_agreement is not None:
        text += f" tokens {m.token_agreement:.2f}"
    return text + ("" if result.passed else " — FAILED: " + "; ".join(result.failures))


def run_build(
    spec: BuildSpec,
    progress: ProgressSink | None = None,
    *,
    store: Path | None = None,
    registry: Registry | None = None,
    force: bool | None = None,
) -> BuildReport:
    """Run the whole build for ``spec``.

    ``store`` overrides the spec's artifact store (one of the two is required);
    ``force`` overrides the spec's flag: it replaces existing artifacts and marks
    variants that miss their tolerances servable (recorded as forced).
    """
    progress = progress or NullProgress()
    started = time.perf_counter()
    force = spec.force if force is None else force
    root = store or spec.store
    if root is None:
        raise BuildError("no artifact store: set 'store' in the spec or pass --store")
    spec = replace(spec, force=force)
    artifacts = ArtifactStore(root)
    trt_reason = tensorrt_unavailable_reason() if spec.tensorrt.enabled else "disabled in the spec"
    engine_count = 0 if trt_reason else len(spec.precisions)
    quantized = sum(p in QUANTIZED for p in spec.precisions)
    progress.begin(3 + 2 * len(spec.precisions) + quantized + max(engine_count, 1) + 2)
    try:
        return _run(spec, progress, artifacts, registry, trt_reason, started)
    finally:
        progress.end()


def _run(
    spec: BuildSpec,
    progress: ProgressSink,
    artifacts: ArtifactStore,
    registry: Registry | None,
    trt_reason: str | None,
    started: float,
) -> BuildReport:
    progress.step("loading source model")
    source = resolve_source(spec, artifacts)
    header = load_header(source)
    signature = io_signature(header)
    source_sha = sha256_file(source)
    max_seq_len = metadata_int(header, "max_seq_len")
    pad_id = metadata_int(header, "pad_id") or 0
    external = source.stat().st_size > EXTERNAL_DATA_THRESHOLD or any(
        init.data_location == 1 for init in header.graph.initializer
    )
    info = read_model_info(header, task=spec.task, vocab_size=spec.vocab_size)
    plan = plan_variants(spec.precisions, info.quantization)
    names = _names(spec, plan, artifacts)
    notes = [f"skipped {p.value}: {why}" for p, why in plan.skipped.items()]
    progress.done(
        f"source {source.name} sha256 {source_sha[:12]}… ({len(signature.inputs)} inputs, "
        f"task {info.task.value}, vocabulary {info.vocab_size or '-'}, "
        f"quantization {info.quantization.value})"
    )

    progress.step("preparing samples")
    calibration: SampleSet | None = None
    forced_note = ""
    if spec.calibration is not None and Precision.INT8 in plan.produce and not plan.copy_source:
        calibration = load_samples(
            with_declared_vocab(spec.calibration, info), signature, max_seq_len
        )
        forced_note = check_calibration_size(
            calibration.count, spec.calibration_min_samples, spec.force
        )
    validation_spec = spec.validation
    if validation_spec is None:
        validation_spec = default_validation(info, signature, spec.profiles, max_seq_len)
        notes.append(
            f"no validation section: {validation_spec.samples} random samples "
            "within the declared vocabulary / profile shapes"
        )
    validation = load_samples(with_declared_vocab(validation_spec, info), signature, max_seq_len)
    progress.done(
        f"samples: calibration {calibration.count if calibration else 0}, "
        f"validation {validation.count}" + forced_note,
        ok=not forced_note,
    )

    work = Path(tempfile.mkdtemp(prefix="build-", dir=_staging(artifacts)))
    try:
        inputs = VariantInputs(
            source=source,
            source_sha256=source_sha,
            work_dir=work,
            cache_dir=artifacts.cache_dir(CacheKind.CALIBRATION),
            calibration=calibration,
            method=spec.calibration_method,
            percentile=spec.calibration_percentile,
            external_data=external,
            op_types_to_quantize=spec.quantize_ops,
        )
        outcomes: dict[Precision, VariantOutcome] = {}
        for precision in plan.produce:
            progress.step(f"producing {precision.value}")
            outcome = produce_variant(precision, inputs, copy_source=plan.copy_source)
            outcomes[precision] = outcome
            cache = ""
            if outcome.calibration is not None:
                cache = (
                    " (calibration cache hit)"
                    if outcome.calibration.cache_hit
                    else (" (calibrated)")
                )
            progress.done(
                f"{precision.value}: {outcome.status.value} in {outcome.duration_s:.1f}s{cache}"
                + (f" — {outcome.reason}" if outcome.reason else ""),
                ok=outcome.status is VariantStatus.PRODUCED,
            )

        progress.step("reference outputs (fp32, through Polygraphy)")
        reference = None
        reference_run = None
        if validation is not None:
            reference_run = run_model(source, Precision.FP32.value, validation.batches)
            reference = reference_outputs(
                open_runner(source),
                validation,
                signature,
                spec.generation if info.generates else None,
                max_seq_len,
                pad_id,
                outputs=outputs_of(reference_run),
            )
        progress.done("reference outputs ready" if reference else "no validation data in spec")

        results: dict[Precision, ValidationResult | None] = {}
        for precision, outcome in outcomes.items():
            progress.step(f"validating {precision.value}")
            result = None
            if outcome.path is not None and reference is not None and validation is not None:
                result = validate_with_polygraphy(
                    precision,
                    outcome.path,
                    reference,
                    reference_run,
                    validation,
                    spec.tolerance_for(precision),
                    pad_id,
                )
            results[precision] = result
            progress.done(
                f"{precision.value}: {_describe(result)}", ok=result is None or result.passed
            )

        partials = {}
        if reference is not None and validation is not None:
            partials = refine_quantized(
                outcomes,
                results,
                inputs,
                spec.partial_quantization,
                partial(
                    evaluator,
                    reference,
                    reference_run,
                    validation,
                    spec.tolerance_for,
                    pad_id,
                ),
                fp32_path=outcomes[Precision.FP32].path or source
                if Precision.FP32 in outcomes
                else source,
                timing_batches=validation.batches,
                step=progress.step,
                done=lambda message, ok: progress.done(message, ok=ok),
            )

        engines = compile_engines(spec, progress, artifacts, outcomes, signature, trt_reason)

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
                io=signature,
                profiles=spec.profiles,
                build_host=host,
                build_duration_s=outcome.duration_s,
                source_onnx_sha256=source_sha,
                source_git_commit=commit,
                created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                servable=servable,
                forced=forced,
                calibration=_calibration_info(outcome),
                validation=_validation_info(result),
                notes=outcome.notes + tuple(notes),
                model_info=info,
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
    finally:
        shutil.rmtree(work, ignore_errors=True)

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
            source_sha,
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
    return BuildReport(
        model=spec.model,
        version=str(spec.version),
        source=source,
        source_sha256=source_sha,
        store=artifacts.root,
        variants=tuple(reports),
        tensorrt_note=None if trt_reason is None else f"TensorRT engines not built: {trt_reason}",
        registered=registered,
        duration_s=time.perf_counter() - started,
        model_info=info,
        notes=tuple(notes),
    )


def _names(
    spec: BuildSpec, plan: VariantPlan, artifacts: ArtifactStore
) -> dict[Precision, ArtifactName]:
    """Artifact names of the planned variants; refuses to overwrite unless forced."""
    ort_version = str(onnxruntime.__version__)
    names = {
        p: ArtifactName(
            spec.model, Backend.ONNXRUNTIME, ort_version, p, spec.strategy, spec.version
        )
        for p in plan.produce
    }
    existing = [str(n) for n in names.values() if artifacts.exists(n)]
    if existing and not spec.force:
        raise ArtifactExistsError(
            f"already built: {', '.join(existing)}; bump the version or pass --force"
        )
    return names


def _staging(artifacts: ArtifactStore) -> Path:
    path = artifacts.root / ".staging"
    path.mkdir(parents=True, exist_ok=True)
    return path
