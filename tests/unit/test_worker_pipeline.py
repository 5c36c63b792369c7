"""The worker's pure stages (validation, results) and its fault-injecting engine wrapper."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graylane.engine.errors import EngineRunError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.backend import BatchClock, ResultContext
from graylane.engine_worker.compute import engine_rejection, run_batch
from graylane.engine_worker.faults import FaultInjection, FaultyEngine, InjectedFault, with_faults
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.requests import (
    DemoByteTokenizer,
    IntakeRules,
    Job,
    Limits,
    TaskKind,
    WorkItem,
    detect_tokenizer,
    request_facts,
    validate,
)
from graylane.engine_worker.wire import build_batch
from graylane.errors import ErrorCode, Rejection
from graylane.kafka.seam import Record
from graylane.models.byte_vocab import decode_tokens
from graylane.models.demo_gpt import write_demo_gpt
from graylane.v1 import inference_pb2, tensor_pb2

POLICY = BucketPolicy(buckets=(8, 16, 32), max_batch_size=4)
LIMITS = Limits(max_seq_len=32, max_new_tokens=8)


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory) -> OnnxRuntimeEngine:
    path = write_demo_gpt(tmp_path_factory.mktemp("m") / "demo-tiny.onnx", "tiny", seed=3)
    return OnnxRuntimeEngine.load(path, "fp32", name="demo", intra_op_threads=1)


@pytest.fixture(scope="module")
def plain_token_model(tmp_path_factory: pytest.TempPathFactory) -> OnnxRuntimeEngine:
    """A token model without tokenizer metadata: logits = one-hot-ish embedding of the ids."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 4])
    table = helper.make_tensor("table", TensorProto.FLOAT, [4, 4], np.eye(4).ravel().tolist())
    node = helper.make_node("Gather", ["table", "input_ids"], ["logits"])
    graph = helper.make_graph([node], "plain", [ids], [logits], initializer=[table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path_factory.mktemp("m") / "plain.onnx"
    onnx.save(model, str(path))
    return OnnxRuntimeEngine.load(path, "fp32", name="plain", intra_op_threads=1)


def rules(engine: OnnxRuntimeEngine, tokenizer: DemoByteTokenizer | None) -> IntakeRules:
    return IntakeRules(
        model="demo", max_request_bytes=1 << 20, io=engine.io, limits=LIMITS, tokenizer=tokenizer
    )


def generate(prompt: str, request_id: str = "r1") -> inference_pb2.InferenceRequest:
    return inference_pb2.InferenceRequest(
        request_id=request_id,
        model="demo",
        prompt=prompt,
        task=inference_pb2.GENERATE,
        generation=inference_pb2.GenerationParams(max_new_tokens=3),
    )


def job_of(request: inference_pb2.InferenceRequest, item: WorkItem) -> Job:
    """A job as the worker carries it, its record standing at the item's position."""
    record = Record("t", 0, item.index, 0, 0, None, b"", None, 0, 0, ())
    return Job(record, request, item)


# --- intake ------------------------------------------------------------------------------


def test_tensor_errors_become_their_typed_codes_not_message_matches() -> None:
    unknown_dtype = tensor_pb2.Tensor(name="input_ids", dtype=99, shape=[1], data=b"x")  # type: ignore[arg-type]
    short = tensor_pb2.Tensor(name="input_ids", dtype=tensor_pb2.INT64, shape=[1, 2], data=b"1")
    twice = tensor_pb2.Tensor(name="input_ids", dtype=tensor_pb2.INT64, shape=[0], data=b"")
    cases = {
        ErrorCode.BAD_DTYPE: [unknown_dtype],
        ErrorCode.BAD_SHAPE: [short],
    }
    for code, inputs in cases.items():
        facts = request_facts(inference_pb2.InferenceRequest(request_id="r", inputs=inputs))
        assert isinstance(facts, Rejection) and facts.code is code, facts
    duplicate = request_facts(inference_pb2.InferenceRequest(request_id="r", inputs=[twice, twice]))
    assert isinstance(duplicate, Rejection) and duplicate.code is ErrorCode.BAD_SHAPE


def test_validate_answers_wrong_model_size_and_missing_input(gpt: OnnxRuntimeEngine) -> None:
    r = rules(gpt, None)
    wrong = validate(inference_pb2.InferenceRequest(request_id="r", model="x"), 10, 0, r, 0)
    assert isinstance(wrong, Rejection) and wrong.code == inference_pb2.UNKNOWN_MODEL
    big = validate(generate("hi"), (1 << 20) + 1, 0, r, 0)
    assert isinstance(big, Rejection) and big.code == inference_pb2.PAYLOAD_TOO_LARGE
    empty = validate(inference_pb2.InferenceRequest(request_id="r", model="demo"), 10, 0, r, 0)
    assert isinstance(empty, Rejection) and empty.code == inference_pb2.MISSING_INPUT
    ok = validate(generate("hi"), 10, 5, r, 0)
    assert isinstance(ok, WorkItem) and ok.index == 5 and ok.task is TaskKind.GENERATE


def test_prompt_uses_the_tokenizer_when_there_is_one() -> None:
    class Reversed(DemoByteTokenizer):
        def encode(self, text: str) -> tuple[int, ...]:
            return tuple(reversed(super().encode(text)))

    facts = request_facts(generate("ab"), Reversed())
    assert not isinstance(facts, Rejection)
    assert tuple(facts.token_ids) == (ord("b"), ord("a")) and facts.prompt is None
    fallback = request_facts(generate("ab"), None)  # the contract's byte-level prompt
    assert not isinstance(fallback, Rejection) and fallback.prompt == "ab"


# --- tokenizer and results ------------------------------------------------------------------


def test_tokenizer_comes_from_model_metadata_only(
    gpt: OnnxRuntimeEngine, plain_token_model: OnnxRuntimeEngine
) -> None:
    assert isinstance(detect_tokenizer([gpt]), DemoByteTokenizer)
    assert detect_tokenizer([plain_token_model]) is None


def _generated(
    engine: OnnxRuntimeEngine, tokenizer: DemoByteTokenizer | None
) -> tuple[inference_pb2.InferenceResult, list[int]]:
    request = generate("hello")
    item = validate(request, 10, 0, rules(engine, tokenizer), 0)
    assert isinstance(item, WorkItem)
    run = run_batch(engine, [item], POLICY, LIMITS.max_seq_len)
    ctx = ResultContext(
        model="demo", version="v1", variant="fp32", worker_id="w", tokenizer=tokenizer
    )
    report = build_batch(
        [job_of(request, item)],
        run,
        None,
        ctx,
        BatchClock(dequeued_ms=1000, started_ms=1001, done_ms=1010),
        bucket_len=8,
        device_load=0.5,
    )
    (answer,) = report.answers
    assert answer.result is not None and answer.rejection is None
    assert report.telemetry.batch_size == 1 and report.telemetry.error_count == 0
    return answer.result, list(answer.result.generated_token_ids)


def test_results_carry_text_only_with_a_tokenizer(gpt: OnnxRuntimeEngine) -> None:
    with_text, tokens = _generated(gpt, DemoByteTokenizer())
    assert len(tokens) == 3
    assert with_text.text == decode_tokens(tokens)
    without, same_tokens = _generated(gpt, None)
    assert same_tokens == tokens  # same real inference, only the text differs
    assert without.text == ""


def test_a_failed_batch_answers_every_item_and_counts_errors(gpt: OnnxRuntimeEngine) -> None:
    requests = {i: generate("x", f"r{i}") for i in range(3)}
    items = [validate(r, 10, i, rules(gpt, None), 0) for i, r in requests.items()]
    assert all(isinstance(i, WorkItem) for i in items)
    failure = engine_rejection(InjectedFault("fault injected for testing"))
    assert failure.code == inference_pb2.INJECTED_FAULT
    from graylane.engine_worker.compute import BatchRun

    report = build_batch(
        [job_of(requests[i.index], i) for i in items if isinstance(i, WorkItem)],
        BatchRun({}, 0.0, 0),
        failure,
        ResultContext(model="demo", version="v1", variant="fp32", worker_id="w"),
        BatchClock(dequeued_ms=1000, started_ms=1001, done_ms=1010),
        bucket_len=8,
        device_load=0.0,
    )
    assert [a.rejection for a in report.answers] == [failure] * 3
    assert report.served == 0
    assert dict(report.telemetry.error_codes) == {"INJECTED_FAULT": 3}
    assert engine_rejection(EngineRunError("boom")).code == inference_pb2.ENGINE_FAILURE


# --- fault injection as an engine -------------------------------------------------------


def _feeds() -> dict[str, np.ndarray]:
    ids = np.array([[1, 2, 3]], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def test_faulty_engine_adds_latency_around_real_inference(gpt: OnnxRuntimeEngine) -> None:
    slept: list[float] = []
    import random

    faulty = FaultyEngine(
        gpt, FaultInjection(extra_latency_ms=40.0), random.Random(0), sleep=slept.append
    )
    assert faulty.io == gpt.io and faulty.name == gpt.name and faulty.variant == "fp32"
    np.testing.assert_array_equal(faulty.run(_feeds())["logits"], gpt.run(_feeds())["logits"])
    assert slept == [pytest.approx(0.040)]


def test_faulty_engine_fails_at_its_rate() -> None:
    import random

    class Never:
        name, variant = "n", "fp32"

        @property
        def io(self) -> object:
            raise AssertionError

        def run(self, feeds: object) -> dict[str, np.ndarray]:
            raise AssertionError("an injected failure must not reach the engine")

        def close(self) -> None:
            pass

    always = FaultyEngine(Never(), FaultInjection(error_rate=1.0), random.Random(0))  # type: ignore[arg-type]
    with pytest.raises(InjectedFault) as info:
        always.run({})
    assert info.value.retriable and info.value.code is ErrorCode.INJECTED_FAULT


def test_with_faults_wraps_only_when_active(gpt: OnnxRuntimeEngine) -> None:
    assert with_faults({"fp32": gpt}, FaultInjection())["fp32"] is gpt
    wrapped = with_faults({"fp32": gpt}, FaultInjection(error_rate=0.5, seed=1))["fp32"]
    assert isinstance(wrapped, FaultyEngine) and wrapped.inner is gpt


def test_fault_rates_are_seeded_and_per_call(gpt: OnnxRuntimeEngine) -> None:
    def outcomes(seed: int) -> list[bool]:
        engine = with_faults({"fp32": gpt}, FaultInjection(error_rate=0.3, seed=seed))["fp32"]
        seen = []
        for _ in range(200):
            try:
                engine.run(_feeds())
                seen.append(True)
            except InjectedFault:
                seen.append(False)
        return seen

    first = outcomes(7)
    assert first == outcomes(7)
    assert 0.2 < first.count(False) / len(first) < 0.4
