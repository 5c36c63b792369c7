"""Version-against-version consistency: two versions' served variants on the same inputs.

Both variants run in one ``Comparator.run`` (Polygraphy), on the same batches,
through the engine a worker on this host serves (TensorRT where present, else ONNX
Runtime);
Polygraphy's ``compare_accuracy`` gives per-output max/mean absolute and max
relative error; cosine and top-1 agreement per output, and greedy-token agreement
for decoders, are the thin wrappers the build's validation uses
(:func:`~graylane.builder.validation.compare_outputs`). Outputs whose schemas
differ (names, element types, ranks, fixed dimensions) are reported as
incompatible and not compared.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.comparator import Comparator, RunResults
from polygraphy.logger import G_LOGGER

from graylane.artifacts.build_info import Tolerance
from graylane.artifacts.manifest import Manifest
from graylane.artifacts.naming import Backend, Precision
from graylane.artifacts.verify import verify_artifact
from graylane.builder.polygraphy_check import EngineRunner, compare_runs
from graylane.builder.runtime import open_runner
from graylane.builder.samples import SampleSet
from graylane.builder.validation import (
    check_tolerance,
    compare_outputs,
    generation_prompts,
    greedy_generate,
    token_agreement,
)
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import DECODER_INPUTS, IOSignature
from graylane.errors import GraylaneError
from graylane.registry.repository import Registry

__all__ = [
    "DEFAULT_CONSISTENCY_TOLERANCE",
    "ConsistencyReport",
    "ConsistencyVerdict",
    "OutputConsistency",
    "ServedVariant",
    "check_consistency",
    "describe",
    "schema_differences",
    "served_variant",
]

DEFAULT_CONSISTENCY_TOLERANCE = Tolerance(
    min_cosine=0.995, min_top1_agreement=0.99, min_token_agreement=0.9
)
"""A candidate that should answer like the baseline: ≤ 1 % top-1 disagreement."""

_MODEL_SUFFIXES = (".onnx", ".plan", ".engine")


class ConsistencyError(GraylaneError):
    """The check cannot run: a version has no servable variant of the precision asked for."""


class ConsistencyVerdict(Enum):
    """Whether a candidate version answers like its baseline; the CLI exits with its code."""

    WITHIN = "within tolerance"
    OUTSIDE = "outside tolerance"
    INCOMPATIBLE = "incompatible schemas"

    @property
    def exit_code(self) -> int:
        return {
            ConsistencyVerdict.WITHIN: 0,
            ConsistencyVerdict.OUTSIDE: 1,
            ConsistencyVerdict.INCOMPATIBLE: 3,
        }[self]


@dataclass(frozen=True)
class ServedVariant:
    """The artifact a worker would serve for one version and precision."""

    version: str
    precision: Precision
    backend: Backend
    path: Path
    io: IOSignature


@dataclass(frozen=True)
class OutputConsistency:
    name: str
    max_abs: float
    mean_abs: float
    max_rel: float
    mean_rel: float
    cosine: float
    top1_agreement: float


@dataclass(frozen=True)
class ConsistencyReport:
    model: str
    baseline: ServedVariant
    candidate: ServedVariant
    tolerance: Tolerance
    samples: int
    engine: str
    outputs: tuple[OutputConsistency, ...] = ()
    token_agreement: float | None = None
    token_agreement_overall: float | None = None
    schema_problems: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()

    @property
    def verdict(self) -> ConsistencyVerdict:
        if self.schema_problems:
            return ConsistencyVerdict.INCOMPATIBLE
        return ConsistencyVerdict.OUTSIDE if self.failures else ConsistencyVerdict.WITHIN


def _model_file(folder: Path, manifest: Manifest) -> Path:
    for entry in manifest.files:
        if entry.path.endswith(_MODEL_SUFFIXES):
            return folder / entry.path
    raise ConsistencyError(f"{manifest.name}: the manifest lists no model file")


def _tensorrt_variant(
    registry: Registry, model: str, version: str, precision: Precision, store: Path
) -> ServedVariant | None:
    """The engine a worker on this host would serve, when it has TensorRT and a GPU."""
    from graylane.artifacts.compatibility import select_engine
    from graylane.engine.errors import IncompatibleEngineError
    from graylane.engine.tensorrt import gpu_compute_capability, tensorrt_version

    cc, trt = gpu_compute_capability(), tensorrt_version()
    if cc is None or trt is None:
        return None
    engines = [
        (store / a.path, verify_artifact(store / a.path, a.manifest_sha256))
        for a in registry.list_artifacts(model, version)
        if a.servable and a.precision is precision and a.backend is Backend.TENSORRT
    ]
    try:
        chosen = select_engine([m for _, m in engines], f"{cc[0]}.{cc[1]}", trt)
    except IncompatibleEngineError:
        return None
    folder = next(f for f, m in engines if m is chosen)
    path = _model_file(folder, chosen)
    return ServedVariant(version, precision, Backend.TENSORRT, path, chosen.io)


def served_variant(
    registry: Registry,
    model: str,
    version: str,
    precision: Precision,
    *,
    tensorrt: bool = True,
    store: Path = Path("."),
) -> ServedVariant:
    """The variant of that precision a worker here serves: the TensorRT engine built for
    this GPU where TensorRT is present (and ``tensorrt``), else the ONNX Runtime file;
    verified against its manifest. Store-relative locations are found under ``store``
    (``GRAYLANE_ARTIFACT_DIR``); absolute ones as they are."""
    if tensorrt:
        engine = _tensorrt_variant(registry, model, version, precision, store)
        if engine is not None:
            return engine
    listed = registry.list_artifacts(model, version)
    found = [
        a
        for a in listed
        if a.servable and a.precision is precision and a.backend is Backend.ONNXRUNTIME
    ]
    if not found:
        served = sorted({a.backend.value for a in listed if a.backend.is_engine_server})
        raise ConsistencyError(
            f"{model} {version} has no servable {precision.value} variant"
            + (
                f" of its own: an engine server ({', '.join(served)}) serves it, and this "
                "check runs ONNX Runtime and TensorRT variants on this host"
                if served
                else ""
            )
        )
    art = max(found, key=lambda a: a.created_at)
    folder = store / art.path
    manifest = verify_artifact(folder, art.manifest_sha256)
    return ServedVariant(
        version, precision, art.backend, _model_file(folder, manifest), manifest.io
    )


def schema_differences(baseline: IOSignature, candidate: IOSignature) -> tuple[str, ...]:
    """Why two signatures cannot be compared output by output (empty: they can)."""
    problems: list[str] = []
    base_in = {t.name: t for t in baseline.inputs}
    cand_in = {t.name: t for t in candidate.inputs}
    if set(base_in) != set(cand_in):
        problems.append(f"inputs differ: {sorted(base_in)} vs {sorted(cand_in)}")
    for name in sorted(set(base_in) & set(cand_in)):
        if base_in[name].dtype != cand_in[name].dtype:
            problems.append(f"input {name!r}: {base_in[name].dtype} vs {cand_in[name].dtype}")
    base_out = {t.name: t for t in baseline.outputs}
    cand_out = {t.name: t for t in candidate.outputs}
    if set(base_out) != set(cand_out):
        problems.append(f"outputs differ: {sorted(base_out)} vs {sorted(cand_out)}")
    for name in sorted(set(base_out) & set(cand_out)):
        b, c = base_out[name], cand_out[name]
        if b.dtype != c.dtype:
            problems.append(f"output {name!r}: element type {b.dtype} vs {c.dtype}")
        if len(b.shape) != len(c.shape):
            problems.append(f"output {name!r}: rank {len(b.shape)} vs {len(c.shape)}")
            continue
        for axis, (db, dc) in enumerate(zip(b.shape, c.shape, strict=True)):
            if isinstance(db, int) and isinstance(dc, int) and db != dc:
                problems.append(f"output {name!r}: axis {axis} is {db} vs {dc}")
    return tuple(problems)


class _TensorRTRunner(BaseRunner):  # type: ignore[misc]  # Polygraphy ships no type hints
    """A Polygraphy runner over the project's TensorRT adapter (the worker's engine)."""

    def __init__(self, variant: ServedVariant, name: str) -> None:
        super().__init__(name=name, prefix="graylane-trt")
        self._variant = variant
        self._engine: InferenceEngine | None = None

    def activate_impl(self) -> None:
        self._engine = _open_engine(self._variant)

    def deactivate_impl(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine = None

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for spec in self._variant.io.inputs:
            meta.add(spec.name, spec.dtype, [d if isinstance(d, int) else -1 for d in spec.shape])
        return meta

    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        if self._engine is None:
            raise RuntimeError(f"runner {self.name} is not active")
        start = time.perf_counter()
        outputs = self._engine.run(feed_dict)
        self.inference_time = time.perf_counter() - start
        return OrderedDict((n, outputs[n]) for n in self._variant.io.output_names)


def _open_engine(variant: ServedVariant) -> InferenceEngine:
    if variant.backend is Backend.TENSORRT:
        from graylane.engine.tensorrt import TensorRTEngine

        return TensorRTEngine.load(variant.path, variant.precision.value)
    return open_runner(variant.path).engine


def _runner(model: str, variant: ServedVariant) -> BaseRunner:
    name = f"{model}@{variant.version}"
    if variant.backend is Backend.TENSORRT:
        return _TensorRTRunner(variant, name)
    return EngineRunner(variant.path, name)


def _greedy(
    variant: ServedVariant, prompts: list[np.ndarray], new_tokens: int, pad_id: int
) -> np.ndarray:
    if variant.backend is Backend.TENSORRT:
        engine = _open_engine(variant)
        try:
            return greedy_generate(engine.run, prompts, new_tokens, pad_id)
        finally:
            engine.close()
    runner = open_runner(variant.path)
    try:
        return greedy_generate(runner, prompts, new_tokens, pad_id)
    finally:
        runner.engine.close()


def _single(results: RunResults, index: int) -> RunResults:
    single = RunResults()
    single.append(results[index])
    return single


def check_consistency(
    model: str,
    baseline: ServedVariant,
    candidate: ServedVariant,
    samples: SampleSet,
    tolerance: Tolerance = DEFAULT_CONSISTENCY_TOLERANCE,
    *,
    prompts: int = 8,
    new_tokens: int = 16,
    pad_id: int = 0,
    max_seq_len: int | None = None,
) -> ConsistencyReport:
    """Run both variants on ``samples`` and judge the candidate against the baseline."""
    from graylane.builder.polygraphy_check import ENGINE

    report = ConsistencyReport(
        model=model,
        baseline=baseline,
        candidate=candidate,
        tolerance=tolerance,
        samples=samples.count,
        engine=ENGINE,
    )
    problems = schema_differences(baseline.io, candidate.io)
    if problems:
        return replace(report, schema_problems=problems)
    runners = [_runner(model, baseline), _runner(model, candidate)]
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        results = Comparator.run(runners, data_loader=[dict(b) for b in samples.batches])
    comparison = compare_runs(_single(results, 0), _single(results, 1), tolerance)
    base_iters = [{k: np.asarray(v) for k, v in it.items()} for it in results[0][1]]
    cand_iters = [{k: np.asarray(v) for k, v in it.items()} for it in results[1][1]]
    mask_name = DECODER_INPUTS[1]
    masks = [b.get(mask_name) if mask_name in b else None for b in samples.batches]
    outputs: list[OutputConsistency] = []
    failures: list[str] = []
    for entry in comparison.outputs:
        metrics = compare_outputs(
            [{entry.name: it[entry.name]} for it in base_iters],
            [{entry.name: it[entry.name]} for it in cand_iters],
            masks,
        )
        outputs.append(
            OutputConsistency(
                name=entry.name,
                max_abs=entry.max_abs,
                mean_abs=entry.mean_abs,
                max_rel=entry.max_rel,
                mean_rel=metrics.mean_rel,
                cosine=metrics.cosine,
                top1_agreement=metrics.top1_agreement,
            )
        )
        failures.extend(f"{entry.name}: {f}" for f in check_tolerance(metrics, tolerance))
    tokens: tuple[float, float] | None = None
    if baseline.io.is_decoder and prompts > 0:
        chosen = generation_prompts(samples, prompts, new_tokens, max_seq_len)
        tokens = token_agreement(
            _greedy(baseline, chosen, new_tokens, pad_id),
            _greedy(candidate, chosen, new_tokens, pad_id),
        )
        floor = tolerance.min_token_agreement
        if floor is not None and tokens[0] < floor:
            failures.append(f"greedy token agreement {tokens[0]:.4f} < {floor}")
    return replace(
        report,
        outputs=tuple(outputs),
        token_agreement=None if tokens is None else tokens[0],
        token_agreement_overall=None if tokens is None else tokens[1],
        failures=tuple(failures),
    )


def describe(report: ConsistencyReport) -> Sequence[str]:
    """Plain-text lines of a report, for the CLI."""
    b, c = report.baseline, report.candidate
    lines = [
        f"{report.model}: {c.version} ({c.precision.value}, {c.backend.value}) against "
        f"{b.version} ({b.precision.value}, {b.backend.value}) on {report.samples} samples "
        f"via {report.engine}"
    ]
    if report.schema_problems:
        lines.append("incompatible output schemas, not compared:")
        lines.extend(f"  {p}" for p in report.schema_problems)
        return lines
    lines.append(
        f"  {'output':<16}{'max|Δ|':>12}{'mean|Δ|':>12}{'max rel':>12}{'mean rel':>10}"
        f"{'cosine':>10}{'top-1':>8}"
    )
    for o in report.outputs:
        lines.append(
            f"  {o.name:<16}{o.max_abs:>12.4g}{o.mean_abs:>12.4g}{o.max_rel:>12.4g}"
            f"{o.mean_rel:>10.4f}{o.cosine:>10.5f}{o.top1_agreement:>8.3f}"
        )
    if report.token_agreement is not None:
        lines.append(
            f"  greedy tokens: prefix agreement {report.token_agreement:.3f}, "
            f"position-wise {report.token_agreement_overall:.3f}"
        )
    lines.append(f"verdict: {report.verdict.value}")
    lines.extend(f"  {f}" for f in report.failures)
    return lines
