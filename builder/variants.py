"""Typed ONNX precision variants: fp32, fp16, int8 (Q/DQ S8S8) and int8-dynamic.

Every variant is checked to load in ONNX Runtime on the CPU before it is reported
as produced. Anything that goes wrong becomes a :class:`VariantOutcome` with a
status and a reason; nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graylane.artifacts.build_info import CalibrationMethod, WeightOnlyQuantization
from graylane.artifacts.model_info import SourceQuantization, source_quantization
from graylane.artifacts.naming import Precision
from graylane.builder.calibration import ORT_METHODS, CalibrationError, CalibrationRecord, calibrate
from graylane.builder.gptq import GptqRounding, Int8Blocks, write_int8_blocks
from graylane.builder.layer_sensitivity import FloatLayerChoice
from graylane.builder.runtime import VariantLoadError, open_runner
from graylane.builder.samples import SampleSet
from graylane.builder.smoothing import SmoothingRecord
from graylane.builder.source_grid import encode_on_source_grid
from graylane.builder.spec import (
    DEFAULT_QUANTIZE_OPS,
    RoundingSpec,
    SensitiveLayersSpec,
    SmoothingSpec,
    WeightOnlySpec,
)
from graylane.errors import GraylaneError

__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "MODEL_FILE",
    "VariantInputs",
    "VariantOutcome",
    "VariantStatus",
    "layer_quantizer",
    "produce_variant",
]

MODEL_FILE = "model.onnx"
EXTERNAL_DATA_FILE = "model.onnx.data"
EXTERNAL_DATA_THRESHOLD = 1_500_000_000
"""Source size from which weights go to a side file (protobuf caps one file at 2 GiB)."""
_FP16_MAX_RETRIES = 8
_FLOAT = onnx.TensorProto.FLOAT
_FLOAT16 = onnx.TensorProto.FLOAT16
_MISSING_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(")


class VariantStatus(Enum):
    PRODUCED = "produced"
    FAILED = "failed"
    UNSUPPORTED = "unsupported"
    SKIPPED = "skipped"
    """Makes no sense for this source (e.g. fp16 of an already-quantized model)."""


@dataclass(frozen=True)
class VariantOutcome:
    """What happened to one requested precision."""

    precision: Precision
    status: VariantStatus
    path: Path | None = None
    reason: str | None = None
    duration_s: float = 0.0
    calibration: CalibrationRecord | None = None
    notes: tuple[str, ...] = ()
    weight_only: WeightOnlyQuantization | None = None
    """How a weight-only variant's weights were quantized (recorded in its manifest)."""

    @property
    def files(self) -> tuple[Path, ...]:
        """The model file and its external-data side file, if any."""
        if self.path is None:
            return ()
        side = self.path.with_name(EXTERNAL_DATA_FILE)
        return (self.path, side) if side.exists() else (self.path,)


@dataclass(frozen=True)
class VariantInputs:
    """What every variant is made from."""

    source: Path
    source_sha256: str
    work_dir: Path
    cache_dir: Path
    calibration: SampleSet | None = None
    method: CalibrationMethod = CalibrationMethod.ENTROPY
    percentile: float = 99.999
    external_data: bool = False
    op_types_to_quantize: tuple[str, ...] | None = DEFAULT_QUANTIZE_OPS
    nodes_to_exclude: tuple[str, ...] = ()
    """Nodes the int8 variants keep in float (partial quantization)."""
    weight_only: WeightOnlySpec = field(default_factory=WeightOnlySpec)
    """How ``int8-weight-only`` and ``int4`` quantize (blocks, symmetry, compute)."""


def produce_variant(
    precision: Precision, inputs: VariantInputs, *, copy_source: bool = False
) -> VariantOutcome:
    """Write ``<work_dir>/<precision>/model.onnx`` and check ONNX Runtime loads it.

    ``copy_source``: the source graph as-is, labelled ``precision`` (it already is).
    """
    start = time.perf_counter()
    out_dir = inputs.work_dir / precision.value
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / MODEL_FILE
    producer = _as_is if copy_source else _PRODUCERS.get(precision, _as_is)
    weight_only: WeightOnlyQuantization | None = None
    try:
        if precision.weight_only and not copy_source:
            weight_only, notes = _weight_only(precision, inputs, out)
            calibration = None
        else:
            calibration, notes = producer(inputs, out)
    except _Unsupported as exc:
        return VariantOutcome(
            precision=precision,
            status=VariantStatus.UNSUPPORTED,
            reason=str(exc),
            duration_s=time.perf_counter() - start,
        )
    except Exception as exc:  # quantizers and converters raise untyped errors
        return VariantOutcome(
            precision=precision,
            status=VariantStatus.FAILED,
            reason=f"{type(exc).__name__}: {exc}",
            duration_s=time.perf_counter() - start,
        )
    if precision in _QUANTIZED and not copy_source and not _quantized(out):
        return VariantOutcome(
            precision=precision,
            status=VariantStatus.FAILED,
            reason="the quantizer left every node in float (no int8 weight or op in the "
            "graph or its subgraphs); it would be fp32 labelled "
            f"{precision.value}",
            duration_s=time.perf_counter() - start,
            calibration=calibration,
            notes=notes,
        )
    try:
        open_runner(out, threads=1)
    except VariantLoadError as exc:
        return VariantOutcome(
            precision=precision,
            status=VariantStatus.FAILED,
            reason=f"produced, but cannot run here: {exc}",
            duration_s=time.perf_counter() - start,
            calibration=calibration,
            notes=notes,
        )
    return VariantOutcome(
        precision=precision,
        status=VariantStatus.PRODUCED,
        path=out,
        duration_s=time.perf_counter() - start,
        calibration=calibration,
        notes=notes,
        weight_only=weight_only,
    )


_QUANTIZED = (
    Precision.INT8,
    Precision.INT8_DYNAMIC,
    Precision.INT8_WEIGHT_ONLY,
    Precision.INT4,
)


def _quantized(path: Path) -> bool:
    """Whether a produced int8 graph holds any int8 weight or quantized op."""
    model = onnx.load(str(path), load_external_data=False)
    return source_quantization(model) is not SourceQuantization.NONE


class _Unsupported(GraylaneError):
    """This precision cannot be produced with what this build has."""


_Result = tuple[CalibrationRecord | None, tuple[str, ...]]


def _save(model: onnx.ModelProto, out: Path, external: bool) -> None:
    if external:
        onnx.save_model(
            model,
            str(out),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=EXTERNAL_DATA_FILE,
        )
    else:
        onnx.save_model(model, str(out))


def _fp32(inputs: VariantInputs, out: Path) -> _Result:
    if inputs.external_data:
        onnx.shape_inference.infer_shapes_path(str(inputs.source), str(out))
        _save(onnx.load(str(out)), out, external=True)
    else:
        model = onnx.shape_inference.infer_shapes(onnx.load(str(inputs.source)))
        _save(model, out, external=False)
    return None, ("shape-inferred source graph",)


def _as_is(inputs: VariantInputs, out: Path) -> _Result:
    _fp32(inputs, out)
    return None, ("source graph as-is: it is already quantized",)


def _fix_cast_targets(graph: onnx.GraphProto) -> int:
    """Point each Cast at the type its output was given; returns how many were fixed.

    The converter retypes a Cast's output (e.g. int64 → float becomes float16) but
    leaves its ``to`` attribute at float, which ONNX Runtime rejects. Blocking
    ``Cast`` instead is a trap: the converter then wraps its own inserted Casts
    forever (onnxconverter-common 1.16).
    """
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in (*graph.value_info, *graph.output, *graph.input)
    }
    fixed = 0
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                fixed += _fix_cast_targets(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                fixed += sum(_fix_cast_targets(g) for g in attr.graphs)
        if node.op_type != "Cast":
            continue
        declared = types.get(node.output[0])
        for attr in node.attribute:
            if attr.name == "to" and declared == _FLOAT16 and attr.i == _FLOAT:
                attr.i = _FLOAT16
                fixed += 1
    return fixed


def _fp16(inputs: VariantInputs, out: Path) -> _Result:
    try:
        from onnxconverter_common import float16
    except ImportError:
        raise _Unsupported("onnxconverter-common is not installed") from None
    blocked: list[str] = []
    for _ in range(_FP16_MAX_RETRIES):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one "value truncated" warning per clipped weight
            converted = float16.convert_float_to_float16(
                onnx.load(str(inputs.source)),  # the converter edits its argument in place
                keep_io_types=True,
                op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, *blocked],
            )
        fixed = _fix_cast_targets(converted.graph)
        _save(converted, out, inputs.external_data)
        try:
            open_runner(out, threads=1)
        except VariantLoadError as exc:
            # Ops without a float16 CPU kernel stay in fp32, then we try again.
            missing = _MISSING_KERNEL.search(str(exc))
            if missing is None or missing.group(1) in blocked or missing.group(1) == "Cast":
                raise
            blocked.append(missing.group(1))
            continue
        notes = [f"kept in fp32: {', '.join(blocked)}"] if blocked else ["all float ops in fp16"]
        if fixed:
            notes.append(f"retargeted {fixed} Cast node(s) to float16")
        return None, tuple(notes)
    raise RuntimeError(f"fp16: gave up after keeping {blocked} in fp32")


def _int8(inputs: VariantInputs, out: Path) -> _Result:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    if inputs.calibration is None:
        raise _Unsupported("int8 needs calibration samples; add a 'calibration' section")
    try:
        record = calibrate(
            inputs.source,
            inputs.source_sha256,
            inputs.calibration,
            inputs.method,
            inputs.percentile,
            inputs.cache_dir,
            use_external_data_format=inputs.external_data,
            op_types=inputs.op_types_to_quantize,
        )
    except CalibrationError as exc:
        raise RuntimeError(str(exc)) from None
    with _quiet_quantizer():
        quantize_static(
            str(inputs.source),
            str(out),
            calibration_data_reader=None,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(inputs.op_types_to_quantize)
            if inputs.op_types_to_quantize
            else None,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            use_external_data_format=inputs.external_data,
            calibrate_method=ORT_METHODS[inputs.method],
            calibration_cache_path=str(record.cache_path),
            nodes_to_exclude=list(inputs.nodes_to_exclude),
            # Zero-point 0 everywhere: the form TensorRT's strongly typed INT8 accepts.
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
    notes = [f"QDQ S8S8 symmetric, {inputs.method.value} calibration"]
    return record, (*notes, *_kept_float(inputs))


def _int8_dynamic(inputs: VariantInputs, out: Path) -> _Result:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_quantizer():
        quantize_dynamic(
            str(inputs.source),
            str(out),
            weight_type=QuantType.QInt8,
            per_channel=True,
            use_external_data_format=inputs.external_data,
            nodes_to_exclude=list(inputs.nodes_to_exclude),
        )
    # per-channel weight scales: faster and closer to fp32 than one scale per tensor
    # (demo GPT small, seq 64, one thread: b1 2.53x vs 2.37x fp32, max |dlogit| 0.080 vs 0.084)
    notes = ("dynamic quantization, QInt8 per-channel weights (ONNX Runtime CPU)",)
    return None, (*notes, *_kept_float(inputs))


HEAD_MARKERS = ("lm_head",)
"""A ``MatMul`` whose name holds one of these is the output head: weight-only rungs keep it
in float (with the embeddings, which are a ``Gather``, never quantized here)."""


def _weight_only(
    precision: Precision, inputs: VariantInputs, out: Path
) -> tuple[WeightOnlyQuantization, tuple[str, ...]]:
    """``MatMulNBits``: 8- or 4-bit blockwise weights (round to nearest), head in float.

    ``accuracy_level`` 4 computes in int8 with activations quantized per block: measured
    on SmolLM2-135M, 1.9-2.2x fp32's decode speed at batch 1 on this CPU; 0 (float
    compute) dequantizes every weight on each call and ran 5x slower than fp32.
    """
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as exc:  # onnx-ir missing, or an older ONNX Runtime
        raise _Unsupported(f"ONNX Runtime's MatMulNBits quantizer is unavailable: {exc}") from None
    options = inputs.weight_only
    bits = 8 if precision is Precision.INT8_WEIGHT_ONLY else 4
    symmetric = options.int8_symmetric if bits == 8 else options.int4_symmetric
    block = options.block_size if bits == 8 else options.int4_block_size
    model = onnx.load(str(inputs.source))
    matmuls = [
        n.name for n in model.graph.node if n.op_type == "MatMul" and _constant_weight(model, n)
    ]
    heads = [n for n in matmuls if any(m in n for m in HEAD_MARKERS)]
    prefixes = (*options.keep_float, *(options.int8_keep_float if bits == 8 else ()))
    keep = [
        n
        for n in matmuls
        if n in inputs.nodes_to_exclude
        or n in heads
        or any(n.startswith(prefix) for prefix in prefixes)
    ]
    level = options.accuracy_level
    if bits == 4 and options.int4_accuracy_level is not None:
        level = options.int4_accuracy_level
    sources: dict[str, np.ndarray] = {}
    if bits == 4 and options.int4_source_grid:
        sources = _source_weights(model, set(matmuls) - set(keep))
    smoothed: SmoothingRecord | None = None
    if bits == 8 and options.int8_smoothing is not None and options.accuracy_level == 4:
        smoothed = _smooth(model, options.int8_smoothing, inputs.source, keep)

    def quantizer_for(candidate: onnx.ModelProto, exclude: Sequence[str]) -> Any:
        return MatMulNBitsQuantizer(
            candidate,
            bits=bits,
            block_size=block,
            is_symmetric=symmetric,
            accuracy_level=level,
            nodes_to_exclude=list(exclude),
        )

    rounded: GptqRounding | None = None
    if bits == 8 and symmetric and options.int8_rounding is not None:
        # before the float layers are chosen, so that they are measured as the rung rounds
        # them (X^T X is fp32's, whichever layers stay in float: the codes do not change)
        rounded = _gptq(model, options.int8_rounding, inputs.source, matmuls, keep, block)
    sensitive: FloatLayerChoice | None = None
    if bits == 8 and options.int8_sensitive_layers is not None and level == 4:
        sensitive = _sensitive_layers(
            model,
            options.int8_sensitive_layers,
            inputs.source,
            matmuls,
            keep,
            quantizer_for,
            encoded=None if rounded is None else rounded.encoded,
        )
        keep = [*keep, *(n for n in sensitive.nodes if n not in keep)]
        if rounded is not None:
            rounded = rounded.without(_outputs_of(model, keep))
    with _quiet_quantizer():
        quantizer = quantizer_for(model, keep)
        quantizer.process()
        on_grid = encode_on_source_grid(quantizer.model.model, sources) if sources else []
        if rounded is not None:
            write_int8_blocks(quantizer.model.model, rounded.encoded)
        quantizer.model.save_model_to_file(str(out), use_external_data_format=inputs.external_data)
    record = WeightOnlyQuantization(
        bits=bits,
        block_size=block,
        symmetric=symmetric,
        accuracy_level=level,
        algorithm=_algorithm(
            on_grid=bool(on_grid), smoothed=smoothed, sensitive=sensitive, gptq=bool(rounded)
        ),
        quantized_nodes=len(matmuls) - len(keep),
        kept_float=tuple(keep),
        smoothing_alpha=None if smoothed is None else smoothed.alpha,
        smoothed_activations=0 if smoothed is None else smoothed.groups,
        calibration_prompts=0 if smoothed is None else smoothed.calibration_prompts,
        sensitive_layers=() if sensitive is None else sensitive.layers,
        sensitivity_prompts=0 if sensitive is None else sensitive.calibration_prompts,
    )
    kept = f"; kept in float: {_summarize(keep)}" if keep else ""
    note = (
        f"weight-only {bits}-bit MatMulNBits, block {block}, "
        f"{'symmetric' if symmetric else 'asymmetric'}, {'GPTQ' if rounded else 'RTN'}, "
        "accuracy_level "
        f"{level}; {record.quantized_nodes} of {len(matmuls)} MatMuls{kept}"
    )
    notes: tuple[str, ...] = (note,) if smoothed is None else (note, smoothed.describe())
    if sensitive is not None:
        notes = (*notes, sensitive.describe())
    if rounded is not None:
        notes = (*notes, rounded.describe())
    if on_grid:
        notes = (
            *notes,
            f"{len(on_grid)} of {record.quantized_nodes} weights were on 4-bit block grids "
            "(a 4-bit source): written on those grids exactly, the integer zero point's "
            "remainder as a float block-sum correction",
        )
    return record, notes


def _smooth(
    model: onnx.ModelProto, spec: SmoothingSpec, source: Path, keep: list[str]
) -> SmoothingRecord:
    """Fold SmoothQuant scales into ``model`` (in place) from activation maxima on the
    spec's calibration prompts, tokenized with the source's ``tokenizer.json``."""
    from graylane.builder.smoothing import (
        DEFAULT_FOLDS,
        activation_maxima,
        apply_smoothing,
        smoothing_groups,
    )
    from graylane.builder.spec import read_prompts
    from graylane.models.hf_tokenizer import HfTokenizer

    tokenizer_path = source.with_name("tokenizer.json")
    if not tokenizer_path.is_file():
        raise _Unsupported(f"smoothing needs the source's tokenizer: no {tokenizer_path}")
    tokenizer = HfTokenizer(tokenizer_path)
    prompts = [tokenizer.encode(text) for text in read_prompts(spec.prompts)]
    groups = smoothing_groups(model, exclude=keep, folds=DEFAULT_FOLDS)
    maxima = activation_maxima(model, [g.activation for g in groups], prompts)
    folded = apply_smoothing(model, groups, maxima, spec.alpha)
    return SmoothingRecord(
        alpha=spec.alpha, groups=len(groups), calibration_prompts=len(prompts), folded=folded
    )


def _algorithm(
    *,
    on_grid: bool,
    smoothed: SmoothingRecord | None,
    sensitive: FloatLayerChoice | None,
    gptq: bool = False,
) -> str:
    """``source-grid``, or ``rtn`` (``gptq``: error-compensating rounding) with what came
    before it: ``smoothquant+rtn``, ``smoothquant+sensitivity+rtn`` (float layers
    measured), ``smoothquant+sensitivity+gptq``, ``sensitivity+rtn``."""
    if on_grid:
        return "source-grid"
    steps = [
        *(["smoothquant"] if smoothed is not None else []),
        *(["sensitivity"] if sensitive is not None else []),
    ]
    return "+".join([*steps, "gptq" if gptq else "rtn"])


def _gptq(
    model: onnx.ModelProto,
    spec: RoundingSpec,
    source: Path,
    matmuls: Sequence[str],
    keep: Sequence[str],
    block: int,
) -> GptqRounding:
    """GPTQ codes for each quantized ``MatMul`` of ``model`` (smoothed already, where the
    rung smooths), from ``X^T X`` of its input on the spec's calibration prompts continued
    by fp32's greedy tokens."""
    from graylane.builder.gptq import gptq_blocks, input_hessians
    from graylane.builder.spec import read_prompts
    from graylane.builder.validation import greedy_continue
    from graylane.models.hf_tokenizer import HfTokenizer

    tokenizer_path = source.with_name("tokenizer.json")
    if not tokenizer_path.is_file():
        raise _Unsupported(f"GPTQ needs the source's tokenizer: no {tokenizer_path}")
    tokenizer = HfTokenizer(tokenizer_path)
    prompts = [np.asarray(tokenizer.encode(t), np.int64) for t in read_prompts(spec.prompts)]
    if spec.continuation:
        runner = open_runner(source, threads=None)
        tails = greedy_continue(runner, runner.engine.io, prompts, spec.continuation)
        del runner
        prompts = [np.concatenate([p, t]) for p, t in zip(prompts, tails, strict=True)]
    kept = set(keep)
    inits = {i.name: i for i in model.graph.initializer}
    nodes = [
        n
        for n in model.graph.node
        if n.name in set(matmuls) - kept and int(inits[n.input[1]].dims[0]) % block == 0
    ]
    hessians, tokens = input_hessians(
        model, sorted({n.input[0] for n in nodes}), [p.tolist() for p in prompts]
    )
    encoded = {
        n.output[0]: gptq_blocks(
            numpy_helper.to_array(inits[n.input[1]]),
            hessians[n.input[0]],
            block,
            act_order=spec.act_order,
        )
        for n in nodes
    }
    return GptqRounding(
        encoded=encoded,
        calibration_prompts=len(prompts),
        tokens=tokens,
        activations=len(hessians),
    )


def _sensitive_layers(
    model: onnx.ModelProto,
    spec: SensitiveLayersSpec,
    source: Path,
    matmuls: Sequence[str],
    keep: Sequence[str],
    quantizer_for: Callable[[onnx.ModelProto, Sequence[str]], Any],
    *,
    encoded: Mapping[str, Int8Blocks] | None = None,
) -> FloatLayerChoice:
    """Measure each decoder layer of ``model`` (smoothed already, where the rung smooths)
    quantized alone on the spec's calibration prompts; the ``count`` most sensitive stay
    in float. ``encoded``: the rung's GPTQ codes, written into each measured layer as the
    rung writes them (else it is measured rounded to nearest)."""
    from graylane.builder.layer_sensitivity import measure_layers
    from graylane.builder.spec import read_prompts
    from graylane.models.hf_tokenizer import HfTokenizer

    tokenizer_path = source.with_name("tokenizer.json")
    if not tokenizer_path.is_file():
        raise _Unsupported(f"measuring layers needs the source's tokenizer: no {tokenizer_path}")
    tokenizer = HfTokenizer(tokenizer_path)
    prompts = [tokenizer.encode(text) for text in read_prompts(spec.prompts)]
    quantizable = [n for n in matmuls if n not in set(keep)]
    quantize = layer_quantizer(keep, quantizer_for, encoded)
    return measure_layers(model, quantizable, prompts, quantize, spec.count)


def layer_quantizer(
    keep: Sequence[str],
    quantizer_for: Callable[[onnx.ModelProto, Sequence[str]], Any],
    encoded: Mapping[str, Int8Blocks] | None = None,
) -> Callable[[onnx.ModelProto, Sequence[str], Path], None]:
    """The sensitivity measurement's quantizer: a copy of the model quantized by the rung's
    own ``quantizer_for`` with ``keep`` and the excluded nodes in float, and the rung's GPTQ
    codes (``encoded``, by ``MatMul`` output) written over its rounding where given."""
    kept = set(keep)

    def quantize(candidate: onnx.ModelProto, exclude: Sequence[str], path: Path) -> None:
        copy = onnx.ModelProto()
        copy.CopyFrom(candidate)
        with _quiet_quantizer():
            quantizer = quantizer_for(copy, [*keep, *(n for n in exclude if n not in kept)])
            quantizer.process()
            if encoded:
                write_int8_blocks(quantizer.model.model, encoded)
            quantizer.model.save_model_to_file(str(path), use_external_data_format=True)

    return quantize


def _outputs_of(model: onnx.ModelProto, names: Sequence[str]) -> set[str]:
    wanted = set(names)
    return {n.output[0] for n in model.graph.node if n.name in wanted and n.output}


def _source_weights(model: onnx.ModelProto, nodes: set[str]) -> dict[str, np.ndarray]:
    """The ``[in, out]`` weight of each named ``MatMul``, by its output tensor."""
    inits = {i.name: i for i in model.graph.initializer}
    return {
        n.output[0]: numpy_helper.to_array(inits[n.input[1]])
        for n in model.graph.node
        if n.op_type == "MatMul" and n.name in nodes
    }


def _constant_weight(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    names = {i.name for i in model.graph.initializer}
    return len(node.input) > 1 and node.input[1] in names


def _summarize(names: list[str]) -> str:
    return (
        ", ".join(names) if len(names) <= 6 else f"{', '.join(names[:6])} and {len(names) - 6} more"
    )


def _kept_float(inputs: VariantInputs) -> tuple[str, ...]:
    if not inputs.nodes_to_exclude:
        return ()
    return (f"kept in float (partial quantization): {', '.join(inputs.nodes_to_exclude)}",)


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """Silence the quantizer's pre-processing advice, printed through the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


_PRODUCERS: dict[Precision, Callable[[VariantInputs, Path], _Result]] = {
    Precision.FP32: _fp32,
    Precision.FP16: _fp16,
    Precision.INT8: _int8,
    Precision.INT8_DYNAMIC: _int8_dynamic,
}
"""The calibrated and float producers; the weight-only ones are :func:`_weight_only`."""
