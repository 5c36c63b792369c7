"""Reading build specs: :func:`load_spec` decodes a YAML/TOML file, :func:`parse_spec` turns a
decoded mapping into a :class:`~graylane.builder.spec_types.BuildSpec` (no I/O)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
    NamingError,
    Precision,
    parse_semver,
    validate_model_name,
)
from graylane.artifacts.naming import validate_strategy as _validate_strategy
from graylane.builder.spec_fields import (
    SpecError,
    check_keys,
    mapping,
    optional_str,
    read_bool,
    read_enum,
    read_int,
    read_number,
    read_path,
    required,
    required_str,
)
from graylane.builder.spec_types import (
    DEFAULT_MIN_CALIBRATION_SAMPLES,
    DEFAULT_QUANTIZE_OPS,
    BuildSpec,
    DataSpec,
    DemoSource,
    FileSource,
    GenerationCheck,
    Generator,
    GeneratorData,
    NpzData,
    PartialQuantizationSpec,
    TensorRTOptions,
    default_tolerances,
)

__all__ = ["load_spec", "parse_spec"]


# ---------------------------------------------------------------- reading files


def load_spec(path: Path | str) -> BuildSpec:
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
    "partial_quantization",
}  # fmt: skip
_DATA_KEYS = {"npz", "generator", "samples", "seed", "batch_size", "seq_len", "int_high"}
_CALIB_KEYS = _DATA_KEYS | {"method", "percentile", "quantize_ops", "min_samples"}
_PARTIAL_KEYS = {"enabled", "node_budget", "max_groups"}
_VALID_KEYS = _DATA_KEYS | {"generation"}
_TOL_KEYS = {
    "max_abs",
    "min_cosine",
    "min_top1_agreement",
    "min_token_agreement",
    "max_accuracy_drop",
}
_TRT_KEYS = {"enabled", "workspace_mib", "hardware_compatibility"}


def parse_spec(data: Mapping[str, Any], base_dir: Path) -> BuildSpec:
    """Turn a decoded spec mapping into a :class:`BuildSpec`; paths resolve against ``base_dir``."""
    check_keys(data, _TOP_KEYS, "spec")
    model = required_str(data, "model", "spec")
    try:
        validate_model_name(model)
    except NamingError as exc:
        raise SpecError(f"model: {exc}") from None
    version_text = required(data, "version", "spec")
    try:
        version = parse_semver(str(version_text))
    except NamingError as exc:
        raise SpecError(f"version: {exc}") from None
    strategy = optional_str(data, "strategy", "spec", "default")
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
        calib_map = mapping(calib_raw, "calibration")
        check_keys(calib_map, _CALIB_KEYS, "calibration")
        calibration = _data_spec(calib_map, "calibration", base_dir)
        method = read_enum(
            calib_map.get("method", "entropy"), CalibrationMethod, "calibration.method"
        )
        percentile = read_number(calib_map.get("percentile", 99.999), "calibration.percentile")
        if not 0.0 < percentile <= 100.0:
            raise SpecError(f"calibration.percentile: must be in (0, 100], got {percentile}")
        quantize_ops = _op_types(calib_map.get("quantize_ops", list(DEFAULT_QUANTIZE_OPS)))
        min_samples = read_int(
            calib_map.get("min_samples", min_samples), "calibration.min_samples", minimum=1
        )

    validation: DataSpec | None = None
    generation: GenerationCheck | None = GenerationCheck()
    valid_raw = data.get("validation")
    if valid_raw is not None:
        valid_map = mapping(valid_raw, "validation")
        check_keys(valid_map, _VALID_KEYS, "validation")
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

    store_raw = data.get("store")
    store = read_path(store_raw, "store", base_dir) if store_raw is not None else None
    return BuildSpec(
        model=model,
        version=version,
        source=_source(required(data, "source", "spec"), base_dir),
        strategy=strategy,
        precisions=precisions,
        profiles=_profiles(data.get("profiles", [])),
        calibration=calibration,
        calibration_method=method,
        calibration_percentile=percentile,
        calibration_min_samples=min_samples,
        partial_quantization=_partial(data.get("partial_quantization", {})),
        quantize_ops=quantize_ops,
        validation=validation,
        generation=generation,
        tolerances=_tolerances(data.get("tolerances", {})),
        store=store,
        force=read_bool(data.get("force", False), "force"),
        tensorrt=_tensorrt(data.get("tensorrt", {})),
        task=None if data.get("task") is None else read_enum(data["task"], ModelTask, "task"),
        vocab_size=None
        if data.get("vocab_size") is None
        else read_int(data["vocab_size"], "vocab_size", minimum=1),
    )


def _source(raw: object, base_dir: Path) -> FileSource | DemoSource:
    if isinstance(raw, str):
        return FileSource(path=read_path(raw, "source", base_dir))
    if isinstance(raw, Mapping):
        check_keys(raw, {"path", "demo", "seed", "kv_cache"}, "source")
        if "path" in raw and "demo" not in raw:
            return FileSource(path=read_path(raw["path"], "source.path", base_dir))
        if "demo" in raw and "path" not in raw:
            size = str(raw["demo"])
            if size not in ("tiny", "small"):
                raise SpecError(f"source.demo: use 'tiny' or 'small', got {size!r}")
            return DemoSource(
                size=size,
                seed=read_int(raw.get("seed", 0), "source.seed", minimum=0),
                kv_cache=read_bool(raw.get("kv_cache", False), "source.kv_cache"),
            )
    raise SpecError(
        "source: give the ONNX file path (relative to the spec), or {demo: tiny|small, seed: N} "
        "for the generated demo GPT"
    )


def _precisions(raw: object) -> tuple[Precision, ...]:
    if raw is None:
        return tuple(Precision)
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise SpecError(
            f"precisions: give a non-empty list, e.g. [fp32, fp16, int8, int8-dynamic]; got {raw!r}"
        )
    result: list[Precision] = []
    for i, item in enumerate(raw):
        precision = read_enum(item, Precision, f"precisions[{i}]")
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
        entry = mapping(item, where)
        check_keys(entry, {"name", "shapes"}, where)
        name = optional_str(entry, "name", where, f"profile{i}")
        shapes_map = mapping(required(entry, "shapes", where), f"{where}.shapes")
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
    rng = mapping(raw, where)
    check_keys(rng, {"min", "opt", "max"}, where)
    dims = {k: _shape(required(rng, k, where), f"{where}.{k}") for k in ("min", "opt", "max")}
    if not len(dims["min"]) == len(dims["opt"]) == len(dims["max"]):
        raise SpecError(f"{where}: min, opt and max must have the same rank, got {dims}")
    for lo, mid, hi in zip(dims["min"], dims["opt"], dims["max"], strict=True):
        if not lo <= mid <= hi:
            raise SpecError(f"{where}: need min <= opt <= max in every dimension, got {dims}")
    return InputShapeRange(input=input_name, min=dims["min"], opt=dims["opt"], max=dims["max"])


def _shape(raw: object, where: str) -> tuple[int, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise SpecError(f"{where}: give a list of positive integers, e.g. [1, 64]; got {raw!r}")
    return tuple(read_int(d, f"{where}[{i}]", minimum=1) for i, d in enumerate(raw))


def _data_spec(raw: Mapping[str, Any], where: str, base_dir: Path) -> DataSpec:
    has_npz, has_gen = "npz" in raw, "generator" in raw
    if has_npz == has_gen:
        raise SpecError(
            f"{where}: give exactly one of 'npz: FILE' (arrays named like the model inputs, "
            f"samples along axis 0) or 'generator: {'|'.join(g.value for g in Generator)}'"
        )
    source: NpzData | GeneratorData
    if has_npz:
        path = read_path(raw["npz"], f"{where}.npz", base_dir)
        if path.suffix != ".npz":
            raise SpecError(f"{where}.npz: expected a .npz file, got {path.name}")
        source = NpzData(path=path)
    else:
        source = GeneratorData(
            generator=read_enum(raw["generator"], Generator, f"{where}.generator"),
            seq_len=read_int(raw.get("seq_len", 32), f"{where}.seq_len", minimum=2),
            int_high=read_int(raw.get("int_high", 2), f"{where}.int_high", minimum=1),
        )
    return DataSpec(
        source=source,
        samples=read_int(required(raw, "samples", where), f"{where}.samples", minimum=1),
        seed=read_int(raw.get("seed", 0), f"{where}.seed", minimum=0),
        batch_size=read_int(raw.get("batch_size", 1), f"{where}.batch_size", minimum=1),
    )


def _generation(raw: object, where: str) -> GenerationCheck | None:
    if raw is False or raw is None:
        return None
    entry = mapping(raw, where)
    check_keys(entry, {"prompts", "new_tokens"}, where)
    return GenerationCheck(
        prompts=read_int(entry.get("prompts", 8), f"{where}.prompts", minimum=1),
        new_tokens=read_int(entry.get("new_tokens", 16), f"{where}.new_tokens", minimum=1),
    )


def _tolerances(raw: object) -> dict[Precision, Tolerance]:
    table = default_tolerances()
    entries = mapping(raw, "tolerances")
    for key, value in entries.items():
        precision = read_enum(key, Precision, "tolerances")
        where = f"tolerances.{precision.value}"
        entry = mapping(value, where)
        check_keys(entry, _TOL_KEYS, where)
        base = table[precision]
        values: dict[str, float | None] = {name: getattr(base, name) for name in _TOL_KEYS}
        for name in _TOL_KEYS & set(entry):
            item = entry[name]
            values[name] = None if item is None else read_number(item, f"{where}.{name}")
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
    entry = mapping(raw, "tensorrt")
    check_keys(entry, _TRT_KEYS, "tensorrt")
    return TensorRTOptions(
        enabled=read_bool(entry.get("enabled", True), "tensorrt.enabled"),
        workspace_bytes=read_int(entry.get("workspace_mib", 1024), "tensorrt.workspace_mib", 1)
        << 20,
        hardware_compatibility=read_enum(
            entry.get("hardware_compatibility", "none"),
            HardwareCompatibility,
            "tensorrt.hardware_compatibility",
        ),
    )


def _partial(raw: object) -> PartialQuantizationSpec:
    table = mapping(raw, "partial_quantization")
    check_keys(table, _PARTIAL_KEYS, "partial_quantization")
    base = PartialQuantizationSpec()
    return PartialQuantizationSpec(
        enabled=read_bool(table.get("enabled", base.enabled), "partial_quantization.enabled"),
        node_budget=read_int(
            table.get("node_budget", base.node_budget), "partial_quantization.node_budget", 0
        ),
        max_groups=read_int(
            table.get("max_groups", base.max_groups), "partial_quantization.max_groups", 1
        ),
    )
