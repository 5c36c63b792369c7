"""Build specs: what to build from which ONNX file, or which engine servers serve a
version, read from YAML or TOML.

An ONNX spec (:class:`BuildSpec`) names the source model, its semantic version, the
precision variants to produce, the input shape profiles, the calibration and
validation data, the tolerances each variant must meet against the fp32 reference,
and where the artifacts go. An engine spec (:class:`EngineSpec`, an ``engine:``
section instead of ``source``) names a version served by OpenAI-compatible engine
servers: the engine and its version, and one endpoint per precision variant, best
first (the QoS ladder's order). :func:`load_spec` reads a file; :func:`parse_spec`
turns an already decoded mapping into either spec and is free of I/O. Paths in a spec
are relative to the spec file's folder. Every problem is a :class:`SpecError` naming
the key to fix.
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from graylane.artifacts.build_info import (
    CalibrationMethod,
    HardwareCompatibility,
    InputShapeRange,
    ShapeProfile,
    Tolerance,
)
from graylane.artifacts.model_info import ModelTask
from graylane.artifacts.naming import (
    ONNX_PRECISIONS,
    ArtifactName,
    Backend,
    NamingError,
    Precision,
    SemVer,
    parse_semver,
    validate_model_name,
)
from graylane.artifacts.naming import validate_strategy as _validate_strategy
from graylane.engine.server import DEFAULT_SLOTS, EndpointError, parse_endpoint_url
from graylane.errors import GraylaneError

__all__ = [
    "DEFAULT_MIN_CALIBRATION_SAMPLES",
    "DEFAULT_PRECISIONS",
    "DEFAULT_QUANTIZE_OPS",
    "ENGINE_PRECISIONS",
    "ENGINE_STRATEGIES",
    "INT8_MIN_TOP1",
    "BuildSpec",
    "DataSpec",
    "DemoSource",
    "EndpointVariantSpec",
    "EngineServerSpec",
    "EngineSpec",
    "FileSource",
    "GenerationCheck",
    "Generator",
    "GeneratorData",
    "GgufSource",
    "NpzData",
    "PartialQuantizationSpec",
    "RoundingSpec",
    "RungEvaluationSpec",
    "SensitiveLayersSpec",
    "SmoothingSpec",
    "SpecError",
    "TensorRTOptions",
    "TokenizerSpec",
    "WeightOnlySpec",
    "default_tolerances",
    "load_spec",
    "parse_spec",
    "read_prompts",
]

# llama.cpp's own types, by their own names: f16, q8_0, q6_k, ..., q2_k.
_GGUF_TYPES = frozenset(p for p in Precision if p is Precision.F16 or p.value.startswith("q"))
_CHECKPOINT_PRECISIONS = frozenset(
    {Precision.FP32, Precision.FP16, Precision.BF16, Precision.FP8, Precision.INT8, Precision.INT4}
)
ENGINE_PRECISIONS: Mapping[Backend, frozenset[Precision]] = {
    Backend.LLAMACPP: _GGUF_TYPES | {Precision.FP32, Precision.BF16},
    Backend.VLLM: _CHECKPOINT_PRECISIONS | _GGUF_TYPES,  # vLLM loads GGUF files too
    Backend.TRTLLM: _CHECKPOINT_PRECISIONS,
    Backend.SGLANG: _CHECKPOINT_PRECISIONS,
}
"""What each engine server loads: a variant of another precision is a typo (``fp16`` for
llama.cpp's ``f16``) or an engine that cannot serve it (a GGUF type on TensorRT-LLM)."""

ENGINE_STRATEGIES: Mapping[Backend, str] = {Backend.LLAMACPP: "gguf"}
"""The strategy tag of an engine's artifacts when the spec states none (else ``default``)."""


# ---------------------------------------------------------------- the spec


class Generator(Enum):
    """Named sample generators usable instead of an .npz file."""

    DEMO_TEXT = "demo-text"
    """Token batches of English sentences encoded with the demo GPT tokenizer."""
    RANDOM = "random"
    """Random tensors that fit the model's inputs: normal floats, integers in [0, int_high)."""
    TEXT = "text"
    """Token batches of the same English sentences encoded with the spec's ``tokenizer``."""
    PROMPTS = "prompts"
    """One sample per line of a text file of prompts (``prompts: FILE``), encoded with the
    model's tokenizer: validation on real text."""


@dataclass(frozen=True)
class FileSource:
    """The source ONNX model is a file."""

    path: Path


@dataclass(frozen=True)
class GgufSource:
    """The source is a GGUF file (llama.cpp's format): imported into an ONNX decoder with
    its tokenizer and chat template (:mod:`graylane.models.gguf_import`), once per file."""

    path: Path


@dataclass(frozen=True)
class DemoSource:
    """The source ONNX model is the demo GPT, generated deterministically at build time."""

    size: str
    seed: int = 0
    kv_cache: bool = False
    """Export the decoder-with-past form (``past_key_values.*`` in, ``present.*`` out)."""


@dataclass(frozen=True)
class TokenizerSpec:
    """The model's ``tokenizer.json``, copied into every artifact of the build."""

    path: Path
    eos_token_id: int | None = None
    """``None``: the one the transformers configs beside the file declare, if any."""


@dataclass(frozen=True)
class NpzData:
    """Samples from an .npz file: one array per model input, samples along axis 0."""

    path: Path


@dataclass(frozen=True)
class GeneratorData:
    """Samples produced by a named generator."""

    generator: Generator
    seq_len: int = 32
    int_high: int = 2
    int_highs: tuple[tuple[str, int], ...] = ()
    """Per-input bound for integers (e.g. the token input's vocabulary); else ``int_high``."""
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Per-input shape after the sample axis (e.g. a profile's opt); else ``seq_len`` fills."""
    tokenizer: Path | None = None
    """The ``tokenizer.json`` that encodes the ``text`` generator's sentences."""
    prompts: Path | None = None
    """The ``prompts`` generator's file: one prompt per line (``#`` lines are comments)."""
    continuation: int = 0
    """Validation on prompts: each continued by this many of fp32's greedy tokens, and the
    variants judged on the positions that predict them (fp32's tokens forced)."""


@dataclass(frozen=True)
class GenerationCheck:
    """Greedy-generation agreement check for decoder models."""

    prompts: int = 8
    new_tokens: int = 16


@dataclass(frozen=True)
class DataSpec:
    """Where samples come from, how many, and in which batch size they are fed."""

    source: NpzData | GeneratorData
    samples: int
    seed: int = 0
    batch_size: int = 1


@dataclass(frozen=True)
class TensorRTOptions:
    """Options for compiled TensorRT engines (ignored where TensorRT is absent)."""

    enabled: bool = True
    workspace_bytes: int = 1 << 30
    hardware_compatibility: HardwareCompatibility = HardwareCompatibility.NONE


DEFAULT_QUANTIZE_OPS: tuple[str, ...] = ("MatMul", "Gemm")
"""Ops whose inputs get Q/DQ in the int8 variant: the GEMMs, where int8 pays off.

Quantizing every op (adds, softmax, normalization, gathers) was measured on the demo
GPT to cost accuracy (top-1 agreement 0.94 vs 0.97) and speed on CPU; it also
matches TensorRT's advice to place Q/DQ at GEMM inputs only.
"""


DEFAULT_PRECISIONS: tuple[Precision, ...] = (
    Precision.FP32,
    Precision.FP16,
    Precision.INT8,
    Precision.INT8_DYNAMIC,
)
"""What a spec without ``precisions`` builds. The weight-only rungs (``int8-weight-only``,
``int4``) are for decoders and are built when listed."""


INT8_MIN_TOP1 = 0.99
"""Default int8 limit: ≤ 1 % top-1 disagreement with fp32 on held-out data."""

INT8_MAX_ACCURACY_DROP = 0.01
"""Default int8 limit when the validation set carries labels: ≤ 1 pp accuracy lost vs fp32
(it then replaces the top-1 agreement limit)."""

DEFAULT_MIN_CALIBRATION_SAMPLES = 500
"""Calibration sets smaller than this are refused unless the spec lowers it or --force."""


@dataclass(frozen=True)
class PartialQuantizationSpec:
    """Sensitivity-guided partial quantization of quantized variants that miss their tolerance."""

    enabled: bool = True
    node_budget: int = 8
    """At most this many quantizable nodes are kept in float."""
    max_groups: int = 32
    """Probe nodes one by one up to this many; beyond, probe whole layers."""
    time_budget_s: float = 600.0
    """Wall-clock time the search may take per variant: no trial starts that the estimate
    (the mean trial so far) says would end past it."""
    max_trials: int = 40
    """Trials (one quantizer pass and one validation each) per variant, at most."""


@dataclass(frozen=True)
class WeightOnlySpec:
    """How the weight-only rungs (``int8-weight-only``, ``int4``) quantize a decoder.

    Measured on SmolLM2-135M (ONNX Runtime 1.32, this 2-core CPU, batch 1, 40 English
    prompts): 8-bit, block 32, symmetric, ``accuracy_level`` 4 decodes ~2x fp32 with top-1
    agreement 0.969; smoothing its normed activations and keeping five layers in float
    gives 0.984-0.991 at ~1.8x; the eight layers measured most sensitive instead
    (``int8_sensitive_layers``) 0.993 on the validation prompts, 0.985-0.990 on held-out
    ones, at 1.6-1.8x. ``accuracy_level`` 0 reaches 0.990 but runs 5x slower
    than fp32 (ONNX Runtime has no fast float kernel for 8-bit weights). The GGUF's Q4_1
    projections on their own grid (``int4_source_grid``, float compute) agree 1.000 at
    ~1.4-1.6x; rounded to nearest, 0.76.
    """

    block_size: int = 32
    int8_symmetric: bool = True
    int4_block_size: int = 32
    int4_symmetric: bool = False
    accuracy_level: int = 4
    """4: int8 compute (activations quantized per block); 0: dequantize and compute in float."""
    keep_float: tuple[str, ...] = ()
    """Name prefixes of nodes kept in float besides the output head (``layers.0.``)."""
    int8_keep_float: tuple[str, ...] = ()
    """Further prefixes kept in float by the 8-bit rung only (its most sensitive layers)."""
    int8_smoothing: SmoothingSpec | None = None
    """Activation smoothing of the 8-bit rung (:mod:`graylane.builder.smoothing`)."""
    int8_sensitive_layers: SensitiveLayersSpec | None = None
    """Further decoder layers kept in float by the 8-bit rung, chosen by measuring each
    one's damage on calibration text (:mod:`graylane.builder.layer_sensitivity`)."""
    int8_rounding: RoundingSpec | None = None
    """How the 8-bit rung rounds its weights: ``None`` rounds to nearest (ONNX Runtime's
    quantizer); GPTQ compensates each rounding error on calibration activations
    (:mod:`graylane.builder.gptq`)."""
    int4_source_grid: bool = False
    """Weights already on 4-bit block grids (a Q4_1 GGUF's import) kept exactly
    (:mod:`graylane.builder.source_grid`); others are rounded to nearest."""
    int4_accuracy_level: int | None = None
    """The 4-bit rung's compute, where it differs from ``accuracy_level``."""


@dataclass(frozen=True)
class SmoothingSpec:
    """SmoothQuant before the 8-bit rung quantizes: the exponent and the calibration text."""

    alpha: float
    prompts: Path
    """One prompt per line (``#`` lines are comments), tokenized with the source's
    ``tokenizer.json``; kept apart from the validation prompts."""


@dataclass(frozen=True)
class SensitiveLayersSpec:
    """How many decoder layers the 8-bit rung keeps in float by measured sensitivity, and
    the calibration text it is measured on."""

    count: int
    prompts: Path
    """One prompt per line, tokenized with the source's ``tokenizer.json``; kept apart from
    the validation prompts."""


@dataclass(frozen=True)
class RoundingSpec:
    """The 8-bit rung's error-compensating rounding (GPTQ) and its calibration text."""

    method: str
    """``gptq`` (``rtn``, round to nearest, is the default and needs no section)."""
    prompts: Path
    """One prompt per line, tokenized with the source's ``tokenizer.json``; kept apart from
    the validation prompts."""
    continuation: int = 0
    """fp32's greedy tokens appended to each prompt before its activations are taken: more
    positions for ``X^T X`` than a file of short prompts holds."""
    act_order: bool = False
    """Round the input channels with the largest ``X^T X`` diagonal first (block scales
    then fixed beforehand)."""


def default_tolerances() -> dict[Precision, Tolerance]:
    """Default limits per precision, set from what the demo GPT achieves, with margin.

    Measured on demo-gpt tiny and small (seed 0, held-out demo text, 8 prompts x 16
    greedy tokens): fp16 cosine 1.00000, top-1 1.000, tokens 1.00; int8 (Q/DQ on
    GEMMs, entropy/min-max/percentile) cosine >= 0.9989, top-1 >= 0.965, tokens
    0.60-0.97; int8-dynamic cosine >= 0.9998, top-1 >= 0.971, tokens 0.73-0.74.
    Greedy-token agreement is noisy (a few prompts, untrained near-tied logits), so
    its floor is loose; top-1 agreement carries the decision. Trained models have
    peakier logits and usually do better. Details in ``builder/README.md``.

    The int8 floors are the seeds' target, not what full int8 reaches: at most 1 %
    task-level disagreement with fp32 (:data:`INT8_MIN_TOP1`). A variant that misses
    it goes through sensitivity-guided partial quantization
    (:mod:`graylane.builder.sensitivity`).
    """
    return {
        Precision.FP32: Tolerance(
            max_abs=1e-3, min_cosine=0.99999, min_top1_agreement=0.99, min_token_agreement=0.9
        ),
        Precision.FP16: Tolerance(
            min_cosine=0.999, min_top1_agreement=0.98, min_token_agreement=0.75
        ),
        Precision.INT8: Tolerance(
            min_cosine=0.995,
            min_top1_agreement=INT8_MIN_TOP1,
            min_token_agreement=0.4,
            max_accuracy_drop=INT8_MAX_ACCURACY_DROP,
        ),
        Precision.INT8_DYNAMIC: Tolerance(
            min_cosine=0.995,
            min_top1_agreement=INT8_MIN_TOP1,
            min_token_agreement=0.4,
            max_accuracy_drop=INT8_MAX_ACCURACY_DROP,
        ),
        Precision.INT8_WEIGHT_ONLY: Tolerance(
            min_cosine=0.99,
            min_top1_agreement=INT8_MIN_TOP1,
            min_token_agreement=0.4,
            max_accuracy_drop=INT8_MAX_ACCURACY_DROP,
        ),
        Precision.INT4: Tolerance(min_cosine=0.95, min_top1_agreement=0.9, min_token_agreement=0.2),
    }


@dataclass(frozen=True)
class BuildSpec:
    """Everything one build needs to know."""

    model: str
    version: SemVer
    source: FileSource | DemoSource | GgufSource
    strategy: str = "default"
    precisions: tuple[Precision, ...] = DEFAULT_PRECISIONS
    profiles: tuple[ShapeProfile, ...] = ()
    calibration: DataSpec | None = None
    calibration_method: CalibrationMethod = CalibrationMethod.ENTROPY
    calibration_percentile: float = 99.999
    calibration_min_samples: int = DEFAULT_MIN_CALIBRATION_SAMPLES
    partial_quantization: PartialQuantizationSpec = field(default_factory=PartialQuantizationSpec)
    weight_only: WeightOnlySpec = field(default_factory=WeightOnlySpec)
    quantize_ops: tuple[str, ...] = DEFAULT_QUANTIZE_OPS
    validation: DataSpec | None = None
    generation: GenerationCheck | None = field(default_factory=GenerationCheck)
    tolerances: Mapping[Precision, Tolerance] = field(default_factory=default_tolerances)
    store: Path | None = None
    force: bool = False
    tensorrt: TensorRTOptions = field(default_factory=TensorRTOptions)
    task: ModelTask | None = None
    """What the model serves; ``None``: as its ONNX metadata declares, else generic."""
    vocab_size: int | None = None
    """Ids its token input takes; ``None``: from the metadata or its embedding table."""
    tokenizer: TokenizerSpec | None = None
    """Text in and out of the model; ``None``: token ids only (or the demo's own bytes)."""

    def tolerance_for(self, precision: Precision) -> Tolerance:
        return self.tolerances.get(precision, Tolerance())


@dataclass(frozen=True, kw_only=True)
class EndpointVariantSpec:
    """One precision variant of an engine-served version: the server that serves it."""

    precision: Precision
    url: str
    """Base URL of the server (the OpenAI routes are under ``<url>/v1``)."""
    model_file: Path | None = None
    """The model file the server loaded, when it is at hand: its sha256 is recorded."""
    model_sha256: str | None = None
    """The model file's digest when the file is elsewhere (a checkpoint on another host);
    with ``model_file`` too, the file must have this digest."""
    served_model: str = ""
    """The ``model`` of each call (the engine's served name, or a LoRA adapter's id);
    empty: the first model the server lists."""
    slots: int = DEFAULT_SLOTS
    """Calls in flight at once (the engine's parallel sequences)."""


@dataclass(frozen=True, kw_only=True)
class RungEvaluationSpec:
    """``engine.evaluation``: score each rung on an evaluation set, the first the reference.

    A rung whose score is lower than the reference's by more than ``max_drop`` (the
    quality cost a rung may have) is refused: not published, the build not ok.
    """

    set_path: Path
    max_drop: float
    limit: int = 0
    """Only the set's first N items (0: all)."""
    concurrency: int = 4
    """Calls at once per endpoint."""


@dataclass(frozen=True, kw_only=True)
class EngineServerSpec:
    """The ``engine:`` section: which engine serves the version, and its endpoints."""

    backend: Backend
    version: str
    """The engine's version (names the artifacts: ``llamacpp0.3.36``)."""
    strategy: str
    variants: tuple[EndpointVariantSpec, ...]
    """Best first: the order of the version's QoS ladder."""
    probe: bool = False
    """Check at build time that each endpoint answers ``/health`` and ``/v1/models``."""
    evaluation: RungEvaluationSpec | None = None
    """Score each rung on an evaluation set and refuse one that costs too much."""

    @property
    def ladder(self) -> tuple[str, ...]:
        """The variants' names, best first."""
        return tuple(v.precision.value for v in self.variants)


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """A version served by engine servers: registered, not built (no ONNX source)."""

    model: str
    version: SemVer
    engine: EngineServerSpec
    store: Path | None = None
    force: bool = False


# ---------------------------------------------------------------- errors and field readers

_E = TypeVar("_E", bound=Enum)


class SpecError(GraylaneError, ValueError):
    """A build spec cannot be used as written; the message says which key and how to fix it."""


def _check_keys(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise SpecError(
            f"{where}: unknown key(s) {unknown}; the keys allowed here are {sorted(allowed)}"
        )


def _required(raw: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in raw or raw[key] is None:
        prefix = "" if where == "spec" else f"{where}."
        raise SpecError(f"{prefix}{key}: required, but missing")
    return raw[key]


def _required_str(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = _required(raw, key, where)
    if not isinstance(value, str) or not value:
        raise SpecError(f"{key}: must be a non-empty string, got {value!r}")
    return value


def _optional_str(raw: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where}.{key}: must be a non-empty string, got {value!r}")
    return value


def _mapping(raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: must be a mapping (key: value), got {type(raw).__name__}")
    return raw


def _read_int(raw: object, where: str, minimum: int | None = None) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise SpecError(f"{where}: must be an integer, got {raw!r}")
    if minimum is not None and raw < minimum:
        raise SpecError(f"{where}: must be >= {minimum}, got {raw}")
    return raw


def _read_number(raw: object, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise SpecError(f"{where}: must be a number, got {raw!r}")
    return float(raw)


def _read_bool(raw: object, where: str) -> bool:
    if not isinstance(raw, bool):
        raise SpecError(f"{where}: must be true or false, got {raw!r}")
    return raw


def _read_path(raw: object, where: str, base_dir: Path) -> Path:
    if not isinstance(raw, str) or not raw:
        raise SpecError(f"{where}: must be a path string, got {raw!r}")
    path = Path(raw).expanduser()
    return path if path.is_absolute() else (base_dir / path).resolve()


def _read_enum(raw: object, enum_type: type[_E], where: str) -> _E:
    try:
        return enum_type(raw)
    except ValueError:
        allowed = [str(m.value) for m in enum_type]
        raise SpecError(f"{where}: {raw!r} is not one of {allowed}") from None


# ---------------------------------------------------------------- reading


def load_spec(path: Path | str) -> BuildSpec | EngineSpec:
    """Read a ``.yaml``/``.yml`` or ``.toml`` build spec."""
    spec_path = Path(path)
    if not spec_path.is_file():
        raise SpecError(f"build spec {spec_path} does not exist or is not a file")
    text = spec_path.read_text(encoding="utf-8")
    suffix = spec_path.suffix.lower()
    data: object
    if suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"{spec_path}: not valid YAML: {exc}") from None
    elif suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"{spec_path}: not valid TOML: {exc}") from None
    else:
        raise SpecError(f"{spec_path}: use a .yaml, .yml or .toml file (got {suffix!r})")
    if not isinstance(data, Mapping):
        raise SpecError(f"{spec_path}: the top level must be a mapping of keys to values")
    return parse_spec(data, base_dir=spec_path.resolve().parent)


# ---------------------------------------------------------------- parsing


_TOP_KEYS = {
    "model", "version", "source", "strategy", "precisions", "profiles", "calibration",
    "validation", "tolerances", "store", "force", "tensorrt", "task", "vocab_size",
    "partial_quantization", "tokenizer", "weight_only",
}  # fmt: skip
_DATA_KEYS = {"npz", "generator", "samples", "seed", "batch_size", "seq_len", "int_high"}
_VALID_DATA_KEYS = _DATA_KEYS | {"prompts", "continuation"}
_CALIB_KEYS = _DATA_KEYS | {"method", "percentile", "quantize_ops", "min_samples"}
_PARTIAL_KEYS = {"enabled", "node_budget", "max_groups", "time_budget_s", "max_trials"}
_WEIGHT_ONLY_KEYS = {
    "block_size", "int8_symmetric", "int4_block_size", "int4_symmetric", "accuracy_level",
    "keep_float", "int8_keep_float", "int8_smoothing", "int8_sensitive_layers",
    "int8_rounding", "int4_source_grid", "int4_accuracy_level",
}  # fmt: skip
_VALID_KEYS = _VALID_DATA_KEYS | {"generation"}
_TOL_KEYS = {
    "max_abs",
    "min_cosine",
    "min_top1_agreement",
    "min_token_agreement",
    "max_accuracy_drop",
}
_TRT_KEYS = {"enabled", "workspace_mib", "hardware_compatibility"}
_ENGINE_TOP_KEYS = {"model", "version", "engine", "store", "force"}
_ENGINE_KEYS = {"backend", "version", "strategy", "variants", "probe", "evaluation"}
_EVALUATION_KEYS = {"set", "max_drop", "limit", "concurrency"}
_ENDPOINT_KEYS = {"precision", "url", "model_file", "model_sha256", "served_model", "slots"}


def parse_spec(data: Mapping[str, Any], base_dir: Path) -> BuildSpec | EngineSpec:
    """Turn a decoded spec mapping into a :class:`BuildSpec`, or an :class:`EngineSpec`
    when it has an ``engine`` section; paths resolve against ``base_dir``."""
    if "engine" in data:
        return _engine_spec(data, base_dir)
    _check_keys(data, _TOP_KEYS, "spec")
    model, version = _model_and_version(data)
    strategy = _optional_str(data, "strategy", "spec", "default")
    try:
        _validate_strategy(strategy)
    except NamingError as exc:
        raise SpecError(f"strategy: {exc}") from None

    calib_raw = data.get("calibration")
    calibration: DataSpec | None = None
    method = CalibrationMethod.ENTROPY
    percentile = 99.999
    quantize_ops = DEFAULT_QUANTIZE_OPS
    min_samples = DEFAULT_MIN_CALIBRATION_SAMPLES
    if calib_raw is not None:
        calib_map = _mapping(calib_raw, "calibration")
        _check_keys(calib_map, _CALIB_KEYS, "calibration")
        calibration = _data_spec(calib_map, "calibration", base_dir)
        method = _read_enum(
            calib_map.get("method", "entropy"), CalibrationMethod, "calibration.method"
        )
        percentile = _read_number(calib_map.get("percentile", 99.999), "calibration.percentile")
        if not 0.0 < percentile <= 100.0:
            raise SpecError(f"calibration.percentile: must be in (0, 100], got {percentile}")
        quantize_ops = _op_types(calib_map.get("quantize_ops", list(DEFAULT_QUANTIZE_OPS)))
        min_samples = _read_int(
            calib_map.get("min_samples", min_samples), "calibration.min_samples", minimum=1
        )

    validation: DataSpec | None = None
    generation: GenerationCheck | None = GenerationCheck()
    valid_raw = data.get("validation")
    if valid_raw is not None:
        valid_map = _mapping(valid_raw, "validation")
        _check_keys(valid_map, _VALID_KEYS, "validation")
        validation = _data_spec(valid_map, "validation", base_dir)
        generation = _generation(valid_map.get("generation", {}), "validation.generation")

    precisions = _precisions(data.get("precisions"))
    if "precisions" not in data and calibration is None:
        # Unasked-for int8 is dropped quietly when there is nothing to calibrate with.
        precisions = tuple(p for p in precisions if p is not Precision.INT8)
    if Precision.INT8 in precisions and calibration is None:
        raise SpecError(
            "calibration: the int8 precision needs calibration data; add a 'calibration' "
            "section (npz: FILE or generator: demo-text, with samples: N) or drop 'int8'"
        )

    if data.get("source") is None:
        raise SpecError(
            "source: required, but missing (the ONNX file to build from; or an 'engine' "
            "section for a version engine servers serve)"
        )
    source = _source(data["source"], base_dir)
    tokenizer = None if data.get("tokenizer") is None else _tokenizer(data["tokenizer"], base_dir)
    if tokenizer is not None and isinstance(source, GgufSource):
        raise SpecError(
            "tokenizer: a GGUF source brings its own tokenizer (from its metadata); remove "
            "'tokenizer'"
        )
    for where, section in (("calibration", calibration), ("validation", validation)):
        if (
            section is not None
            and isinstance(section.source, GeneratorData)
            and section.source.generator in (Generator.TEXT, Generator.PROMPTS)
            and tokenizer is None
            and not isinstance(source, GgufSource)
        ):
            what = "prompts" if section.source.generator is Generator.PROMPTS else "'text'"
            raise SpecError(
                f"{where}: {what} encodes with the model's tokenizer; "
                "name it in 'tokenizer: PATH/tokenizer.json'"
            )
    return BuildSpec(
        model=model,
        version=version,
        source=source,
        strategy=strategy,
        precisions=precisions,
        profiles=_profiles(data.get("profiles", [])),
        calibration=calibration,
        calibration_method=method,
        calibration_percentile=percentile,
        calibration_min_samples=min_samples,
        partial_quantization=_partial(data.get("partial_quantization", {})),
        weight_only=_weight_only_spec(data.get("weight_only", {}), base_dir),
        quantize_ops=quantize_ops,
        validation=validation,
        generation=generation,
        tolerances=_tolerances(data.get("tolerances", {})),
        store=_store(data, base_dir),
        force=_read_bool(data.get("force", False), "force"),
        tensorrt=_tensorrt(data.get("tensorrt", {})),
        task=None if data.get("task") is None else _read_enum(data["task"], ModelTask, "task"),
        vocab_size=None
        if data.get("vocab_size") is None
        else _read_int(data["vocab_size"], "vocab_size", minimum=1),
        tokenizer=tokenizer,
    )


def _model_and_version(data: Mapping[str, Any]) -> tuple[str, SemVer]:
    model = _required_str(data, "model", "spec")
    try:
        validate_model_name(model)
    except NamingError as exc:
        raise SpecError(f"model: {exc}") from None
    version_text = _required(data, "version", "spec")
    try:
        version = parse_semver(str(version_text))
    except NamingError as exc:
        raise SpecError(f"version: {exc}") from None
    return model, version


def _store(data: Mapping[str, Any], base_dir: Path) -> Path | None:
    raw = data.get("store")
    return None if raw is None else _read_path(raw, "store", base_dir)


_RESERVED_NAMES = {"manifest.json"}


def _tokenizer(raw: object, base_dir: Path) -> TokenizerSpec:
    entry: Mapping[str, Any] = {"path": raw} if isinstance(raw, str) else _mapping(raw, "tokenizer")
    _check_keys(entry, {"path", "eos_token_id"}, "tokenizer")
    path = _read_path(_required(entry, "path", "tokenizer"), "tokenizer.path", base_dir)
    if path.suffix != ".json" or path.name in _RESERVED_NAMES:
        raise SpecError(
            f"tokenizer.path: give a Hugging Face tokenizer.json file, got {path.name!r}"
        )
    eos = entry.get("eos_token_id")
    return TokenizerSpec(
        path=path,
        eos_token_id=None if eos is None else _read_int(eos, "tokenizer.eos_token_id", minimum=0),
    )


def _source(raw: object, base_dir: Path) -> FileSource | DemoSource | GgufSource:
    if isinstance(raw, str):
        path = _read_path(raw, "source", base_dir)
        return GgufSource(path=path) if path.suffix.lower() == ".gguf" else FileSource(path=path)
    if isinstance(raw, Mapping):
        _check_keys(raw, {"path", "demo", "seed", "kv_cache", "gguf"}, "source")
        if "gguf" in raw:
            if len(raw) != 1:
                raise SpecError("source.gguf: give the GGUF file alone, e.g. {gguf: model.gguf}")
            return GgufSource(path=_read_path(raw["gguf"], "source.gguf", base_dir))
        if "path" in raw and "demo" not in raw:
            return FileSource(path=_read_path(raw["path"], "source.path", base_dir))
        if "demo" in raw and "path" not in raw:
            size = str(raw["demo"])
            if size not in ("tiny", "small"):
                raise SpecError(f"source.demo: use 'tiny' or 'small', got {size!r}")
            return DemoSource(
                size=size,
                seed=_read_int(raw.get("seed", 0), "source.seed", minimum=0),
                kv_cache=_read_bool(raw.get("kv_cache", False), "source.kv_cache"),
            )
    raise SpecError(
        "source: give the ONNX file path (relative to the spec), {gguf: FILE.gguf} for a "
        "llama.cpp model, or {demo: tiny|small, seed: N} for the generated demo GPT"
    )


def _read_precision(raw: object, allowed: Collection[Precision], where: str) -> Precision:
    """A precision of ``allowed``, listed in the error in ``Precision``'s order."""
    names = [p.value for p in Precision if p in allowed]
    if raw not in names:
        raise SpecError(f"{where}: {raw!r} is not one of {names}")
    return Precision(raw)


def _precisions(raw: object) -> tuple[Precision, ...]:
    if raw is None:
        return DEFAULT_PRECISIONS
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise SpecError(
            f"precisions: give a non-empty list, e.g. [fp32, fp16, int8, int8-dynamic]; got {raw!r}"
        )
    result: list[Precision] = []
    for i, item in enumerate(raw):
        precision = _read_precision(item, ONNX_PRECISIONS, f"precisions[{i}]")
        if precision in result:
            raise SpecError(f"precisions[{i}]: {precision.value!r} is listed twice")
        result.append(precision)
    if Precision.FP32 not in result:
        # fp32 is the reference every other variant is validated against.
        result.insert(0, Precision.FP32)
    return tuple(result)


def _op_types(raw: object) -> tuple[str, ...]:
    if (
        not isinstance(raw, Sequence)
        or isinstance(raw, str)
        or not raw
        or not all(isinstance(op, str) and op.isidentifier() for op in raw)
    ):
        raise SpecError(
            f"calibration.quantize_ops: give a non-empty list of ONNX op types such as "
            f"[MatMul, Gemm]; got {raw!r}"
        )
    return tuple(str(op) for op in raw)


def _profiles(raw: object) -> tuple[ShapeProfile, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise SpecError("profiles: give a list of {name: ..., shapes: {INPUT: {min, opt, max}}}")
    profiles: list[ShapeProfile] = []
    for i, item in enumerate(raw):
        where = f"profiles[{i}]"
        entry = _mapping(item, where)
        _check_keys(entry, {"name", "shapes"}, where)
        name = _optional_str(entry, "name", where, f"profile{i}")
        shapes_map = _mapping(_required(entry, "shapes", where), f"{where}.shapes")
        if not shapes_map:
            raise SpecError(f"{where}.shapes: list at least one input")
        shapes: list[InputShapeRange] = []
        for input_name, rng in shapes_map.items():
            shapes.append(_shape_range(str(input_name), rng, f"{where}.shapes.{input_name}"))
        profiles.append(ShapeProfile(name=name, shapes=tuple(shapes)))
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise SpecError(f"profiles: names must be unique, got {names}")
    return tuple(profiles)


def _shape_range(input_name: str, raw: object, where: str) -> InputShapeRange:
    rng = _mapping(raw, where)
    _check_keys(rng, {"min", "opt", "max"}, where)
    dims = {k: _shape(_required(rng, k, where), f"{where}.{k}") for k in ("min", "opt", "max")}
    if not len(dims["min"]) == len(dims["opt"]) == len(dims["max"]):
        raise SpecError(f"{where}: min, opt and max must have the same rank, got {dims}")
    for lo, mid, hi in zip(dims["min"], dims["opt"], dims["max"], strict=True):
        if not lo <= mid <= hi:
            raise SpecError(f"{where}: need min <= opt <= max in every dimension, got {dims}")
    return InputShapeRange(input=input_name, min=dims["min"], opt=dims["opt"], max=dims["max"])


def _shape(raw: object, where: str) -> tuple[int, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise SpecError(f"{where}: give a list of positive integers, e.g. [1, 64]; got {raw!r}")
    return tuple(_read_int(d, f"{where}[{i}]", minimum=1) for i, d in enumerate(raw))


def _data_spec(raw: Mapping[str, Any], where: str, base_dir: Path) -> DataSpec:
    has_npz, has_gen, has_prompts = "npz" in raw, "generator" in raw, "prompts" in raw
    if has_npz + has_gen + has_prompts != 1:
        raise SpecError(
            f"{where}: give exactly one of 'npz: FILE' (arrays named like the model inputs, "
            "samples along axis 0), 'prompts: FILE' (text, one prompt per line) or "
            f"'generator: {'|'.join(g.value for g in Generator if g is not Generator.PROMPTS)}'"
        )
    source: NpzData | GeneratorData
    if has_prompts:
        path = _read_path(raw["prompts"], f"{where}.prompts", base_dir)
        if not path.is_file():
            raise SpecError(f"{where}.prompts: {path} does not exist")
        count = len(read_prompts(path))
        if count == 0:
            raise SpecError(f"{where}.prompts: {path} holds no prompt")
        return DataSpec(
            source=GeneratorData(
                generator=Generator.PROMPTS,
                prompts=path,
                seq_len=_read_int(raw.get("seq_len", 512), f"{where}.seq_len", minimum=2),
                continuation=_read_int(
                    raw.get("continuation", 16), f"{where}.continuation", minimum=0
                ),
            ),
            samples=_read_int(raw.get("samples", count), f"{where}.samples", minimum=1),
            seed=_read_int(raw.get("seed", 0), f"{where}.seed", minimum=0),
            batch_size=_read_int(raw.get("batch_size", 1), f"{where}.batch_size", minimum=1),
        )
    if has_npz:
        path = _read_path(raw["npz"], f"{where}.npz", base_dir)
        if path.suffix != ".npz":
            raise SpecError(f"{where}.npz: expected a .npz file, got {path.name}")
        source = NpzData(path=path)
    else:
        generator = _read_enum(raw["generator"], Generator, f"{where}.generator")
        if generator is Generator.PROMPTS:
            raise SpecError(f"{where}: name the prompts file with 'prompts: FILE'")
        source = GeneratorData(
            generator=generator,
            seq_len=_read_int(raw.get("seq_len", 32), f"{where}.seq_len", minimum=2),
            int_high=_read_int(raw.get("int_high", 2), f"{where}.int_high", minimum=1),
        )
    return DataSpec(
        source=source,
        samples=_read_int(_required(raw, "samples", where), f"{where}.samples", minimum=1),
        seed=_read_int(raw.get("seed", 0), f"{where}.seed", minimum=0),
        batch_size=_read_int(raw.get("batch_size", 1), f"{where}.batch_size", minimum=1),
    )


def _generation(raw: object, where: str) -> GenerationCheck | None:
    if raw is False or raw is None:
        return None
    entry = _mapping(raw, where)
    _check_keys(entry, {"prompts", "new_tokens"}, where)
    return GenerationCheck(
        prompts=_read_int(entry.get("prompts", 8), f"{where}.prompts", minimum=1),
        new_tokens=_read_int(entry.get("new_tokens", 16), f"{where}.new_tokens", minimum=1),
    )


def _tolerances(raw: object) -> dict[Precision, Tolerance]:
    table = default_tolerances()
    entries = _mapping(raw, "tolerances")
    for key, value in entries.items():
        precision = _read_precision(key, ONNX_PRECISIONS, "tolerances")
        where = f"tolerances.{precision.value}"
        entry = _mapping(value, where)
        _check_keys(entry, _TOL_KEYS, where)
        base = table[precision]
        values: dict[str, float | None] = {name: getattr(base, name) for name in _TOL_KEYS}
        for name in _TOL_KEYS & set(entry):
            item = entry[name]
            values[name] = None if item is None else _read_number(item, f"{where}.{name}")
            limit = values[name]
            if limit is not None and name.startswith("min_") and not 0.0 <= limit <= 1.0:
                raise SpecError(f"{where}.{name}: must be between 0 and 1, got {limit}")
            if limit is not None and name == "max_accuracy_drop" and not 0.0 <= limit <= 1.0:
                raise SpecError(f"{where}.{name}: must be between 0 and 1, got {limit}")
            if limit is not None and name == "max_abs" and limit < 0:
                raise SpecError(f"{where}.{name}: must be >= 0, got {limit}")
        table[precision] = Tolerance(**values)
    return table


def _tensorrt(raw: object) -> TensorRTOptions:
    entry = _mapping(raw, "tensorrt")
    _check_keys(entry, _TRT_KEYS, "tensorrt")
    return TensorRTOptions(
        enabled=_read_bool(entry.get("enabled", True), "tensorrt.enabled"),
        workspace_bytes=_read_int(entry.get("workspace_mib", 1024), "tensorrt.workspace_mib", 1)
        << 20,
        hardware_compatibility=_read_enum(
            entry.get("hardware_compatibility", "none"),
            HardwareCompatibility,
            "tensorrt.hardware_compatibility",
        ),
    )


def _partial(raw: object) -> PartialQuantizationSpec:
    table = _mapping(raw, "partial_quantization")
    _check_keys(table, _PARTIAL_KEYS, "partial_quantization")
    base = PartialQuantizationSpec()
    return PartialQuantizationSpec(
        enabled=_read_bool(table.get("enabled", base.enabled), "partial_quantization.enabled"),
        node_budget=_read_int(
            table.get("node_budget", base.node_budget), "partial_quantization.node_budget", 0
        ),
        max_groups=_read_int(
            table.get("max_groups", base.max_groups), "partial_quantization.max_groups", 1
        ),
        time_budget_s=_read_number(
            table.get("time_budget_s", base.time_budget_s), "partial_quantization.time_budget_s"
        ),
        max_trials=_read_int(
            table.get("max_trials", base.max_trials), "partial_quantization.max_trials", 1
        ),
    )


def _prefixes(raw: object, where: str) -> tuple[str, ...]:
    if (
        not isinstance(raw, Sequence)
        or isinstance(raw, str)
        or not all(isinstance(k, str) and k for k in raw)
    ):
        raise SpecError(f"{where}: give a list of node name prefixes, got {raw!r}")
    return tuple(raw)


def _smoothing_spec(raw: object, where: str, base_dir: Path) -> SmoothingSpec | None:
    if raw is None:
        return None
    table = _mapping(raw, where)
    _check_keys(table, {"alpha", "prompts"}, where)
    alpha = table.get("alpha", 0.5)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise SpecError(f"{where}.alpha: a number between 0 and 1, got {alpha!r}")
    path = _read_path(_required(table, "prompts", where), f"{where}.prompts", base_dir)
    if not path.is_file():
        raise SpecError(f"{where}.prompts: {path} does not exist")
    if not read_prompts(path):
        raise SpecError(f"{where}.prompts: {path} holds no prompt")
    return SmoothingSpec(alpha=float(alpha), prompts=path)


def _sensitive_layers_spec(raw: object, where: str, base_dir: Path) -> SensitiveLayersSpec | None:
    if raw is None:
        return None
    table = _mapping(raw, where)
    _check_keys(table, {"count", "prompts"}, where)
    count = _read_int(_required(table, "count", where), f"{where}.count", 1)
    path = _read_path(_required(table, "prompts", where), f"{where}.prompts", base_dir)
    if not path.is_file():
        raise SpecError(f"{where}.prompts: {path} does not exist")
    if not read_prompts(path):
        raise SpecError(f"{where}.prompts: {path} holds no prompt")
    return SensitiveLayersSpec(count=count, prompts=path)


_ROUNDING_METHODS = ("rtn", "gptq")


def _rounding_spec(raw: object, where: str, base_dir: Path) -> RoundingSpec | None:
    if raw is None or raw == "rtn":
        return None
    table = _mapping(raw, where)
    _check_keys(table, {"method", "prompts", "continuation", "act_order"}, where)
    method = _required(table, "method", where)
    if method not in _ROUNDING_METHODS:
        raise SpecError(f"{where}.method: one of {list(_ROUNDING_METHODS)}, got {method!r}")
    if method == "rtn":
        return None
    path = _read_path(_required(table, "prompts", where), f"{where}.prompts", base_dir)
    if not path.is_file():
        raise SpecError(f"{where}.prompts: {path} does not exist")
    if not read_prompts(path):
        raise SpecError(f"{where}.prompts: {path} holds no prompt")
    continuation = _read_int(table.get("continuation", 0), f"{where}.continuation", 0)
    act_order = _read_bool(table.get("act_order", False), f"{where}.act_order")
    return RoundingSpec(
        method=str(method), prompts=path, continuation=continuation, act_order=act_order
    )


def _weight_only_spec(raw: object, base_dir: Path) -> WeightOnlySpec:
    table = _mapping(raw, "weight_only")
    _check_keys(table, _WEIGHT_ONLY_KEYS, "weight_only")
    base = WeightOnlySpec()
    where = "weight_only"
    blocks = {}
    for key in ("block_size", "int4_block_size"):
        block = _read_int(table.get(key, getattr(base, key)), f"{where}.{key}", 16)
        if block & (block - 1):
            raise SpecError(f"{where}.{key}: must be a power of two >= 16, got {block}")
        blocks[key] = block
    levels: dict[str, int | None] = {}
    for key in ("accuracy_level", "int4_accuracy_level"):
        raw_level = table.get(key, getattr(base, key))
        if raw_level is None:
            levels[key] = None
            continue
        levels[key] = _read_int(raw_level, f"{where}.{key}", 0)
        if int(raw_level) > 4:
            raise SpecError(f"{where}.{key}: one of 0 to 4, got {raw_level}")
    level = levels["accuracy_level"]
    assert level is not None
    keep = _prefixes(table.get("keep_float", []), f"{where}.keep_float")
    return WeightOnlySpec(
        block_size=blocks["block_size"],
        int8_symmetric=_read_bool(table.get("int8_symmetric", True), f"{where}.int8_symmetric"),
        int4_block_size=blocks["int4_block_size"],
        int4_symmetric=_read_bool(table.get("int4_symmetric", False), f"{where}.int4_symmetric"),
        accuracy_level=level,
        keep_float=keep,
        int8_keep_float=_prefixes(table.get("int8_keep_float", []), f"{where}.int8_keep_float"),
        int8_smoothing=_smoothing_spec(
            table.get("int8_smoothing"), f"{where}.int8_smoothing", base_dir
        ),
        int8_sensitive_layers=_sensitive_layers_spec(
            table.get("int8_sensitive_layers"), f"{where}.int8_sensitive_layers", base_dir
        ),
        int8_rounding=_rounding_spec(
            table.get("int8_rounding"), f"{where}.int8_rounding", base_dir
        ),
        int4_source_grid=_read_bool(
            table.get("int4_source_grid", False), f"{where}.int4_source_grid"
        ),
        int4_accuracy_level=levels["int4_accuracy_level"],
    )


# ---------------------------------------------------------------- engine specs


def _engine_spec(data: Mapping[str, Any], base_dir: Path) -> EngineSpec:
    mixed = sorted(str(k) for k in data if k in _TOP_KEYS - _ENGINE_TOP_KEYS)
    if mixed:
        raise SpecError(
            f"engine: an engine-served version is not built from an ONNX file, so it takes "
            f"no {mixed}; remove them (the engine's strategy goes in engine.strategy), or "
            "drop 'engine' to build from 'source'"
        )
    _check_keys(data, _ENGINE_TOP_KEYS, "spec")
    model, version = _model_and_version(data)
    engine = _engine_server(_mapping(data["engine"], "engine"), base_dir)
    try:
        # The engine's version is part of every artifact name: it must be spellable there.
        first = engine.variants[0].precision
        ArtifactName(model, engine.backend, engine.version, first, engine.strategy, version)
    except NamingError as exc:
        raise SpecError(f"engine.version: {exc}") from None
    return EngineSpec(
        model=model,
        version=version,
        engine=engine,
        store=_store(data, base_dir),
        force=_read_bool(data.get("force", False), "force"),
    )


def _engine_server(raw: Mapping[str, Any], base_dir: Path) -> EngineServerSpec:
    _check_keys(raw, _ENGINE_KEYS, "engine")
    servers = [b for b in Backend if b.is_engine_server]
    backend = _read_enum(_required(raw, "backend", "engine"), Backend, "engine.backend")
    if backend not in servers:
        raise SpecError(
            f"engine.backend: {backend.value!r} is not an engine server; use one of "
            f"{[b.value for b in servers]} (or 'source: FILE.onnx' to build ONNX variants)"
        )
    engine_version = _required(raw, "version", "engine")
    if not isinstance(engine_version, str):
        raise SpecError(
            f"engine.version: give the engine's version as a quoted string such as "
            f'"0.3.36", got {engine_version!r}'
        )
    strategy = _optional_str(raw, "strategy", "engine", ENGINE_STRATEGIES.get(backend, "default"))
    try:
        _validate_strategy(strategy)
    except NamingError as exc:
        raise SpecError(f"engine.strategy: {exc}") from None
    items = _required(raw, "variants", "engine")
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        raise SpecError(
            "engine.variants: give a non-empty list, best first, of "
            "{precision: ..., url: http://HOST:PORT}"
        )
    variants = tuple(
        _endpoint_variant(item, backend, f"engine.variants[{i}]", base_dir)
        for i, item in enumerate(items)
    )
    seen: dict[object, int] = {}
    for i, v in enumerate(variants):
        for key, what in ((v.precision, "precision"), ((v.url, v.served_model), "endpoint")):
            if key in seen:
                raise SpecError(
                    f"engine.variants[{i}]: the same {what} as engine.variants[{seen[key]}]; "
                    "each variant is one rung of the ladder, served by its own endpoint "
                    "(or its own served_model)"
                )
            seen[key] = i
    return EngineServerSpec(
        backend=backend,
        version=engine_version,
        strategy=strategy,
        variants=variants,
        probe=_read_bool(raw.get("probe", False), "engine.probe"),
        evaluation=None
        if raw.get("evaluation") is None
        else _rung_evaluation(raw["evaluation"], base_dir),
    )


def _rung_evaluation(raw: object, base_dir: Path) -> RungEvaluationSpec:
    where = "engine.evaluation"
    entry = _mapping(raw, where)
    _check_keys(entry, _EVALUATION_KEYS, where)
    max_drop = _read_number(_required(entry, "max_drop", where), f"{where}.max_drop")
    if not 0.0 <= max_drop <= 1.0:
        raise SpecError(f"{where}.max_drop: a drop of the mean item score, 0..1; got {max_drop}")
    return RungEvaluationSpec(
        set_path=_read_path(_required(entry, "set", where), f"{where}.set", base_dir),
        max_drop=max_drop,
        limit=_read_int(entry.get("limit", 0), f"{where}.limit", minimum=0),
        concurrency=_read_int(entry.get("concurrency", 4), f"{where}.concurrency", minimum=1),
    )


def _endpoint_variant(
    raw: object, backend: Backend, where: str, base_dir: Path
) -> EndpointVariantSpec:
    entry = _mapping(raw, where)
    _check_keys(entry, _ENDPOINT_KEYS, where)
    precision = _read_precision(
        _required(entry, "precision", where), ENGINE_PRECISIONS[backend], f"{where}.precision"
    )
    url = _required(entry, "url", where)
    if not isinstance(url, str):
        raise SpecError(f"{where}.url: must be a string such as http://127.0.0.1:8081")
    try:
        url = parse_endpoint_url(url)
    except EndpointError as exc:
        raise SpecError(f"{where}.url: {exc}") from None
    model_file = entry.get("model_file")
    digest = entry.get("model_sha256")
    if digest is not None and (
        not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest)
    ):
        raise SpecError(f"{where}.model_sha256: give 64 hex digits (sha256sum), got {digest!r}")
    served = entry.get("served_model", "")
    if not isinstance(served, str):
        raise SpecError(f"{where}.served_model: must be a string, got {served!r}")
    return EndpointVariantSpec(
        precision=precision,
        url=url,
        model_file=None
        if model_file is None
        else _read_path(model_file, f"{where}.model_file", base_dir),
        model_sha256=None if digest is None else digest.lower(),
        served_model=served,
        slots=_read_int(entry.get("slots", DEFAULT_SLOTS), f"{where}.slots", minimum=1),
    )


def read_prompts(path: Path) -> tuple[str, ...]:
    """The prompts of a ``prompts: FILE``: its non-empty lines that are not ``#`` comments."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"prompts: cannot read {path}: {exc}") from None
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)
