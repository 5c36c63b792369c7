"""Comparisons through Polygraphy's runners and comparator.

Every model runs through :class:`EngineRunner`, a Polygraphy runner that wraps the
project's ONNX Runtime adapter (:func:`~graylane.builder.runtime.open_runner`), so a
variant is judged under exactly the session options a worker serves it with.
``Comparator.run`` produces the outputs; ``Comparator.compare_accuracy`` with a
``SimpleCompareFunc`` (``atol`` = the tolerance's ``max_abs``, on the max error)
gives the element-wise report kept in the manifest. The task-level limits (cosine,
top-1 and greedy-token agreement) are a thin wrapper over the same ``RunResults``:
:func:`graylane.builder.validation.compare_outputs` + ``check_tolerance``.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polygraphy
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.comparator import Comparator, RunResults
from polygraphy.comparator.compare import SimpleCompareFunc
from polygraphy.logger import G_LOGGER

from graylane.artifacts.build_info import ComparisonReport, OutputComparison, Tolerance
from graylane.artifacts.naming import Precision
from graylane.builder.runtime import OrtRunner, open_runner
from graylane.builder.samples import SampleSet
from graylane.builder.validation import ReferenceOutputs, ValidationResult, validate_variant

__all__ = [
    "ENGINE",
    "EngineRunner",
    "compare_runs",
    "outputs_of",
    "run_model",
    "validate_with_polygraphy",
]

ENGINE = f"polygraphy {polygraphy.__version__}"


class EngineRunner(BaseRunner):  # type: ignore[misc]  # Polygraphy ships no type hints
    """A Polygraphy runner over :class:`~graylane.engine.onnxruntime.OnnxRuntimeEngine`.

    Inputs are the model's plain inputs: ``past_key_values.*`` of a decoder-with-past
    are filled with an empty past, as :class:`~graylane.builder.runtime.OrtRunner` does.
    """

    def __init__(self, path: Path, name: str, threads: int | None = None) -> None:
        super().__init__(name=name, prefix="graylane-ort")
        self._path = path
        self._threads = threads
        self._runner: OrtRunner | None = None

    def activate_impl(self) -> None:
        self._runner = open_runner(self._path, threads=self._threads)

    def deactivate_impl(self) -> None:
        if self._runner is not None:
            self._runner.engine.close()
        self._runner = None

    def _live(self) -> OrtRunner:
        if self._runner is None:
            raise RuntimeError(f"runner {self.name} is not active")
        return self._runner

    def get_input_metadata_impl(self) -> TensorMetadata:
        runner = self._live()
        meta = TensorMetadata()
        for spec in runner.engine.io.inputs:
            if spec.name in runner.derived_inputs:
                continue
            shape = [d if isinstance(d, int) else -1 for d in spec.shape]
            meta.add(spec.name, spec.dtype, shape)
        return meta

    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        start = time.perf_counter()
        outputs = self._live()(feed_dict)
        self.inference_time = time.perf_counter() - start
        return OrderedDict((name, outputs[name]) for name in self._live().engine.io.output_names)


def run_model(
    path: Path, label: str, batches: Sequence[Mapping[str, np.ndarray]], threads: int | None = None
) -> RunResults:
    """``Comparator.run`` of one model over ``batches`` (one iteration per batch)."""
    feeds = [dict(b) for b in batches]
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        return Comparator.run([EngineRunner(path, label, threads)], data_loader=feeds)


def outputs_of(results: RunResults) -> tuple[dict[str, np.ndarray], ...]:
    """The outputs of the (only or first) runner in ``results``, one mapping per iteration."""
    _, iterations = results[0]
    return tuple({k: np.asarray(v) for k, v in it.items()} for it in iterations)


def _float_names(iterations: Sequence[Mapping[str, Any]]) -> list[str]:
    if not iterations:
        return []
    return [n for n, v in iterations[0].items() if np.issubdtype(np.asarray(v).dtype, np.floating)]


def compare_runs(
    baseline: RunResults, candidate: RunResults, tolerance: Tolerance
) -> ComparisonReport:
    """Polygraphy's accuracy comparison of two single-runner runs on the same inputs."""
    (base_name, base_iters), (cand_name, cand_iters) = baseline[0], candidate[0]
    if len(base_iters) != len(cand_iters):
        raise ValueError(f"runs differ in iterations: {len(base_iters)} vs {len(cand_iters)}")
    names = _float_names(base_iters)
    checked = tolerance.max_abs is not None
    atol = tolerance.max_abs if tolerance.max_abs is not None else math.inf
    combined = RunResults()
    combined.append((base_name, base_iters))
    combined.append((cand_name, cand_iters))
    func = SimpleCompareFunc(check_shapes=True, atol=atol, rtol=0.0, check_error_stat="max")
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        accuracy = Comparator.compare_accuracy(combined, compare_func=func)
    per_iteration = next(iter(accuracy[0].values())) if len(accuracy) else []
    outputs: list[OutputComparison] = []
    for name in names:
        results = [it[name] for it in per_iteration if name in it]
        if not results:
            continue
        weights = [int(np.asarray(it[name]).size) for it in base_iters]
        outputs.append(
            OutputComparison(
                name=name,
                max_abs=max(float(r.max_absdiff) for r in results),
                max_rel=max(float(r.max_reldiff) for r in results),
                mean_abs=float(
                    np.average([float(r.mean_absdiff) for r in results], weights=weights)
                ),
                passed=all(bool(r) for r in results) if checked else None,
            )
        )
    return ComparisonReport(
        engine=ENGINE,
        baseline=base_name,
        candidate=cand_name,
        iterations=len(base_iters),
        outputs=tuple(outputs),
    )


def validate_with_polygraphy(
    precision: Precision,
    path: Path,
    reference: ReferenceOutputs,
    reference_run: RunResults | None,
    samples: SampleSet,
    tolerance: Tolerance,
    pad_id: int = 0,
) -> ValidationResult:
    """Run the variant at ``path`` through Polygraphy and judge it against the fp32 run."""
    try:
        run = run_model(path, precision.value, samples.batches)
        comparison = None if reference_run is None else compare_runs(reference_run, run, tolerance)
        outputs = outputs_of(run)
    except Exception as exc:  # a variant that cannot run is a failed validation, not a crash
        return ValidationResult(
            precision=precision, tolerance=tolerance, metrics=None, error=str(exc)
        )
    return validate_variant(
        precision,
        open_runner(path),
        reference,
        samples,
        tolerance,
        pad_id,
        outputs=outputs,
        comparison=comparison,
    )
