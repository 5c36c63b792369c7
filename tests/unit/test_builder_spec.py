"""Build specs from YAML and TOML (ONNX sources and engine-served versions), and the
errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.artifacts.build_info import CalibrationMethod
from graylane.artifacts.naming import Backend, Precision, SemVer
from graylane.builder.spec import (
    DEFAULT_PRECISIONS,
    ONNX_PRECISIONS,
    BuildSpec,
    DemoSource,
    EndpointVariantSpec,
    EngineSpec,
    FileSource,
    Generator,
    GeneratorData,
    GgufSource,
    NpzData,
    RoundingSpec,
    SensitiveLayersSpec,
    SmoothingSpec,
    SpecError,
    WeightOnlySpec,
    load_spec,
    parse_spec,
)
from graylane.engine.server import DEFAULT_SLOTS

REPO = Path(__file__).resolve().parents[2]

YAML = """
model: demo-gpt
version: 1.2.3-rc.1
source: models/demo.onnx
strategy: ptq
precisions: [fp16, int8]
profiles:
  - name: short
    shapes:
      input_ids: {min: [1, 1], opt: [4, 16], max: [8, 32]}
calibration: {npz: calib.npz, samples: 16, method: percentile, percentile: 99.9}
validation: {generator: demo-text, samples: 8, seed: 3, generation: {prompts: 2, new_tokens: 4}}
tolerances:
  int8: {min_cosine: 0.9}
store: out/artifacts
"""

TOML = """
model = "demo-gpt"
version = "1.0.0"
source = { demo = "tiny", seed = 2 }
precisions = ["fp32", "int8-dynamic"]

[validation]
generator = "random"
samples = 4
int_high = 10
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_spec_reads_every_section(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, "spec.yaml", YAML))
    assert spec.version == SemVer(1, 2, 3, ("rc", "1"))
    assert spec.source == FileSource(tmp_path / "models" / "demo.onnx")
    # fp32 is always built: it is the reference.
    assert spec.precisions == (Precision.FP32, Precision.FP16, Precision.INT8)
    assert spec.profiles[0].for_input("input_ids") is not None
    assert spec.calibration is not None
    assert spec.calibration.source == NpzData(tmp_path / "calib.npz")
    assert spec.calibration_method is CalibrationMethod.PERCENTILE
    assert spec.calibration_percentile == 99.9
    assert spec.validation is not None and spec.validation.seed == 3
    assert spec.generation is not None and spec.generation.new_tokens == 4
    assert spec.tolerance_for(Precision.INT8).min_cosine == 0.9
    # untouched limits keep their defaults
    assert spec.tolerance_for(Precision.INT8).min_top1_agreement is not None
    assert spec.store == tmp_path / "out" / "artifacts"


def test_toml_spec(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, "spec.toml", TOML))
    assert spec.source == DemoSource(size="tiny", seed=2)
    assert spec.strategy == "default"
    assert spec.calibration_method is CalibrationMethod.ENTROPY
    assert spec.validation is not None
    assert spec.validation.source == GeneratorData(Generator.RANDOM, int_high=10)


def test_example_spec_loads() -> None:
    spec = load_spec(REPO / "builder" / "examples" / "demo-gpt.yaml")
    assert spec.model == "demo-gpt"
    assert len(spec.profiles) == 2


def _base(**overrides: object) -> dict[str, object]:
    raw: dict[str, object] = {"model": "m", "version": "1.0.0", "source": "m.onnx"}
    raw.update(overrides)
    return raw


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"version": "1.0.0", "source": "m.onnx"}, "model: required"),
        (_base(version="1.0"), "version: '1.0' is not a semantic version"),
        (_base(model="Demo GPT"), "model: model name 'Demo GPT' is not valid"),
        (_base(precission=["fp16"]), "unknown key(s) ['precission']"),
        (_base(precisions=["int3"]), "precisions[0]: 'int3' is not one of"),
        (_base(precisions=["q4_1"]), "precisions[0]: 'q4_1' is not one of ['fp32'"),
        (_base(precisions=["int8"]), "int8 precision needs calibration data"),
        (_base(strategy="my-ptq"), "strategy: strategy tag"),
        (
            _base(profiles=[{"shapes": {"x": {"min": [1, 8], "opt": [1, 4], "max": [1, 16]}}}]),
            "need min <= opt <= max",
        ),
        (
            _base(profiles=[{"shapes": {"x": {"min": [1], "opt": [1, 4], "max": [1, 16]}}}]),
            "same rank",
        ),
        (_base(calibration={"samples": 4}), "exactly one of 'npz: FILE'"),
        (_base(calibration={"generator": "lorem", "samples": 4}), "'lorem' is not one of"),
        (_base(calibration={"generator": "demo-text", "samples": 0}), "samples: must be >= 1"),
        (_base(calibration={"npz": "x.csv", "samples": 2}), "expected a .npz file"),
        (_base(tolerances={"fp16": {"min_cosine": 2}}), "between 0 and 1"),
        (_base(tolerances={"fp16": {"cosine": 0.9}}), "unknown key(s) ['cosine']"),
        (_base(source={"demo": "huge"}), "use 'tiny' or 'small'"),
        (_base(force="yes"), "force: must be true or false"),
        (_base(tensorrt={"hardware_compatibility": "all"}), "'all' is not one of"),
    ],
)
def test_spec_errors_say_what_to_fix(raw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(raw, base_dir=Path("/tmp"))
    assert message in str(info.value)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(_write(tmp_path, "bad.yaml", "model: [unclosed"))
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(_write(tmp_path, "bad.toml", "model = "))
    with pytest.raises(SpecError, match=r"use a \.yaml"):
        load_spec(_write(tmp_path, "spec.json", "{}"))
    with pytest.raises(SpecError, match="top level must be a mapping"):
        load_spec(_write(tmp_path, "list.yaml", "- a\n- b\n"))


def test_an_onnx_spec_builds_only_the_onnx_precisions() -> None:
    spec = parse_spec(_base(), base_dir=Path("/tmp"))
    assert isinstance(spec, BuildSpec)
    # Regression: the default was every Precision, engine servers' GGUF types included.
    assert spec.precisions == (Precision.FP32, Precision.FP16, Precision.INT8_DYNAMIC)
    assert set(ONNX_PRECISIONS) == {
        Precision.FP32,
        Precision.FP16,
        Precision.INT8,
        Precision.INT8_DYNAMIC,
        Precision.INT8_WEIGHT_ONLY,
        Precision.INT4,
    }
    # The weight-only rungs are built when a spec lists them, never by default.
    assert set(DEFAULT_PRECISIONS) < set(ONNX_PRECISIONS)
    with pytest.raises(SpecError, match=r"tolerances: 'q4_1' is not one of"):
        parse_spec(_base(tolerances={"q4_1": {"min_cosine": 0.9}}), base_dir=Path("/tmp"))


# -- engine specs: a version engine servers serve ---------------------------------------------

ENGINE_YAML = """
model: smollm2
version: 1.0.0
engine:
  backend: llamacpp
  version: "0.3.36"
  variants:
    - precision: q4_1
      url: http://127.0.0.1:8081/
      model_file: models/SmolLM2-135M-Instruct.Q4_1.gguf
      slots: 8
    - precision: q2_k
      url: http://127.0.0.1:8082
      model_sha256: ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789
      served_model: smol-q2
store: artifacts
"""

ENGINE_TOML = """
model = "m"
version = "2.0.0"

[engine]
backend = "trtllm"
version = "1.0.0"
probe = true

[[engine.variants]]
precision = "fp16"
url = "http://engine-fp16:8000"

[[engine.variants]]
precision = "fp8"
url = "http://engine-fp8:8000"
"""


def test_engine_spec_reads_the_endpoints_best_first(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, "smollm2.yaml", ENGINE_YAML))
    assert isinstance(spec, EngineSpec)
    assert (spec.model, spec.version, spec.store) == (
        "smollm2",
        SemVer(1, 0, 0),
        tmp_path / "artifacts",
    )
    engine = spec.engine
    assert (engine.backend, engine.version, engine.strategy) == (Backend.LLAMACPP, "0.3.36", "gguf")
    assert engine.ladder == ("q4_1", "q2_k")
    assert not engine.probe
    first, second = engine.variants
    assert first == EndpointVariantSpec(
        precision=Precision.Q4_1,
        url="http://127.0.0.1:8081",  # without its trailing slash
        model_file=tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
        slots=8,
    )
    assert second.model_file is None
    assert second.model_sha256 == "abcdef0123456789" * 4  # lowercased
    assert (second.served_model, second.slots) == ("smol-q2", DEFAULT_SLOTS)


def test_engine_spec_in_toml_with_the_default_strategy(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, "m.toml", ENGINE_TOML))
    assert isinstance(spec, EngineSpec)
    assert (spec.engine.backend, spec.engine.strategy, spec.engine.probe) == (
        Backend.TRTLLM,
        "default",
        True,
    )
    assert spec.engine.ladder == ("fp16", "fp8")


def _engine(variants: object = None, **overrides: object) -> dict[str, object]:
    engine: dict[str, object] = {
        "backend": "llamacpp",
        "version": "0.3.36",
        "variants": variants
        if variants is not None
        else [{"precision": "q4_1", "url": "http://127.0.0.1:8081"}],
    }
    engine.update(overrides)
    return {"model": "smollm2", "version": "1.0.0", "engine": engine}


_URL = "http://127.0.0.1:8081"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {**_engine(), "source": "m.onnx"},
            "engine: an engine-served version is not built from an ONNX file, so it takes no "
            "['source']",
        ),
        ({**_engine(), "precisions": ["fp32"], "profiles": []}, "['precisions', 'profiles']"),
        ({**_engine(), "strategy": "gguf"}, "engine.strategy"),
        ({**_engine(), "engin": {}}, "spec: unknown key(s) ['engin']"),
        ({"model": "m", "version": "1.0.0", "engine": None}, "engine: must be a mapping"),
        (_engine(backend="onnxruntime"), "engine.backend: 'onnxruntime' is not an engine server"),
        (_engine(backend="ollama"), "engine.backend: 'ollama' is not one of"),
        (_engine(backend=None), "engine.backend: required"),
        (_engine(version=None), "engine.version: required"),
        (_engine(version=0.5), "engine.version: give the engine's version as a quoted string"),
        (_engine(version="b4567"), "engine.version: backend version 'b4567' is not valid"),
        (_engine(strategy="q-4"), "engine.strategy: strategy tag"),
        (_engine(probe="yes"), "engine.probe: must be true or false"),
        (_engine(port=8081), "engine: unknown key(s) ['port']"),
        (_engine([]), "engine.variants: give a non-empty list"),
        (_engine("http://127.0.0.1:8081"), "engine.variants: give a non-empty list"),
        (_engine([{"url": _URL}]), "engine.variants[0].precision: required"),
        (_engine([{"precision": "q4_1"}]), "engine.variants[0].url: required"),
        (
            _engine([{"precision": "fp16", "url": _URL}]),
            "engine.variants[0].precision: 'fp16' is not one of",  # llama.cpp says f16
        ),
        (
            _engine([{"precision": "q4_1", "url": _URL}], backend="trtllm", version="1.0.0"),
            "engine.variants[0].precision: 'q4_1' is not one of",
        ),
        (
            _engine([{"precision": "int8-dynamic", "url": _URL}], backend="vllm"),
            "'int8-dynamic' is not one of",
        ),
        (_engine([{"precision": "q4_1", "url": "127.0.0.1:8081"}]), "engine.variants[0].url:"),
        (_engine([{"precision": "q4_1", "url": 8081}]), "engine.variants[0].url: must be a string"),
        (
            _engine([{"precision": "q4_1", "url": "http://h:8081/?key=1"}]),
            "must not carry a query",
        ),
        (
            _engine([{"precision": "q4_1", "url": _URL, "slots": 0}]),
            "engine.variants[0].slots: must be >= 1",
        ),
        (
            _engine([{"precision": "q4_1", "url": _URL, "model_sha256": "abc"}]),
            "engine.variants[0].model_sha256: give 64 hex digits",
        ),
        (
            _engine([{"precision": "q4_1", "url": _URL, "served_model": 3}]),
            "engine.variants[0].served_model: must be a string",
        ),
        (
            _engine([{"precision": "q4_1", "url": _URL, "model_file": ""}]),
            "engine.variants[0].model_file: must be a path string",
        ),
        (
            _engine([{"precision": "q4_1", "url": _URL, "gpu": 0}]),
            "engine.variants[0]: unknown key(s) ['gpu']",
        ),
        (_engine(["q4_1"]), "engine.variants[0]: must be a mapping"),
        (
            _engine(
                [
                    {"precision": "q4_1", "url": _URL},
                    {"precision": "q4_1", "url": "http://127.0.0.1:8082"},
                ]
            ),
            "engine.variants[1]: the same precision as engine.variants[0]",
        ),
        (
            _engine([{"precision": "q4_1", "url": _URL}, {"precision": "q2_k", "url": _URL}]),
            "engine.variants[1]: the same endpoint as engine.variants[0]",
        ),
        ({**_engine(), "model": "Smol LM"}, "model: model name 'Smol LM' is not valid"),
        ({**_engine(), "version": "1.0"}, "version: '1.0' is not a semantic version"),
    ],
)
def test_engine_spec_errors_name_the_key(raw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(raw, base_dir=Path("/tmp"))
    assert message in str(info.value)


def test_two_adapters_on_one_engine_are_two_variants() -> None:
    spec = parse_spec(
        _engine(
            [
                {"precision": "fp16", "url": _URL, "served_model": "base"},
                {"precision": "fp8", "url": _URL, "served_model": "base-fp8-adapter"},
            ],
            backend="vllm",
            version="0.11.0",
        ),
        base_dir=Path("/tmp"),
    )
    assert isinstance(spec, EngineSpec)
    assert [v.served_model for v in spec.engine.variants] == ["base", "base-fp8-adapter"]


def test_a_spec_without_source_or_engine_says_both() -> None:
    with pytest.raises(SpecError, match=r"source: required, but missing .*'engine' section"):
        parse_spec({"model": "m", "version": "1.0.0"}, base_dir=Path("/tmp"))


# -- GGUF sources, prompt files, weight-only rungs --------------------------------------------


def test_a_gguf_source_brings_its_tokenizer_and_prompts_validate_on_text(tmp_path: Path) -> None:
    prompts = _write(tmp_path, "prompts.txt", "# comment\nWhat is a canary?\n\nHello there\n")
    spec = parse_spec(
        _base(
            source={"gguf": "m.gguf"},
            precisions=["fp32", "int8-weight-only", "int4"],
            validation={"prompts": "prompts.txt"},
            weight_only={"block_size": 64, "keep_float": ["layers.0."]},
            partial_quantization={"time_budget_s": 120, "max_trials": 5},
        ),
        base_dir=tmp_path,
    )
    assert isinstance(spec, BuildSpec)
    assert spec.source == GgufSource(tmp_path / "m.gguf")
    assert spec.precisions == (Precision.FP32, Precision.INT8_WEIGHT_ONLY, Precision.INT4)
    assert spec.validation is not None
    assert spec.validation.samples == 2  # every prompt of the file, comments aside
    source = spec.validation.source
    assert isinstance(source, GeneratorData)
    assert source.generator is Generator.PROMPTS and source.prompts == prompts
    assert spec.weight_only.block_size == 64 and spec.weight_only.keep_float == ("layers.0.",)
    assert spec.partial_quantization.time_budget_s == 120
    assert spec.partial_quantization.max_trials == 5
    # A plain path ending in .gguf is a GGUF source too.
    plain = parse_spec(_base(source="m.gguf"), base_dir=tmp_path)
    assert isinstance(plain, BuildSpec) and isinstance(plain.source, GgufSource)


def test_the_8_bit_rung_takes_its_smoothing_and_its_own_float_layers(tmp_path: Path) -> None:
    calibration = _write(tmp_path, "calib.txt", "# fitted on\nA sentence.\nAnother one.\n")
    spec = parse_spec(
        _base(
            source={"gguf": "m.gguf"},
            precisions=["fp32", "int8-weight-only"],
            weight_only={
                "int8_smoothing": {"alpha": 0.75, "prompts": "calib.txt"},
                "int8_keep_float": ["layers.0.", "layers.29."],
                "int8_sensitive_layers": {"count": 4, "prompts": "calib.txt"},
                "int8_rounding": {
                    "method": "gptq",
                    "prompts": "calib.txt",
                    "continuation": 8,
                    "act_order": True,
                },
                "int4_source_grid": True,
                "int4_accuracy_level": 1,
            },
        ),
        base_dir=tmp_path,
    )
    assert isinstance(spec, BuildSpec)
    assert spec.weight_only.int8_smoothing == SmoothingSpec(alpha=0.75, prompts=calibration)
    assert spec.weight_only.int8_keep_float == ("layers.0.", "layers.29.")
    assert spec.weight_only.int8_sensitive_layers == SensitiveLayersSpec(
        count=4, prompts=calibration
    )
    assert spec.weight_only.int8_rounding == RoundingSpec(
        method="gptq", prompts=calibration, continuation=8, act_order=True
    )
    assert spec.weight_only.keep_float == ()  # the int4 rung keeps only the head in float
    assert spec.weight_only.int4_source_grid and spec.weight_only.int4_accuracy_level == 1
    assert spec.weight_only.accuracy_level == 4
    base = _base_weight_only(tmp_path)
    assert base.int8_smoothing is None and not base.int4_source_grid
    assert base.int8_sensitive_layers is None
    assert base.int4_accuracy_level is None
    assert base.int8_rounding is None  # round to nearest
    rtn = parse_spec(_base(weight_only={"int8_rounding": "rtn"}), base_dir=tmp_path)
    assert isinstance(rtn, BuildSpec) and rtn.weight_only.int8_rounding is None


def _base_weight_only(tmp_path: Path) -> WeightOnlySpec:
    spec = parse_spec(_base(), base_dir=tmp_path)
    assert isinstance(spec, BuildSpec)
    return spec.weight_only


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"weight_only": {"int8_smoothing": {"alpha": 1.5, "prompts": "p.txt"}}}, "between 0"),
        ({"weight_only": {"int8_smoothing": {"alpha": 0.5}}}, "prompts"),
        ({"weight_only": {"int8_smoothing": {"prompts": "nope.txt"}}}, "does not exist"),
        ({"weight_only": {"int8_keep_float": "layers.0."}}, "list of node name prefixes"),
        (
            {"weight_only": {"int8_sensitive_layers": {"count": 0, "prompts": "p.txt"}}},
            "int8_sensitive_layers.count: must be >= 1",
        ),
        ({"weight_only": {"int8_sensitive_layers": {"count": 3}}}, "prompts"),
        ({"weight_only": {"int4_accuracy_level": 9}}, "int4_accuracy_level: one of 0 to 4"),
        ({"weight_only": {"int8_rounding": {"method": "awq", "prompts": "p.txt"}}}, "gptq"),
        ({"weight_only": {"int8_rounding": {"method": "gptq"}}}, "prompts"),
        ({"source": {"gguf": "m.gguf"}, "tokenizer": "t.json"}, "brings its own tokenizer"),
        ({"validation": {"prompts": "missing.txt"}}, "does not exist"),
        ({"validation": {"prompts": "p.txt"}}, "encodes with the model's tokenizer"),
        ({"weight_only": {"block_size": 48}}, "power of two"),
        ({"weight_only": {"accuracy_level": 7}}, "one of 0 to 4"),
        ({"weight_only": {"keep_float": "layers.0."}}, "list of node name prefixes"),
        ({"source": {"gguf": "m.gguf", "path": "x.onnx"}}, "the GGUF file alone"),
    ],
)
def test_gguf_and_weight_only_mistakes_name_the_key(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    _write(tmp_path, "p.txt", "a prompt\n")
    with pytest.raises(SpecError, match=message):
        parse_spec(_base(**overrides), base_dir=tmp_path)
