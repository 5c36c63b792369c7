"""One build: source ONNX → precision variants → validation → engines → artifacts → registry.

The steps, in order: read the source (:mod:`~graylane.builder.source`), prepare the
calibration and validation samples, produce, validate and refine each variant
(:mod:`~graylane.builder.variant_steps`), compile TensorRT engines
(:mod:`~graylane.builder.engine_artifacts`), publish and register
(:mod:`~graylane.builder.publishing`).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import onnxruntime

from graylane.artifacts.naming import ArtifactName, Backend, Precision
from graylane.builder.calibration import check_calibration_size
from graylane.builder.engine_artifacts import compile_engines
from graylane.builder.plan import (
    VariantPlan,
    default_validation,
    plan_variants,
    with_declared_vocab,
)
from graylane.builder.progress import NullProgress, ProgressSink
from graylane.builder.publishing import publish_variants, register_step
from graylane.builder.report import BuildReport, VariantReport
from graylane.builder.samples import SampleSet, load_samples
from graylane.builder.sensitivity import QUANTIZED
from graylane.builder.source import BuildError, SourceModel, read_source, resolve_source
from graylane.builder.spec import BuildSpec
from graylane.builder.store import ArtifactExistsError, ArtifactStore, CacheKind
from graylane.builder.tensorrt_build import tensorrt_unavailable_reason
from graylane.builder.variant_steps import (
    produce_variants,
    reference_step,
    refine_variants,
    validate_variants,
)
from graylane.builder.variants import VariantInputs
from graylane.registry import Registry

__all__ = ["BuildError", "BuildReport", "VariantReport", "resolve_source", "run_build"]


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
    """The build's steps in order; the staging folder goes whatever happens."""
    source, plan, names, notes = _load_source(spec, artifacts, progress)
    calibration, validation = _prepare_samples(spec, source, plan, notes, progress)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=_staging(artifacts)))
    try:
        inputs = _variant_inputs(spec, source, calibration, artifacts, work)
        outcomes = produce_variants(plan, inputs, progress)
        reference = reference_step(spec, source, validation, progress)
        results = validate_variants(spec, outcomes, reference, validation, source.pad_id, progress)
        partials = refine_variants(
            spec, source, outcomes, results, inputs, reference, validation, progress
        )
        engines = compile_engines(spec, progress, artifacts, outcomes, source.signature, trt_reason)
        reports, published = publish_variants(
            spec,
            plan,
            names,
            source,
            outcomes,
            results,
            partials,
            engines,
            notes,
            artifacts,
            progress,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    registered = register_step(spec, registry, source, reports, published, notes, progress)
    return BuildReport(
        model=spec.model,
        version=str(spec.version),
        source=source.path,
        source_sha256=source.sha256,
        store=artifacts.root,
        variants=tuple(reports),
        tensorrt_note=None if trt_reason is None else f"TensorRT engines not built: {trt_reason}",
        registered=registered,
        duration_s=time.perf_counter() - started,
        model_info=source.info,
        notes=tuple(notes),
    )


def _load_source(
    spec: BuildSpec, artifacts: ArtifactStore, progress: ProgressSink
) -> tuple[SourceModel, VariantPlan, dict[Precision, ArtifactName], list[str]]:
    """Read the source and plan its variants; (source, plan, artifact names, notes)."""
    progress.step("loading source model")
    source = read_source(spec, artifacts)
    info = source.info
    plan = plan_variants(spec.precisions, info.quantization)
    names = _names(spec, plan, artifacts)
    notes = [f"skipped {p.value}: {why}" for p, why in plan.skipped.items()]
    progress.done(
        f"source {source.path.name} sha256 {source.sha256[:12]}… "
        f"({len(source.signature.inputs)} inputs, "
        f"task {info.task.value}, vocabulary {info.vocab_size or '-'}, "
        f"quantization {info.quantization.value})"
    )
    return source, plan, names, notes


def _prepare_samples(
    spec: BuildSpec,
    source: SourceModel,
    plan: VariantPlan,
    notes: list[str],
    progress: ProgressSink,
) -> tuple[SampleSet | None, SampleSet]:
    """Load the calibration set (int8 only) and the validation set; (calibration, validation)."""
    progress.step("preparing samples")
    info, signature, max_seq_len = source.info, source.signature, source.max_seq_len
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
    return calibration, validation


def _variant_inputs(
    spec: BuildSpec,
    source: SourceModel,
    calibration: SampleSet | None,
    artifacts: ArtifactStore,
    work: Path,
) -> VariantInputs:
    """What every variant is produced from: the source, calibration data and options."""
    return VariantInputs(
        source=source.path,
        source_sha256=source.sha256,
        work_dir=work,
        cache_dir=artifacts.cache_dir(CacheKind.CALIBRATION),
        calibration=calibration,
        method=spec.calibration_method,
        percentile=spec.calibration_percentile,
        external_data=source.external,
        op_types_to_quantize=spec.quantize_ops,
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
    """The store's staging folder, where a build's work folder is made."""
    path = artifacts.root / ".staging"
    path.mkdir(parents=True, exist_ok=True)
    return path
