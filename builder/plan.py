"""What a build makes of its source (pure): which variants, under which labels, with which
validation data when the spec gives none.

A source that is already quantized is published as what it is (``int8`` for QDQ or
QOperator graphs, ``int8-dynamic`` for dynamically quantized ones), never as
``fp32``; the variants that make no sense for it are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from graylane.artifacts.build_info import ShapeProfile
from graylane.artifacts.model_info import ModelInfo, SourceQuantization
from graylane.artifacts.naming import Precision
from graylane.builder.spec import DataSpec, Generator, GeneratorData
from graylane.engine.signature import IOSignature

__all__ = [
    "DEFAULT_VALIDATION_SAMPLES",
    "VariantPlan",
    "default_validation",
    "plan_variants",
    "with_declared_vocab",
    "with_tokenizer",
]

DEFAULT_VALIDATION_SAMPLES = 16
_DEFAULT_SEQ_LEN = 16


@dataclass(frozen=True)
class VariantPlan:
    reference: Precision
    """The variant every other one is validated against (the source, as labelled)."""
    produce: tuple[Precision, ...]
    copy_source: bool
    """True: the reference is the source graph as-is (it is already quantized)."""
    skipped: Mapping[Precision, str]
    """Requested precisions this build does not make, and why."""


_LABELS = {
    SourceQuantization.DYNAMIC: Precision.INT8_DYNAMIC,
    SourceQuantization.WEIGHT_ONLY_8BIT: Precision.INT8_WEIGHT_ONLY,
    SourceQuantization.WEIGHT_ONLY_4BIT: Precision.INT4,
}
"""What an already quantized source is published as (else ``int8``: QDQ or QOperator)."""


def plan_variants(requested: Sequence[Precision], quantization: SourceQuantization) -> VariantPlan:
    if quantization is SourceQuantization.NONE:
        return VariantPlan(Precision.FP32, tuple(requested), copy_source=False, skipped={})
    label = _LABELS.get(quantization, Precision.INT8)
    what = f"the source is already quantized ({quantization.value})"
    reasons = {
        Precision.FP32: f"{what}; it is published as {label.value}, not relabelled fp32",
        Precision.FP16: f"{what}; fp16 conversion would cast its quantization scales",
        Precision.INT8: f"{what}; there are no float activations left to calibrate",
        Precision.INT8_DYNAMIC: f"{what}; int8-dynamic would re-quantize int8 weights",
        Precision.INT8_WEIGHT_ONLY: f"{what}; its weights are quantized already",
        Precision.INT4: f"{what}; its weights are quantized already",
    }
    skipped = {p: reasons[p] for p in requested if p is not label}
    return VariantPlan(label, (label,), copy_source=True, skipped=skipped)


def default_validation(
    info: ModelInfo,
    signature: IOSignature,
    profiles: Sequence[ShapeProfile],
    max_seq_len: int | None,
) -> DataSpec:
    """Validation data for a spec without a ``validation`` section.

    Random tensors that fit the inputs: token ids within the declared vocabulary,
    every other dynamic dimension from the first profile's opt shape (else 16).
    """
    seq_len = _DEFAULT_SEQ_LEN
    shapes: list[tuple[str, tuple[int, ...]]] = []
    if profiles:
        first = profiles[0]
        for spec in signature.inputs:
            rng = first.for_input(spec.name)
            if rng is not None and len(rng.opt) == spec.rank and spec.rank >= 1:
                shapes.append((spec.name, tuple(rng.opt[1:])))
                if spec.name == info.token_input and spec.rank >= 2:
                    seq_len = rng.opt[1]
    if max_seq_len is not None:
        seq_len = min(seq_len, max_seq_len)
    source = GeneratorData(
        generator=Generator.RANDOM, seq_len=max(seq_len, 1), shapes=tuple(shapes)
    )
    return with_declared_vocab(
        DataSpec(source=source, samples=DEFAULT_VALIDATION_SAMPLES, seed=0, batch_size=1), info
    )


def with_tokenizer(data: DataSpec, tokenizer: Path | None) -> DataSpec:
    """The ``text`` generator and a prompts file encode with the build's tokenizer."""
    source = data.source
    if not isinstance(source, GeneratorData) or source.generator not in (
        Generator.TEXT,
        Generator.PROMPTS,
    ):
        return data
    return replace(data, source=replace(source, tokenizer=tokenizer))


def with_declared_vocab(data: DataSpec, info: ModelInfo) -> DataSpec:
    """Random ids of the token input drawn from the whole declared vocabulary."""
    source = data.source
    if (
        not isinstance(source, GeneratorData)
        or source.generator is not Generator.RANDOM
        or info.token_input is None
        or info.vocab_size is None
        or any(name == info.token_input for name, _ in source.int_highs)
    ):
        return data
    highs = (*source.int_highs, (info.token_input, info.vocab_size))
    return replace(data, source=replace(source, int_highs=highs))
