"""Build specs from YAML and TOML, and the errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.artifacts.build_info import CalibrationMethod
from graylane.artifacts.naming import Precision, SemVer
from graylane.builder.spec import (
    DemoSource,
    FileSource,
    Generator,
    GeneratorData,
    NpzData,
    SpecError,
    load_spec,
    parse_spec,
)

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
        (_base(precisions=["q4_1"]), "precisions[0]: 'q4_1' is what an engine server loads"),
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
