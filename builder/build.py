"""One build: source ONNX → precision variants → validation → engines → artifacts → registry.

(A version engine servers serve is registered, not built: :func:`run_build` hands an
:class:`~graylane.builder.spec.EngineSpec` to :mod:`graylane.builder.endpoints`.)

:func:`run_build` runs the steps in order, each in its own section below: read the
source (where the ONNX comes from and what its header says), prepare the calibration
and validation samples, produce, validate and refine each variant (each step reports
to the progress sink once per variant and writes no artifact), compile TensorRT
engines, publish every produced variant with its manifest (the build host, the
source, calibration and validation), and record the build in the model registry when
its variants all passed (or were forced). What the build did comes back as a
:class:`BuildReport`, one :class:`VariantReport` per artifact tried.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import onnxruntime
from polygraphy.comparator import RunResults

from graylane.artifacts.build_info import PartialQuantization
from graylane.artifacts.decoder_axes import correct_mask_axis, mask_axis_conflict
from graylane.artifacts.manifest import (
    CalibrationInfo,
    EndpointInfo,
    Manifest,
    ValidationInfo,
    read_manifest,
    with_files,
)
from graylane.artifacts.model_info import (
    ModelInfo,
    TokenizerFile,
    eos_from_hf_configs,
    io_signature,
    load_header,
    max_positions_from_hf_config,
    metadata_int,
    read_model_info,
)
from graylane.artifacts.naming import ArtifactName, Backend, Precision, SemVer
from graylane.artifacts.verify import manifest_sha256, sha256_file
from graylane.builder.calibration import check_calibration_size
from graylane.builder.host import build_host, detect_gpu, git_commit
from graylane.builder.plan import (
    VariantPlan,
    default_validation,
    plan_variants,
    with_declared_vocab,
    with_tokenizer,
)
from graylane.builder.polygraphy_check import outputs_of, run_model, validate_with_polygraphy
from graylane.builder.progress import NullProgress, ProgressSink
from graylane.builder.runtime import open_runner
from graylane.builder.samples import SampleSet, load_samples
from graylane.builder.sensitivity import QUANTIZED, evaluator, refine_quantized
from graylane.builder.spec import BuildSpec, DemoSource, EngineSpec, FileSource, GgufSource
from graylane.builder.store import ArtifactExistsError, ArtifactStore, CacheKind
from graylane.builder.tensorrt_build import (
    ENGINE_FILE,
    EngineOutcome,
    EngineRequest,
    build_engine,
    tensorrt_unavailable_reason,
)
from graylane.builder.validation import ReferenceOutputs, ValidationResult, reference_outputs
from graylane.builder.variants import (
    EXTERNAL_DATA_THRESHOLD,
    VariantInputs,
    VariantOutcome,
    VariantStatus,
    produce_variant,
)
from graylane.engine.signature import IOSignature
from graylane.errors import GraylaneError
from graylane.models.gguf_import import GgufImport
from graylane.registry.records import (
    ArtifactInfo,
    ArtifactRecord,
    DuplicateVersion,
    EndpointSummary,
    RungQuality,
    UnknownVersion,
    ValidationSummary,
    VersionStatus,
)
from graylane.registry.repository import Registry

__all__ = [
    "BuildError",
    "BuildReport",
    "SourceModel",
    "VariantReport",
    "resolve_source",
    "run_build",
]


def run_build(
    spec: BuildSpec | EngineSpec,
    progress: ProgressSink | None = None,
    *,
    store: Path | None = None,
    registry: Registry | None = None,
    force: bool | None = None,
    signing_key: Path | None = None,
    probe: bool | None = None,
) -> BuildReport:
    """Run the whole build for ``spec``.

    ``store`` overrides the spec's artifact store (one of the two is required);
    ``force`` overrides the spec's flag: it replaces existing artifacts and marks
    variants that miss their tolerances servable (recorded as forced);
    ``signing_key`` signs every published artifact (:mod:`graylane.artifacts.signing`).
    An engine spec registers its endpoints (:func:`graylane.builder.endpoints.
    register_endpoints`); ``probe`` overrides its ``engine.probe``.
    """
    progress = progress or NullProgress()
    started = time.perf_counter()
    force = spec.force if force is None else force
    root = store or spec.store
    if root is None:
        raise BuildError("no artifact store: set 'store' in the spec or pass --store")
    artifacts = ArtifactStore(root, signing_key=signing_key)
    if isinstance(spec, EngineSpec):
        # Imported here: that module builds on this one's registry records and report.
        from graylane.builder.endpoints import register_endpoints

        engine = spec.engine if probe is None else replace(spec.engine, probe=probe)
        return register_endpoints(
            replace(spec, force=force, engine=engine), progress, artifacts, registry
        )
    spec = replace(spec, force=force)
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
            data=validation.description or None,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    registered = register_step(
        spec, registry, source, reports, published, notes, progress, store=artifacts.root
    )
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
    notes = [*source.notes, *(f"skipped {p.value}: {why}" for p, why in plan.skipped.items())]
    named = spec.source.path.name if isinstance(spec.source, GgufSource) else source.path.name
    progress.done(
        f"source {named} sha256 {source.sha256[:12]}… "
        f"({len(source.signature.inputs)} inputs, "
        f"task {info.task.value}, vocabulary {info.vocab_size or '-'}, "
        f"quantization {info.quantization.value}"
        + (f", tokenizer {info.tokenizer.file}" if info.tokenizer else "")
        + ")"
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
            with_tokenizer(with_declared_vocab(spec.calibration, info), source.tokenizer),
            signature,
            max_seq_len,
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
    validation = load_samples(
        with_tokenizer(with_declared_vocab(validation_spec, info), source.tokenizer),
        signature,
        max_seq_len,
    )
    continuation = getattr(validation_spec.source, "continuation", 0)
    if continuation and info.generates:
        validation = _continued_by_reference(source, validation, continuation)
    progress.done(
        f"samples: calibration {calibration.count if calibration else 0}, "
        f"validation {validation.description or validation.count}" + forced_note,
        ok=not forced_note,
    )
    return calibration, validation


def _continued_by_reference(source: SourceModel, samples: SampleSet, tokens: int) -> SampleSet:
    """Each prompt followed by the source's own greedy tokens (fp32), so variants are
    judged on the text the reference writes. A decoder-with-past runs with an empty past
    each step (:func:`~graylane.builder.runtime.complete_feeds`): the same tokens as
    through its cache, recomputed, which a build of a few dozen prompts can afford."""
    from graylane.builder.samples import continued
    from graylane.builder.validation import generation_prompts, greedy_generate

    prompts = generation_prompts(samples, samples.count, tokens, source.max_seq_len)
    runner = open_runner(source.path)
    try:
        extra = [list(row) for row in greedy_generate(runner, prompts, tokens, source.pad_id)]
    finally:
        runner.engine.close()
    return continued(samples, extra)


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
        weight_only=spec.weight_only,
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


# -- the source: where the ONNX comes from and what its header says ----------------------------


class BuildError(GraylaneError):
    """The build cannot start or cannot finish; the message says why."""


@dataclass(frozen=True, kw_only=True)
class SourceModel:
    """The source ONNX and what the build reads from its header."""

    path: Path
    sha256: str
    signature: IOSignature
    info: ModelInfo
    max_seq_len: int | None
    pad_id: int
    external: bool
    """Its weights are (or must be) stored as external data."""
    tokenizer: Path | None = None
    """The ``tokenizer.json`` every artifact carries (``info.tokenizer`` records it)."""
    extra_files: tuple[Path, ...] = ()
    """Further files every artifact carries (a GGUF's ``tokenizer_config.json``: its chat
    template)."""
    notes: tuple[str, ...] = ()
    """What reading the source changed (a corrected axis declaration)."""


def resolve_source(spec: BuildSpec, store: ArtifactStore) -> Path:
    """The source ONNX path; the demo model is generated, and a GGUF imported
    (:func:`import_gguf_cached`), into the store's cache once."""
    if isinstance(spec.source, GgufSource):
        return import_gguf_cached(spec.source.path, store).model
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


def import_gguf_cached(path: Path, store: ArtifactStore) -> GgufImport:
    """The ONNX export folder of a GGUF file, imported once into the store's source cache.

    The folder is keyed by the file's sha256 and the importer's version, written beside
    and renamed into place, so a build that finds it imports nothing and an interrupted
    import leaves nothing half-written behind.
    """
    from graylane.models.gguf_import import (
        IMPORTER_VERSION,
        GgufImportError,
        import_gguf,
        read_import,
    )

    if not path.is_file():
        raise BuildError(f"source model {path} does not exist")
    digest = sha256_file(path)
    folder = store.cache_dir(CacheKind.SOURCES) / (
        f"gguf-{path.stem}-{digest[:16]}-import{IMPORTER_VERSION}"
    )
    found = read_import(folder)
    if found is not None:
        return found
    partial_dir = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(partial_dir, ignore_errors=True)
    try:
        imported = import_gguf(path, partial_dir, source_sha256=digest)
    except GgufImportError as exc:
        shutil.rmtree(partial_dir, ignore_errors=True)
        raise BuildError(str(exc)) from None
    try:
        partial_dir.rename(folder)
    except OSError:  # another build imported it meanwhile
        shutil.rmtree(partial_dir, ignore_errors=True)
    found = read_import(folder)
    if found is None:
        raise BuildError(f"the import of {path.name} into {folder} did not complete")
    return replace(found, duration_s=imported.duration_s, cache_hit=False)


def read_source(spec: BuildSpec, store: ArtifactStore) -> SourceModel:
    """Resolve the source, hash it and read its signature, model info and metadata.

    A merged decoder whose mask is declared as wide as ``input_ids``
    (:mod:`graylane.artifacts.decoder_axes`) is built from a copy with the mask's
    axis corrected, and a GGUF from its ONNX import; the version keeps the digest of
    the file the spec names.
    """
    if isinstance(spec.source, GgufSource):
        return _read_gguf_source(spec, store)
    source = resolve_source(spec, store)
    header = load_header(source)
    source_sha = sha256_file(source)
    external = source.stat().st_size > EXTERNAL_DATA_THRESHOLD or any(
        init.data_location == 1 for init in header.graph.initializer
    )
    notes: list[str] = []
    if mask_axis_conflict(header) is not None:
        source, note = _corrected_copy(source, source_sha, store, external)
        header = load_header(source)
        notes.append(note)
    signature = io_signature(header)
    # A transformers export declares its positions in the config.json beside it.
    max_seq_len = metadata_int(header, "max_seq_len") or max_positions_from_hf_config(
        _spec_source_folder(spec, source)
    )
    pad_id = metadata_int(header, "pad_id") or 0
    info = replace(
        read_model_info(header, task=spec.task, vocab_size=spec.vocab_size),
        max_seq_len=max_seq_len,
    )
    tokenizer = None
    if spec.tokenizer is not None:
        tokenizer = spec.tokenizer.path
        info = replace(info, tokenizer=_tokenizer_file(spec, info))
    return SourceModel(
        path=source,
        sha256=source_sha,
        signature=signature,
        info=info,
        max_seq_len=max_seq_len,
        pad_id=pad_id,
        external=external,
        tokenizer=tokenizer,
        notes=tuple(notes),
    )


def _read_gguf_source(spec: BuildSpec, store: ArtifactStore) -> SourceModel:
    """A GGUF source: its ONNX import (cached), tokenizer and chat template; the version
    records the GGUF file's digest."""
    assert isinstance(spec.source, GgufSource)
    imported = import_gguf_cached(spec.source.path, store)
    header = load_header(imported.model)
    info = replace(
        read_model_info(header, task=spec.task, vocab_size=spec.vocab_size),
        max_seq_len=imported.config.max_position_embeddings,
    )
    info = replace(
        info,
        tokenizer=_tokenizer_record(imported.tokenizer, info, imported.eos_id),
    )
    how = "cache hit" if imported.cache_hit else f"imported in {imported.duration_s:.0f}s"
    return SourceModel(
        path=imported.model,
        sha256=imported.source_sha256,
        signature=io_signature(header),
        info=info,
        max_seq_len=imported.config.max_position_embeddings,
        pad_id=0,
        external=imported.model.with_name(imported.model.name + ".data").exists(),
        tokenizer=imported.tokenizer,
        extra_files=tuple(p for p in (imported.tokenizer_config,) if p.is_file()),
        notes=(
            f"source {spec.source.path.name} (GGUF, sha256 {imported.source_sha256[:12]}…) "
            f"imported as an ONNX decoder without torch ({how}; {imported.folder.name})",
        ),
    )


def _spec_source_folder(spec: BuildSpec, resolved: Path) -> Path:
    """The folder of the source file the spec names (a corrected copy lives elsewhere)."""
    return spec.source.path.parent if isinstance(spec.source, FileSource) else resolved.parent


def _corrected_copy(
    source: Path, source_sha: str, store: ArtifactStore, external: bool
) -> tuple[Path, str]:
    """The source with its mask axis corrected, in the store's source cache; (path, note)."""
    import onnx

    model = onnx.load(str(source))
    correction = correct_mask_axis(model)
    assert correction is not None
    target = store.cache_dir(CacheKind.SOURCES) / f"{source.stem}-{source_sha[:16]}-axes.onnx"
    if not target.is_file():
        partial = target.with_suffix(".partial")
        onnx.save(model, str(partial), save_as_external_data=external)
        partial.replace(target)
    return target, correction.note()


def _tokenizer_file(spec: BuildSpec, info: ModelInfo) -> TokenizerFile:
    """What the manifests record of the spec's tokenizer, once it reads and fits the model."""
    assert spec.tokenizer is not None
    return _tokenizer_record(spec.tokenizer.path, info, spec.tokenizer.eos_token_id)


def _tokenizer_record(path: Path, info: ModelInfo, eos: int | None) -> TokenizerFile:
    """What the manifests record of a tokenizer, once it reads and fits the model."""
    from graylane.models.hf_tokenizer import HfTokenizer, TokenizerLoadError

    if not path.is_file():
        raise BuildError(f"tokenizer {path} does not exist")
    try:
        vocab = HfTokenizer(path).vocab_size
    except TokenizerLoadError as exc:
        raise BuildError(str(exc)) from None
    if info.vocab_size is not None and vocab > info.vocab_size:
        raise BuildError(
            f"tokenizer {path.name} has {vocab} tokens, the model takes {info.vocab_size}"
        )
    if eos is None:
        eos = eos_from_hf_configs(path.parent, tokenizer=path)
    return TokenizerFile(file=path.name, sha256=sha256_file(path), eos_token_id=eos)


# -- per-variant steps: produce, reference outputs, validate, refine ---------------------------


@dataclass(frozen=True)
class Reference:
    """The fp32 outputs every variant is compared with (None: no validation data)."""

    outputs: ReferenceOutputs | None = None
    run: RunResults | None = None


def produce_variants(
    plan: VariantPlan, inputs: VariantInputs, progress: ProgressSink
) -> dict[Precision, VariantOutcome]:
    """Produce every planned precision variant of the source, one step each."""
    outcomes: dict[Precision, VariantOutcome] = {}
    for precision in plan.produce:
        progress.step(f"producing {precision.value}")
        outcome = produce_variant(precision, inputs, copy_source=plan.copy_source)
        outcomes[precision] = outcome
        cache = ""
        if outcome.calibration is not None:
            cache = " (calibration cache hit)" if outcome.calibration.cache_hit else " (calibrated)"
        progress.done(
            f"{precision.value}: {outcome.status.value} in {outcome.duration_s:.1f}s{cache}"
            + (f" — {outcome.reason}" if outcome.reason else ""),
            ok=outcome.status is VariantStatus.PRODUCED,
        )
    return outcomes


def reference_step(
    spec: BuildSpec, source: SourceModel, validation: SampleSet | None, progress: ProgressSink
) -> Reference:
    """Run the source at fp32 through Polygraphy on the validation samples."""
    progress.step("reference outputs (fp32, through Polygraphy)")
    reference = Reference()
    if validation is not None:
        run = run_model(source.path, Precision.FP32.value, validation.batches)
        outputs = reference_outputs(
            open_runner(source.path),
            validation,
            source.signature,
            spec.generation if source.info.generates else None,
            source.max_seq_len,
            source.pad_id,
            outputs=outputs_of(run),
        )
        reference = Reference(outputs, run)
    progress.done("reference outputs ready" if reference.outputs else "no validation data in spec")
    return reference


def validate_variants(
    spec: BuildSpec,
    outcomes: dict[Precision, VariantOutcome],
    reference: Reference,
    validation: SampleSet | None,
    pad_id: int,
    progress: ProgressSink,
) -> dict[Precision, ValidationResult | None]:
    """Compare each produced variant with the reference under its tolerance."""
    results: dict[Precision, ValidationResult | None] = {}
    for precision, outcome in outcomes.items():
        progress.step(f"validating {precision.value}")
        result = None
        if outcome.path is not None and reference.outputs is not None and validation is not None:
            result = validate_with_polygraphy(
                precision,
                outcome.path,
                reference.outputs,
                reference.run,
                validation,
                spec.tolerance_for(precision),
                pad_id,
            )
        results[precision] = result
        progress.done(f"{precision.value}: {describe(result)}", ok=result is None or result.passed)
    return results


def refine_variants(
    spec: BuildSpec,
    source: SourceModel,
    outcomes: dict[Precision, VariantOutcome],
    results: dict[Precision, ValidationResult | None],
    inputs: VariantInputs,
    reference: Reference,
    validation: SampleSet | None,
    progress: ProgressSink,
) -> dict[Precision, PartialQuantization]:
    """Partial quantization of each int8 variant that missed its tolerance (in place)."""
    if reference.outputs is None or validation is None:
        return {}
    return refine_quantized(
        outcomes,
        results,
        inputs,
        spec.partial_quantization,
        partial(
            evaluator,
            reference.outputs,
            reference.run,
            validation,
            spec.tolerance_for,
            source.pad_id,
        ),
        fp32_path=outcomes[Precision.FP32].path or source.path
        if Precision.FP32 in outcomes
        else source.path,
        timing_batches=validation.batches,
        step=progress.step,
        done=lambda message, ok: progress.done(message, ok=ok),
        note=progress.note,
    )


def describe(result: ValidationResult | None) -> str:
    """One line on a variant's validation: its metrics, or why there are none."""
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


# -- TensorRT engines, published as their own artifacts ----------------------------------------


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
    tokenizer: Path | None = None,
) -> VariantReport:
    """Publish one TensorRT engine (with the build's tokenizer, if any) as its own artifact."""
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
            [staged, *([tokenizer] if tokenizer else [])],
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


_REPO_ROOT = Path(__file__).resolve().parent.parent


# -- publishing: each variant with its manifest, then the registry -----------------------------


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
    *,
    data: str | None = None,
) -> tuple[list[VariantReport], list[Path]]:
    """Publish every produced variant and its engines; (reports, published folders).

    ``data``: what the variants were validated on (recorded with each validation)."""
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
            validation=_validation_info(result, data),
            notes=outcome.notes + tuple(notes),
            model_info=source.info,
            partial_quantization=partials.get(precision),
            weight_only=outcome.weight_only,
        )
        folder = artifacts.publish(
            name,
            outcome.files + ((source.tokenizer,) if source.tokenizer else ()) + source.extra_files,
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
                publish_engine(
                    engine, manifest_base, artifacts, spec, result, published, source.tokenizer
                )
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
    *,
    store: Path | None = None,
) -> bool:
    """Record the servable artifacts in the registry; registered?

    A variant that failed or missed its tolerance does not hold the others back: the
    version is registered with its servable variants and the rest are named in the notes
    (the build still reports failure: exit status 2). Nothing is registered when the
    reference variant itself is not servable, since every other one is judged against it.
    """
    registered = False
    failed = not variants_ok(reports)
    progress.step("registering")
    counted = [r for r in reports if r.backend is not Backend.TENSORRT]
    servable = {r.folder for r in reports if r.servable and r.folder is not None}
    made = [r for r in counted if r.status is not VariantStatus.SKIPPED]
    reference_ok = bool(made) and made[0].servable  # the reference is produced first
    left_out = [
        r.precision.value
        for r in counted
        if r.status is not VariantStatus.SKIPPED and not (r.servable and r.folder is not None)
    ]
    chosen = [folder for folder in published if folder in servable]
    if failed and not reference_ok:
        notes.append("not registered: the reference variant is not servable")
    elif registry is not None and chosen:
        register_build(
            registry,
            spec.model,
            spec.version,
            source.sha256,
            [(read_manifest(folder), folder) for folder in chosen],
            replace=spec.force,
            store=store,
        )
        registered = True
        if left_out:
            notes.append(
                f"registered with its servable variants; not registered: {', '.join(left_out)}"
            )
    if registered:
        message = "registered in the model registry" + (
            f" (without {', '.join(left_out)})" if left_out else ""
        )
    elif failed:
        message = "registry: not registered, the reference variant failed"
    else:
        message = "registry: skipped"
    progress.done(message, ok=not failed)
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


def _validation_info(
    result: ValidationResult | None, data: str | None = None
) -> ValidationInfo | None:
    """The manifest's record of a validation result (and what it was judged on)."""
    if result is None:
        return None
    return ValidationInfo(
        passed=result.passed,
        tolerance=result.tolerance,
        metrics=result.metrics,
        failures=result.failures,
        error=result.error,
        comparison=result.comparison,
        data=data,
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


# -- registry records --------------------------------------------------------------------------


def artifact_record(manifest: Manifest, folder: Path, store: Path | None = None) -> ArtifactRecord:
    """The registry's view of a published artifact.

    Under ``store`` its location is recorded relative to the store, so a worker that mounts
    or fetches the store elsewhere (``GRAYLANE_ARTIFACT_DIR``) finds it there.
    """
    validation = manifest.validation
    summary = None
    if validation is not None:
        metrics = validation.metrics
        summary = ValidationSummary(
            passed=validation.passed,
            max_abs=None if metrics is None else metrics.max_abs,
            mean_rel=None if metrics is None else metrics.mean_rel,
            cosine=None if metrics is None else metrics.cosine,
            top1_agreement=None if metrics is None else metrics.top1_agreement,
            token_agreement=None if metrics is None else metrics.token_agreement,
            rows=None if metrics is None else metrics.rows,
            failures=validation.failures + ((validation.error,) if validation.error else ()),
        )
    return ArtifactRecord(
        name=manifest.name,
        path=str(_store_relative(folder, store)),
        manifest_sha256=manifest_sha256(folder),
        servable=manifest.servable,
        forced=manifest.forced,
        gpu_compute_capability=None
        if manifest.target is None
        else manifest.target.compute_capability,
        validation=summary,
        endpoint=_endpoint_summary(manifest.endpoint),
    )


def _endpoint_summary(endpoint: EndpointInfo | None) -> EndpointSummary | None:
    if endpoint is None:
        return None
    return EndpointSummary(
        url=endpoint.url,
        model_sha256=endpoint.model_sha256 or None,
        ladder_rank=endpoint.rung,
    )


def _store_relative(folder: Path, store: Path | None) -> Path:
    if store is None:
        return folder
    try:
        return folder.resolve().relative_to(store.resolve())
    except ValueError:
        return folder


def register_build(
    registry: Registry,
    model: str,
    version: SemVer,
    source_sha256: str,
    published: Sequence[tuple[Manifest, Path]],
    *,
    replace: bool,
    store: Path | None = None,
) -> list[ArtifactInfo]:
    """Ensure the model and version exist, then add every artifact.

    An existing version with another source digest is refused (versions are
    immutable) unless ``replace`` (a forced build) is set.
    """
    registry.register_model(model)
    try:
        existing = registry.get_version(model, version)
    except UnknownVersion:
        registry.register_version(model, version, source_sha256)
    else:
        if existing.source_sha256 != source_sha256 and not replace:
            raise DuplicateVersion(
                f"{model} {version} is registered with source sha256 "
                f"{existing.source_sha256[:12]}…, this build's source is {source_sha256[:12]}…; "
                "bump the version (or --force to overwrite)"
            )
    infos = [
        registry.add_artifact(artifact_record(manifest, folder, store), replace=replace)
        for manifest, folder in published
    ]
    registry.set_version_status(model, version, VersionStatus.BUILT)
    return infos


# -- the report: what a build did --------------------------------------------------------------


@dataclass(frozen=True)
class VariantReport:
    """One artifact the build tried to make."""

    precision: Precision
    backend: Backend
    status: VariantStatus
    reason: str | None = None
    artifact: ArtifactName | None = None
    folder: Path | None = None
    validation: ValidationResult | None = None
    servable: bool = False
    forced: bool = False
    compute_capability: str | None = None
    calibration: CalibrationInfo | None = None
    duration_s: float = 0.0
    endpoint: EndpointInfo | None = None
    """An engine-server variant: the endpoint it names (and what its probe answered)."""
    quality: RungQuality | None = None
    """An engine-server variant scored on the spec's evaluation set: its measured quality."""


@dataclass(frozen=True)
class BuildReport:
    model: str
    version: str
    source: Path | None
    """The ONNX file built from (``None``: an engine-served version)."""
    source_sha256: str
    store: Path
    variants: tuple[VariantReport, ...]
    tensorrt_note: str | None
    registered: bool
    duration_s: float
    model_info: ModelInfo | None = None
    notes: tuple[str, ...] = ()
    """What the build decided on its own (default validation data, skipped variants)."""

    @property
    def ok(self) -> bool:
        """Every variant was produced (an endpoint: registered) and is servable, or was
        skipped as pointless; TensorRT engines aside."""
        return variants_ok(self.variants)


def variants_ok(variants: tuple[VariantReport, ...] | list[VariantReport]) -> bool:
    """The build succeeded: each variant (an ONNX Runtime file, or an engine server's
    endpoint) is servable or was skipped, and one exists. TensorRT engines do not count:
    where one cannot be compiled, its ONNX variant serves."""
    counted = [v for v in variants if v.backend is not Backend.TENSORRT]
    return any(v.status is VariantStatus.PRODUCED for v in counted) and all(
        (v.status is VariantStatus.PRODUCED and v.servable) or v.status is VariantStatus.SKIPPED
        for v in counted
    )
