"""The per-variant steps of a build: produce, reference outputs, validate, refine.

Each step reports to the progress sink once per variant (or once in all) and
returns what the next one needs; none of them writes artifacts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from polygraphy.comparator import RunResults

from graylane.artifacts.build_info import PartialQuantization
from graylane.artifacts.naming import Precision
from graylane.builder.plan import VariantPlan
from graylane.builder.polygraphy_check import outputs_of, run_model, validate_with_polygraphy
from graylane.builder.progress import ProgressSink
from graylane.builder.runtime import open_runner
from graylane.builder.samples import SampleSet
from graylane.builder.sensitivity import evaluator, refine_quantized
from graylane.builder.source import SourceModel
from graylane.builder.spec import BuildSpec
from graylane.builder.validation import ReferenceOutputs, ValidationResult, reference_outputs
from graylane.builder.variants import VariantInputs, VariantOutcome, VariantStatus, produce_variant


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
