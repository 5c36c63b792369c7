"""Sensitivity-guided partial quantization of an int8 variant that missed its tolerance.

1. Probe: for each group of quantizable nodes (one node per group when there are
   at most ``max_groups``, else one transformer layer per group), output side
   first, quantize the model with only that group kept in float and measure
   agreement with fp32 on the validation samples. The group whose exclusion helps
   most is the most sensitive. A smallest group that alone brings the variant
   within tolerance ends the probing.
2. Exclude: keep groups in float, most sensitive first, re-quantizing and
   re-validating after each, until the tolerance holds or the next group would
   pass the node budget.

Calibration is cached (:mod:`graylane.builder.calibration`), so each trial costs
one quantizer pass and one validation run, not a calibration.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from polygraphy.comparator import RunResults

from graylane.artifacts.build_info import GroupSensitivity, PartialQuantization, Tolerance
from graylane.artifacts.naming import Precision
from graylane.builder.polygraphy_check import validate_with_polygraphy
from graylane.builder.runtime import open_runner
from graylane.builder.samples import SampleSet
from graylane.builder.spec import PartialQuantizationSpec
from graylane.builder.validation import ReferenceOutputs, ValidationResult
from graylane.builder.variants import (
    HEAD_MARKERS,
    VariantInputs,
    VariantOutcome,
    VariantStatus,
    produce_variant,
)

__all__ = [
    "QUANTIZED",
    "PartialSearch",
    "evaluator",
    "layer_groups",
    "quantizable_nodes",
    "refine_quantized",
    "search_partial",
    "time_variants",
]

Evaluate = Callable[[Path], ValidationResult]

_LAYER = re.compile(r"\d")


@dataclass(frozen=True)
class PartialSearch:
    """The variant to publish (partial when it passed, else the full one) and the record."""

    outcome: VariantOutcome
    result: ValidationResult
    info: PartialQuantization


def quantizable_nodes(source: Path, op_types: Sequence[str] | None) -> list[str]:
    """Named nodes of the ops the int8 variants quantize, in graph order."""
    graph = onnx.load(str(source), load_external_data=False).graph
    return [n.name for n in graph.node if n.name and (not op_types or n.op_type in op_types)]


def _layer_of(name: str) -> str:
    """``h0`` of ``h0.attn.qkv.matmul_1``; ``layers.0`` of ``/model/layers.0/q_proj/MatMul``."""
    segments = [s for s in name.split("/") if s]
    for segment in segments:
        if _LAYER.search(segment):
            parts = segment.split(".")
            end = next(i for i, p in enumerate(parts) if _LAYER.search(p))
            return ".".join(parts[: end + 1])
    return segments[0] if segments else name


def layer_groups(nodes: Sequence[str], max_groups: int) -> list[tuple[str, tuple[str, ...]]]:
    """(group name, nodes): one node each when few enough, else per layer (first numbered part)."""
    if len(nodes) <= max_groups:
        return [(n, (n,)) for n in nodes]
    groups: dict[str, list[str]] = {}
    for n in nodes:
        groups.setdefault(_layer_of(n), []).append(n)
    return [(g, tuple(members)) for g, members in groups.items()]


def time_variants(
    paths: Sequence[Path], batches: Sequence[Mapping[str, np.ndarray]], reps: int = 5
) -> list[float]:
    """Best ms of one pass over ``batches`` per model, one thread, after a warm-up pass.

    The models take turns within each repetition, so load from other processes
    on a shared machine hits them alike; the best pass is the least disturbed one.
    """
    runners = [open_runner(p, threads=1) for p in paths]
    best = [float("inf")] * len(runners)
    try:
        for runner in runners:
            for batch in batches[:1]:
                runner(batch)
        for _ in range(reps):
            for i, runner in enumerate(runners):
                start = time.perf_counter()
                for batch in batches:
                    runner(batch)
                best[i] = min(best[i], (time.perf_counter() - start) * 1000.0)
    finally:
        for runner in runners:
            runner.engine.close()
    return best


def _top1(result: ValidationResult) -> float:
    return -1.0 if result.metrics is None else result.metrics.top1_agreement


def _cosine(result: ValidationResult) -> float:
    return -1.0 if result.metrics is None else result.metrics.cosine


def search_partial(
    precision: Precision,
    inputs: VariantInputs,
    full: tuple[VariantOutcome, ValidationResult],
    evaluate: Evaluate,
    options: PartialQuantizationSpec,
    *,
    fp32_path: Path | None = None,
    timing_batches: Sequence[Mapping[str, np.ndarray]] = (),
    log: Callable[[str], None] = lambda _: None,
    note: Callable[[str], None] = lambda _: None,
) -> PartialSearch:
    """Bring ``precision`` within its tolerance by keeping the most sensitive nodes in float."""
    full_outcome, full_result = full
    op_types = ("MatMul",) if precision.weight_only else inputs.op_types_to_quantize
    nodes = [
        n
        for n in quantizable_nodes(inputs.source, op_types)
        if n not in inputs.nodes_to_exclude
        and not (precision.weight_only and any(m in n for m in HEAD_MARKERS))
    ]
    groups = layer_groups(nodes, options.max_groups)
    tried: dict[frozenset[str], tuple[VariantOutcome, ValidationResult]] = {}
    clock = _TrialClock(options.time_budget_s, options.max_trials)

    def trial(excluded: tuple[str, ...]) -> tuple[VariantOutcome, ValidationResult] | None:
        """The variant with ``excluded`` kept in float, validated; None when the search's
        time or trial budget would be passed by one more."""
        key = frozenset(excluded)
        if key not in tried:
            if not clock.allows(len(tried)):
                return None
            log(
                f"partial quantization of {precision.value}: trial {len(tried) + 1} "
                f"(at most {options.max_trials}), {clock.describe()}"
            )
            began = time.perf_counter()
            work = inputs.work_dir / f"partial-{precision.value}-{len(tried)}"
            outcome = produce_variant(
                precision,
                replace(
                    inputs,
                    work_dir=work,
                    nodes_to_exclude=(*inputs.nodes_to_exclude, *excluded),
                ),
            )
            if outcome.status is not VariantStatus.PRODUCED or outcome.path is None:
                result = ValidationResult(
                    precision=precision,
                    tolerance=full_result.tolerance,
                    metrics=None,
                    error=outcome.reason or "not produced",
                )
            else:
                result = evaluate(outcome.path)
            tried[key] = (outcome, result)
            clock.spent(time.perf_counter() - began)
            kept = _summary(excluded)
            verdict = " (within tolerance)" if result.passed else ""
            note(
                f"trial {len(tried)}: {kept} in float, top-1 {_top1(result):.4f}{verdict} "
                f"({clock.trial_s[-1]:.0f}s; {clock.describe()})"
            )
        return tried[key]

    sensitivity: list[GroupSensitivity] = []
    # Output side first: the head and the last layers are the usual suspects, and a
    # single group that suffices ends the probing (nothing can keep fewer nodes).
    for name, members in reversed(groups):
        if len(members) > options.node_budget:
            continue
        probed = trial(members)
        if probed is None:
            break
        _, result = probed
        sensitivity.append(GroupSensitivity(name, members, _top1(result), _cosine(result)))
        if result.passed and len(members) == min(len(m) for _, m in groups):
            break
    sensitivity.sort(key=lambda s: (s.top1_agreement, s.cosine), reverse=True)

    excluded: list[str] = []
    best: tuple[VariantOutcome, ValidationResult] | None = None
    for group in sensitivity:
        if len(excluded) + len(group.nodes) > options.node_budget:
            continue
        attempt = trial((*excluded, *group.nodes))
        if attempt is None:
            break
        excluded.extend(group.nodes)
        best = attempt
        if best[1].passed:
            break
    passed = best is not None and best[1].passed
    chosen = best if passed and best is not None else (full_outcome, full_result)
    if chosen[0] is not full_outcome:
        # The ranges were measured once, by the full variant; trials only read the cache.
        chosen = (replace(chosen[0], calibration=full_outcome.calibration), chosen[1])
    fp32_ms = variant_ms = full_ms = None
    if (
        fp32_path is not None
        and timing_batches
        and chosen[0].path is not None
        and full_outcome.path is not None
    ):
        fp32_ms, variant_ms, full_ms = time_variants(
            [fp32_path, chosen[0].path, full_outcome.path], timing_batches
        )
    info = PartialQuantization(
        full_failures=full_result.failures or ((full_result.error,) if full_result.error else ()),
        full_top1_agreement=None if full_result.metrics is None else _top1(full_result),
        quantizable_nodes=len(nodes),
        node_budget=options.node_budget,
        kept_float=tuple(excluded) if passed else (),
        passed=passed,
        trials=len(tried),
        stopped_by=clock.stopped_by,
        duration_s=round(clock.elapsed, 1),
        sensitivity=tuple(sensitivity),
        fp32_ms=fp32_ms,
        variant_ms=variant_ms,
        full_ms=full_ms,
    )
    return PartialSearch(outcome=chosen[0], result=chosen[1], info=info)


def _summary(nodes: Sequence[str]) -> str:
    layers = sorted({_layer_of(n) for n in nodes})
    return f"{len(nodes)} node(s) of {', '.join(layers[:6])}{' …' if len(layers) > 6 else ''}"


class _TrialClock:
    """The search's budget: wall-clock time and trial count, and an estimate of the next."""

    def __init__(self, budget_s: float, max_trials: int) -> None:
        self.budget_s = budget_s
        self.max_trials = max_trials
        self.started = time.perf_counter()
        self.trial_s: list[float] = []
        self.stopped_by: str | None = None
        """Why the search ended early (``time budget``, ``trial budget``), if it did."""

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def spent(self, seconds: float) -> None:
        self.trial_s.append(seconds)

    def allows(self, trials: int) -> bool:
        """Whether one more trial fits: under the trial cap, and (by the mean so far) the
        time budget."""
        if trials >= self.max_trials:
            self.stopped_by = f"trial budget ({self.max_trials})"
            return False
        estimate = sum(self.trial_s) / len(self.trial_s) if self.trial_s else 0.0
        if self.elapsed + estimate > self.budget_s:
            self.stopped_by = f"time budget ({self.budget_s:.0f}s)"
            return False
        return True

    def describe(self) -> str:
        each = sum(self.trial_s) / len(self.trial_s) if self.trial_s else None
        per = f", ~{each:.0f}s per trial" if each is not None else ""
        return f"{self.elapsed:.0f}s of {self.budget_s:.0f}s{per}"


QUANTIZED = (
    Precision.INT8,
    Precision.INT8_DYNAMIC,
    Precision.INT8_WEIGHT_ONLY,
    Precision.INT4,
)


def refine_quantized(
    outcomes: dict[Precision, VariantOutcome],
    results: dict[Precision, ValidationResult | None],
    inputs: VariantInputs,
    options: PartialQuantizationSpec,
    evaluator: Callable[[Precision], Evaluate],
    *,
    fp32_path: Path,
    timing_batches: Sequence[Mapping[str, np.ndarray]],
    step: Callable[[str], None],
    done: Callable[[str, bool], None],
    note: Callable[[str], None] = lambda _: None,
) -> dict[Precision, PartialQuantization]:
    """Run :func:`search_partial` on each int8 variant that ran but missed its tolerance.

    ``outcomes``/``results`` are updated in place with the variant to publish.
    """
    records: dict[Precision, PartialQuantization] = {}
    for precision in QUANTIZED:
        if precision not in outcomes:
            continue
        step(f"partial quantization of {precision.value}")
        outcome, result = outcomes[precision], results.get(precision)
        if result is None or outcome.path is None:
            done(f"{precision.value}: not validated, nothing to refine", True)
            continue
        if result.passed:
            done(f"{precision.value}: not needed", True)
            continue
        if not options.enabled or options.node_budget == 0:
            done(f"{precision.value}: disabled in the spec", False)
            continue
        search = search_partial(
            precision,
            inputs,
            (outcome, result),
            evaluator(precision),
            options,
            fp32_path=fp32_path,
            timing_batches=timing_batches,
            log=step,
            note=note,
        )
        outcomes[precision], results[precision] = search.outcome, search.result
        records[precision] = search.info
        info = search.info
        speed = "" if info.speedup_vs_fp32 is None else f", {info.speedup_vs_fp32:.2f}x fp32"
        if info.passed:
            done(
                f"{precision.value}: within tolerance with {len(info.kept_float)} of "
                f"{info.quantizable_nodes} node(s) kept in float ({info.trials} trials{speed})",
                True,
            )
        else:
            ended = f", stopped by its {info.stopped_by}" if info.stopped_by else ""
            done(
                f"{precision.value}: no partial variant within tolerance under a budget of "
                f"{info.node_budget} node(s) ({info.trials} trials in {info.duration_s:.0f}s"
                f"{ended})",
                False,
            )
    return records


def evaluator(
    reference: ReferenceOutputs,
    reference_run: RunResults | None,
    validation: SampleSet,
    tolerance_for: Callable[[Precision], Tolerance],
    pad_id: int,
    precision: Precision,
) -> Evaluate:
    """Validation of one more candidate file of ``precision`` against the fp32 reference."""
    return lambda path: validate_with_polygraphy(
        precision, path, reference, reference_run, validation, tolerance_for(precision), pad_id
    )
