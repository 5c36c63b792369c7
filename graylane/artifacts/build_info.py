"""Build facts an artifact records in its manifest: calibration method, hardware
compatibility, shape profiles, tolerances and the validation metrics against fp32."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "CalibrationMethod",
    "ComparisonReport",
    "GroupSensitivity",
    "HardwareCompatibility",
    "InputShapeRange",
    "Metrics",
    "OutputComparison",
    "PartialQuantization",
    "ShapeProfile",
    "Tolerance",
    "WeightOnlyQuantization",
]


class CalibrationMethod(Enum):
    """How int8 activation ranges are chosen from calibration samples."""

    ENTROPY = "entropy"
    MINMAX = "minmax"
    PERCENTILE = "percentile"


class HardwareCompatibility(Enum):
    """TensorRT hardware-compatibility level for compiled engines."""

    NONE = "none"
    AMPERE_PLUS = "ampere-plus"
    SAME_COMPUTE_CAPABILITY = "same-compute-capability"


@dataclass(frozen=True)
class InputShapeRange:
    """One input's (min, opt, max) shapes within a profile."""

    input: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class ShapeProfile:
    """A TensorRT optimization profile (and the shape bucket a worker serves with it)."""

    name: str
    shapes: tuple[InputShapeRange, ...]

    def for_input(self, name: str) -> InputShapeRange | None:
        return next((s for s in self.shapes if s.input == name), None)


@dataclass(frozen=True)
class Tolerance:
    """Limits a variant must meet against the fp32 reference; ``None`` means not checked."""

    max_abs: float | None = None
    min_cosine: float | None = None
    min_top1_agreement: float | None = None
    min_token_agreement: float | None = None
    max_accuracy_drop: float | None = None
    """With labelled validation data: the most accuracy (a share, 0.01 = 1 pp) the
    variant may lose against fp32; it then replaces ``min_top1_agreement``."""


@dataclass(frozen=True)
class Metrics:
    max_abs: float
    mean_rel: float
    cosine: float
    top1_agreement: float
    rows: int
    token_agreement: float | None = None
    token_agreement_overall: float | None = None
    accuracy: float | None = None
    """Share of labelled rows the variant gets right (``None``: no labels)."""
    reference_accuracy: float | None = None
    """The same for the fp32 reference."""


@dataclass(frozen=True)
class OutputComparison:
    """Polygraphy's element-wise statistics for one output, over every iteration.

    ``passed`` is ``None`` when the tolerance sets no element-wise limit (report only).
    """

    name: str
    max_abs: float
    max_rel: float
    mean_abs: float
    passed: bool | None


@dataclass(frozen=True)
class ComparisonReport:
    """What the comparison engine (Polygraphy) reported for a baseline/candidate pair."""

    engine: str
    baseline: str
    candidate: str
    iterations: int
    outputs: tuple[OutputComparison, ...]


@dataclass(frozen=True)
class GroupSensitivity:
    """Agreement with fp32 when one group of nodes is kept in float and the rest quantized."""

    group: str
    nodes: tuple[str, ...]
    top1_agreement: float
    cosine: float


@dataclass(frozen=True)
class PartialQuantization:
    """How a quantized variant that missed its tolerance was brought within it (or not).

    ``full_failures`` are the limits the fully quantized variant missed;
    ``kept_float`` the nodes left unquantized, most sensitive first; ``speedup_vs_fp32``
    is fp32 latency over this variant's on the validation batches (one thread, CPU).
    """

    full_failures: tuple[str, ...]
    full_top1_agreement: float | None
    quantizable_nodes: int
    node_budget: int
    kept_float: tuple[str, ...]
    passed: bool
    trials: int
    sensitivity: tuple[GroupSensitivity, ...] = ()
    fp32_ms: float | None = None
    variant_ms: float | None = None
    full_ms: float | None = None
    stopped_by: str | None = None
    """Why the search ended before it was done (its time or trial budget), if it did."""
    duration_s: float | None = None

    @property
    def speedup_vs_fp32(self) -> float | None:
        if not self.fp32_ms or not self.variant_ms:
            return None
        return self.fp32_ms / self.variant_ms


@dataclass(frozen=True)
class WeightOnlyQuantization:
    """How a weight-only variant (``int8-weight-only``, ``int4``) was quantized.

    ONNX Runtime's ``MatMulNBits``: each constant ``MatMul`` weight in blocks of
    ``block_size`` along its input axis, ``bits`` per weight, one scale (and a zero point
    unless ``symmetric``) per block, rounded to nearest (``algorithm`` ``rtn``).
    ``accuracy_level`` 4 lets the kernel quantize activations to int8 per block and
    compute in int8 (fast on CPUs); 0 dequantizes weights and computes in float.
    ``algorithm`` ``smoothquant+rtn``: activations smoothed first (``smoothing_alpha``);
    ``source-grid``: weights already on 4-bit block grids written exactly;
    ``+sensitivity``: decoder layers kept in float by measurement (``sensitive_layers``);
    ``...+gptq``: the 8-bit weights rounded with GPTQ's error compensation instead of to
    nearest (its calibration is in the notes).
    ``kept_float`` are the nodes left in float (the output head always, and what the spec
    or the partial-quantization search added).
    """

    bits: int
    block_size: int
    symmetric: bool
    accuracy_level: int
    algorithm: str
    quantized_nodes: int
    kept_float: tuple[str, ...] = ()
    smoothing_alpha: float | None = None
    """SmoothQuant's exponent where activations were smoothed first (``None``: not)."""
    smoothed_activations: int = 0
    calibration_prompts: int = 0
    """Prompts the activation maxima of the smoothing were taken on."""
    sensitive_layers: tuple[str, ...] = ()
    """Decoder layers kept in float because, quantized alone, they moved fp32's next-token
    distributions most on calibration text (most sensitive first; their nodes are in
    ``kept_float``)."""
    sensitivity_prompts: int = 0
    """Calibration prompts that measurement ran on."""

    def to_dict(self) -> dict[str, object]:
        return {
            "bits": self.bits,
            "block_size": self.block_size,
            "symmetric": self.symmetric,
            "accuracy_level": self.accuracy_level,
            "algorithm": self.algorithm,
            "quantized_nodes": self.quantized_nodes,
            "kept_float": list(self.kept_float),
            "smoothing_alpha": self.smoothing_alpha,
            "smoothed_activations": self.smoothed_activations,
            "calibration_prompts": self.calibration_prompts,
            "sensitive_layers": list(self.sensitive_layers),
            "sensitivity_prompts": self.sensitivity_prompts,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, object] | None) -> WeightOnlyQuantization | None:
        if raw is None:
            return None
        kept = raw.get("kept_float", ())
        sensitive = raw.get("sensitive_layers", ())
        return cls(
            bits=int(str(raw["bits"])),
            block_size=int(str(raw["block_size"])),
            symmetric=bool(raw["symmetric"]),
            accuracy_level=int(str(raw["accuracy_level"])),
            algorithm=str(raw["algorithm"]),
            quantized_nodes=int(str(raw["quantized_nodes"])),
            kept_float=tuple(str(n) for n in kept) if isinstance(kept, list | tuple) else (),
            smoothing_alpha=None
            if raw.get("smoothing_alpha") is None
            else float(str(raw["smoothing_alpha"])),
            smoothed_activations=int(str(raw.get("smoothed_activations", 0))),
            calibration_prompts=int(str(raw.get("calibration_prompts", 0))),
            sensitive_layers=tuple(str(n) for n in sensitive)
            if isinstance(sensitive, list | tuple)
            else (),
            sensitivity_prompts=int(str(raw.get("sensitivity_prompts", 0))),
        )
