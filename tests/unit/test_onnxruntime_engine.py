from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graylane.engine.errors import (
    BadDtype,
    BadShape,
    EngineClosedError,
    EngineError,
    EngineLoadError,
    EngineRunError,
    IncompatibleEngineError,
    InvalidInputError,
    MissingInput,
    UnexpectedInput,
)
from graylane.engine.onnxruntime import OnnxRuntimeEngine, default_providers
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import TensorSpec
from graylane.errors import ErrorCode
from graylane.models.byte_vocab import VOCAB_SIZE
from graylane.models.demo_gpt import build_demo_gpt, write_demo_gpt


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("models") / "demo-tiny.onnx", "tiny", seed=1)


@pytest.fixture(scope="module")
def engine(tiny_path: Path) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine.load(tiny_path, "fp32", intra_op_threads=2)


def feeds(ids: list[list[int]]) -> dict[str, np.ndarray]:
    arr = np.array(ids, dtype=np.int64)
    return {"input_ids": arr, "attention_mask": np.ones_like(arr)}


def test_engine_satisfies_the_protocol_and_names_itself(engine: OnnxRuntimeEngine) -> None:
    assert isinstance(engine, InferenceEngine)
    assert engine.name == "demo-tiny"
    assert engine.variant == "fp32"
    assert engine.providers == ("CPUExecutionProvider",)
    assert default_providers()[-1] == "CPUExecutionProvider"


def test_io_signature_reports_dtypes_and_dynamic_axes(engine: OnnxRuntimeEngine) -> None:
    assert engine.io.input_names == ("input_ids", "attention_mask")
    assert engine.io.input("input_ids") == TensorSpec(
        name="input_ids", dtype=np.dtype(np.int64), shape=("batch", "seq")
    )
    logits = engine.io.output("logits")
    assert logits.dtype == np.float32
    assert logits.shape == ("batch", "seq", VOCAB_SIZE)
    assert logits.is_dynamic(0)
    assert not logits.is_dynamic(2)


def test_run_returns_every_output(engine: OnnxRuntimeEngine) -> None:
    out = engine.run(feeds([[1, 2, 3], [4, 5, 6]]))
    assert set(out) == {"logits"}
    assert out["logits"].shape == (2, 3, VOCAB_SIZE)
    assert np.isfinite(out["logits"]).all()


def test_load_from_bytes_matches_load_from_path(engine: OnnxRuntimeEngine) -> None:
    other = OnnxRuntimeEngine.load(
        build_demo_gpt("tiny", seed=1).SerializeToString(), "fp32", intra_op_threads=1
    )
    assert other.name == "graylane_demo_gpt_tiny"
    f = feeds([[7, 8, 9, 10]])
    np.testing.assert_allclose(other.run(f)["logits"], engine.run(f)["logits"], atol=1e-5)


@pytest.mark.parametrize(
    ("bad", "error", "code"),
    [
        ({"input_ids": np.zeros((1, 3), dtype=np.int64)}, MissingInput, ErrorCode.MISSING_INPUT),
        ({**feeds([[1, 2]]), "extra": np.zeros(1)}, UnexpectedInput, ErrorCode.UNEXPECTED_INPUT),
        (
            {
                "input_ids": np.zeros((1, 3), dtype=np.int32),
                "attention_mask": np.ones((1, 3), "i8"),
            },
            BadDtype,
            ErrorCode.BAD_DTYPE,
        ),
        (
            {"input_ids": np.zeros((3,), dtype=np.int64), "attention_mask": np.ones((3,), "i8")},
            BadShape,
            ErrorCode.BAD_SHAPE,
        ),
    ],
    ids=["missing", "extra", "dtype", "rank"],
)
def test_bad_feeds_raise_typed_invalid_input(
    engine: OnnxRuntimeEngine,
    bad: dict[str, np.ndarray],
    error: type[InvalidInputError],
    code: ErrorCode,
) -> None:
    with pytest.raises(error) as info:
        engine.run(bad)
    assert isinstance(info.value, InvalidInputError)
    assert info.value.code is code
    assert not info.value.retriable
    assert isinstance(info.value, ValueError)


def test_named_axes_must_agree_across_inputs(engine: OnnxRuntimeEngine) -> None:
    ids = np.zeros((1, 3), dtype=np.int64)
    with pytest.raises(BadShape, match="seq"):
        engine.run({"input_ids": ids, "attention_mask": np.ones((1, 4), dtype=np.int64)})


def test_runtime_failures_are_engine_errors(engine: OnnxRuntimeEngine) -> None:
    too_long = np.zeros((1, 300), dtype=np.int64)  # past the position table
    with pytest.raises(EngineError):
        engine.run({"input_ids": too_long, "attention_mask": np.ones_like(too_long)})
    out_of_vocab = np.full((1, 2), VOCAB_SIZE, dtype=np.int64)
    with pytest.raises(InvalidInputError):
        engine.run({"input_ids": out_of_vocab, "attention_mask": np.ones_like(out_of_vocab)})


def test_load_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(EngineLoadError):
        OnnxRuntimeEngine.load(tmp_path / "missing.onnx", "fp32")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(EngineLoadError):
        OnnxRuntimeEngine.load(junk, "fp32")
    with pytest.raises(EngineLoadError):
        OnnxRuntimeEngine.load(junk, "fp32", intra_op_threads=0)


def test_closed_engine_refuses_to_run(tiny_path: Path) -> None:
    eng = OnnxRuntimeEngine.load(tiny_path, "fp32", intra_op_threads=1)
    eng.close()
    with pytest.raises(EngineClosedError):
        eng.run(feeds([[1]]))


def test_error_families_carry_retry_policy() -> None:
    assert issubclass(EngineLoadError, EngineError)
    assert issubclass(IncompatibleEngineError, EngineLoadError)
    assert issubclass(EngineError, RuntimeError)
    assert EngineRunError.retriable
    assert not EngineLoadError.retriable
    assert not IncompatibleEngineError.retriable


def test_one_incompatible_engine_error_for_manifests_and_engines() -> None:
    from graylane.artifacts import compatibility
    from graylane.engine import tensorrt

    assert tensorrt.IncompatibleEngineError is IncompatibleEngineError
    assert issubclass(compatibility.NoCompatibleEngineError, IncompatibleEngineError)


def test_signature_from_onnx_equals_the_loaded_engines(
    engine: OnnxRuntimeEngine, tiny_path: Path
) -> None:
    import onnx

    from graylane.engine.signature import IOSignature

    from_file = IOSignature.from_onnx(onnx.load(str(tiny_path), load_external_data=False))
    assert from_file == engine.io
    assert IOSignature.from_dict(from_file.to_dict()) == from_file
    assert from_file.to_dict()["inputs"][0] == {
        "name": "input_ids",
        "dtype": "int64",
        "shape": ["batch", "seq"],
    }
    assert TensorSpec("x", "float32", (None, 3)) == TensorSpec(
        name="x", dtype=np.dtype(np.float32), shape=(None, 3)
    )


def test_tensor_decoding_errors_carry_their_code() -> None:
    from graylane import serde
    from graylane.errors import TensorError
    from graylane.v1 import tensor_pb2

    short = tensor_pb2.Tensor(name="x", dtype=tensor_pb2.FLOAT32, shape=[2], data=b"1234")
    with pytest.raises(BadShape) as shape_info:
        serde.from_tensor(short)
    assert isinstance(shape_info.value, TensorError)
    assert shape_info.value.code is ErrorCode.BAD_SHAPE
    unknown = tensor_pb2.Tensor(name="x", dtype=99, shape=[1], data=b"1")  # type: ignore[arg-type]
    with pytest.raises(BadDtype) as dtype_info:
        serde.from_tensor(unknown)
    assert dtype_info.value.code is ErrorCode.BAD_DTYPE


def test_builder_validation_runs_the_workers_adapter(tiny_path: Path) -> None:
    from graylane.builder.runtime import VariantLoadError, open_runner

    runner = open_runner(tiny_path, threads=1)
    assert isinstance(runner.engine, OnnxRuntimeEngine)  # one adapter, one session setup
    f = feeds([[4, 5, 6]])
    reference = OnnxRuntimeEngine.load(tiny_path, "fp32", intra_op_threads=1)
    np.testing.assert_array_equal(runner(f)["logits"], reference.run(f)["logits"])
    with pytest.raises(VariantLoadError):
        runner({"input_ids": f["input_ids"]})  # the worker's feed checks apply too
