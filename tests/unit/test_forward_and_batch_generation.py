from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graylane import serde
from graylane.artifacts.model_info import ModelInfo
from graylane.engine.errors import InvalidInputError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.batch_generation import run_generate
from graylane.engine_worker.forward import run_forward
from graylane.engine_worker.kv_decode import FinishReason, GenerationResult
from graylane.engine_worker.layouts import token_layout
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.postprocess import MEAN_POOL, TOKEN_IDS, TOPK_IDS, TOPK_VALUES
from graylane.engine_worker.requests import IntakeRules, Limits, WorkItem, validate
from graylane.errors import ErrorCode, Rejection
from graylane.models.byte_vocab import BOS_ID, EOS_ID, PAD_ID, encode_text
from graylane.models.demo_gpt import build_demo_gpt
from graylane.serde import PostProcess
from graylane.v1 import inference_pb2
from tests.support.engines import DelegatingEngine

ATOL = 1e-4
POLICY = BucketPolicy(buckets=(8, 16, 32, 64), max_batch_size=3)


class CountingEngine(DelegatingEngine):
    """Delegates to a real engine and records the batch shapes it was given."""

    def __init__(self, inner: InferenceEngine) -> None:
        super().__init__(inner)
        self.batches: list[dict[str, tuple[int, ...]]] = []

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append({k: v.shape for k, v in feeds.items()})
        return self.inner.run(feeds)


@pytest.fixture(scope="module")
def gpt() -> OnnxRuntimeEngine:
    model = build_demo_gpt("tiny", seed=0).SerializeToString()
    return OnnxRuntimeEngine.load(model, "fp32", name="demo", intra_op_threads=2)


PROMPTS = [
    encode_text("Hi", add_bos=True),
    encode_text("The quick brown fox jumps", add_bos=True),
    [BOS_ID],
    encode_text("gray releases over kafka!", add_bos=True),
    encode_text("abc", add_bos=True),
]


def token_request(tokens: list[int]) -> dict[str, np.ndarray]:
    ids = np.array([tokens], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def intake(
    engine: InferenceEngine, feeds: dict[str, np.ndarray], vocab_size: int | None = None
) -> WorkItem | Rejection:
    """``feeds`` through the worker's intake (the one pass a request is checked by)."""
    request = inference_pb2.InferenceRequest(
        request_id="r", model="demo", inputs=serde.to_tensors(feeds)
    )
    rules = IntakeRules(
        model="demo",
        max_request_bytes=1 << 20,
        io=engine.io,
        limits=Limits(max_seq_len=POLICY.max_seq_len),
        model_info=ModelInfo(vocab_size=vocab_size, token_input="input_ids"),
    )
    return validate(request, request.ByteSize(), 0, rules, now_ms=0)


def alone(engine: InferenceEngine, tokens: list[int]) -> np.ndarray:
    return engine.run(token_request(tokens))["logits"]


def greedy_reference(engine: InferenceEngine, prompt: list[int], steps: int) -> list[int]:
    seq = list(prompt)
    for _ in range(steps):
        seq.append(int(alone(engine, seq)[0, -1].argmax()))
    return seq[len(prompt) :]


# --- forward, token models ------------------------------------------------------------


@pytest.mark.parametrize("policy", [None, POLICY], ids=["one-batch", "buckets"])
def test_batched_logits_equal_unbatched(
    gpt: OnnxRuntimeEngine, policy: BucketPolicy | None
) -> None:
    counting = CountingEngine(gpt)
    results = run_forward(counting, [token_request(p) for p in PROMPTS], policy=policy)
    assert len(counting.batches) < len(PROMPTS)
    for prompt, result in zip(PROMPTS, results, strict=True):
        expected = alone(gpt, prompt)
        assert result["logits"].shape == expected.shape
        np.testing.assert_allclose(result["logits"], expected, atol=ATOL)


def test_bucketed_batches_use_bucket_widths_and_cap_rows(gpt: OnnxRuntimeEngine) -> None:
    counting = CountingEngine(gpt)
    run_forward(counting, [token_request(p) for p in PROMPTS * 2], policy=POLICY)
    widths = {shape["input_ids"][1] for shape in counting.batches}
    assert widths <= set(POLICY.buckets)
    assert all(shape["input_ids"][0] <= POLICY.max_batch_size for shape in counting.batches)


def test_requests_with_own_padding_and_several_rows(gpt: OnnxRuntimeEngine) -> None:
    own = np.array([[BOS_ID, 70, 71, PAD_ID, PAD_ID], [BOS_ID, 72, 73, 74, 75]], dtype=np.int64)
    own_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=np.int64)
    requests = [
        {"input_ids": own, "attention_mask": own_mask},
        {"input_ids": np.array([PROMPTS[1]], dtype=np.int64)},  # mask omitted: all real
    ]
    results = run_forward(gpt, requests)
    np.testing.assert_allclose(results[0]["logits"], gpt.run(requests[0])["logits"], atol=ATOL)
    np.testing.assert_allclose(results[1]["logits"], alone(gpt, PROMPTS[1]), atol=ATOL)

    argmax = run_forward(gpt, requests, PostProcess.ARGMAX_LAST)
    assert argmax[0][TOKEN_IDS].tolist() == [
        int(alone(gpt, [BOS_ID, 70, 71])[0, -1].argmax()),
        int(alone(gpt, [BOS_ID, 72, 73, 74, 75])[0, -1].argmax()),
    ]


@pytest.mark.parametrize("policy", [None, POLICY], ids=["one-batch", "buckets"])
def test_post_processing_matches_unbatched(
    gpt: OnnxRuntimeEngine, policy: BucketPolicy | None
) -> None:
    requests = [token_request(p) for p in PROMPTS]
    argmax = run_forward(gpt, requests, PostProcess.ARGMAX_LAST, policy=policy)
    topk = run_forward(gpt, requests, PostProcess.TOPK_LAST, top_k=4, policy=policy)
    pooled = run_forward(gpt, requests, PostProcess.MEAN_POOL, policy=policy)
    for i, prompt in enumerate(PROMPTS):
        logits = alone(gpt, prompt)[0]
        last = logits[-1]
        assert argmax[i][TOKEN_IDS].tolist() == [int(last.argmax())]
        assert topk[i][TOPK_IDS][0].tolist() == np.argsort(-last)[:4].tolist()
        np.testing.assert_allclose(topk[i][TOPK_VALUES][0], np.sort(last)[::-1][:4], atol=ATOL)
        np.testing.assert_allclose(pooled[i][MEAN_POOL][0], logits.mean(axis=0), atol=ATOL)
        single = run_forward(gpt, [requests[i]], PostProcess.ARGMAX_LAST)
        assert single[0][TOKEN_IDS].tolist() == argmax[i][TOKEN_IDS].tolist()


def test_top_k_is_clipped_to_the_vocabulary(gpt: OnnxRuntimeEngine) -> None:
    out = run_forward(gpt, [token_request(PROMPTS[0])], PostProcess.TOPK_LAST, top_k=10_000)
    assert out[0][TOPK_IDS].shape == (1, 258)
    assert sorted(out[0][TOPK_IDS][0].tolist()) == list(range(258))
    assert np.all(np.diff(out[0][TOPK_VALUES][0]) <= 0)


def test_bad_token_requests_are_refused(gpt: OnnxRuntimeEngine) -> None:
    """The worker's intake refuses each with its code; the forward pass refuses it too."""

    def ids(array: np.ndarray) -> dict[str, np.ndarray]:
        return {"input_ids": array, "attention_mask": np.ones(array.shape, np.int64)}

    bad: list[tuple[ErrorCode, dict[str, np.ndarray]]] = [
        (ErrorCode.BAD_DTYPE, ids(np.array([[1, 2]], dtype=np.int32))),
        (ErrorCode.BAD_SHAPE, ids(np.array([1, 2], dtype=np.int64))),
        (ErrorCode.BAD_REQUEST, ids(np.array([[1, 999]], dtype=np.int64))),
        (
            ErrorCode.BAD_SHAPE,
            {"input_ids": np.ones((1, 2), np.int64), "attention_mask": np.ones((1, 3), np.int64)},
        ),
        (
            ErrorCode.UNEXPECTED_INPUT,
            {**ids(np.ones((1, 2), np.int64)), "token_type_ids": np.ones((1, 2), np.int64)},
        ),
        (ErrorCode.SEQUENCE_TOO_LONG, ids(np.ones((1, 65), np.int64))),  # past the largest bucket
    ]
    for code, feeds in bad:
        refused = intake(gpt, feeds, vocab_size=258)
        assert isinstance(refused, Rejection) and refused.code is code, (feeds, refused)
        with pytest.raises(InvalidInputError):
            run_forward(gpt, [token_request([1, 2]), feeds], policy=POLICY)
    assert isinstance(intake(gpt, token_request([1, 2, 3]), vocab_size=258), WorkItem)
    with pytest.raises(InvalidInputError):
        run_forward(gpt, [token_request([1])], PostProcess.TOPK_LAST, top_k=0)
    with pytest.raises(InvalidInputError):
        run_forward(gpt, [token_request([1])], output_name="hidden")


def test_empty_request_list_gives_empty_results(gpt: OnnxRuntimeEngine) -> None:
    assert run_forward(gpt, []) == []
    assert run_generate(gpt, [], 4, EOS_ID, 256) == []


# --- generation -------------------------------------------------------------------


@pytest.mark.parametrize("policy", [None, POLICY], ids=["one-batch", "buckets"])
def test_batched_generation_equals_one_at_a_time(
    gpt: OnnxRuntimeEngine, policy: BucketPolicy | None
) -> None:
    steps = 6
    batched = run_generate(gpt, PROMPTS, steps, None, 64, policy=policy)
    for prompt, result in zip(PROMPTS, batched, strict=True):
        assert result == GenerationResult(
            tuple(greedy_reference(gpt, prompt, steps)), FinishReason.LENGTH
        )
        assert run_generate(gpt, [prompt], steps, None, 64) == [result]


def test_rows_finish_independently_on_eos(gpt: OnnxRuntimeEngine) -> None:
    steps = 8
    a, b = PROMPTS[1], PROMPTS[3]
    ref_a, ref_b = greedy_reference(gpt, a, steps), greedy_reference(gpt, b, steps)
    # A token that row a emits after some steps and row b never emits.
    stop_at = next(
        i for i in range(1, steps) if ref_a[i] not in ref_b and ref_a[i] not in ref_a[:i]
    )
    eos = ref_a[stop_at]
    counting = CountingEngine(gpt)
    results = run_generate(counting, [a, b], steps, eos, 64)
    assert results[0] == GenerationResult(tuple(ref_a[:stop_at]), FinishReason.EOS)
    assert results[1] == GenerationResult(tuple(ref_b), FinishReason.LENGTH)
    rows_per_step = [shape["input_ids"][0] for shape in counting.batches]
    assert rows_per_step == [2] * (stop_at + 1) + [1] * (steps - stop_at - 1)


def test_per_row_limits_and_max_seq_len(gpt: OnnxRuntimeEngine) -> None:
    long_prompt = [BOS_ID] + [65] * 29  # 30 tokens
    results = run_generate(
        gpt, [PROMPTS[0], PROMPTS[4], long_prompt, [BOS_ID] * 32], [0, 3, 10, 5], None, 32
    )
    assert results[0] == GenerationResult((), FinishReason.LENGTH)
    assert results[1].finished_reason is FinishReason.LENGTH
    assert len(results[1].tokens) == 3
    assert results[2].finished_reason is FinishReason.MAX_SEQ
    assert results[2].tokens == tuple(greedy_reference(gpt, long_prompt, 2))
    assert results[3] == GenerationResult((), FinishReason.MAX_SEQ)


def test_generation_refuses_bad_arguments(gpt: OnnxRuntimeEngine) -> None:
    with pytest.raises(InvalidInputError):
        run_generate(gpt, [[]], 3, None, 32)
    with pytest.raises(InvalidInputError):
        run_generate(gpt, [[BOS_ID] * 40], 3, None, 32)
    with pytest.raises(InvalidInputError):
        run_generate(gpt, [[BOS_ID], [BOS_ID]], [1], None, 32)
    with pytest.raises(InvalidInputError):
        run_generate(gpt, [[BOS_ID, 300]], 1, None, 32)
    with pytest.raises(ValueError):
        run_generate(gpt, [[BOS_ID]], 1, None, 128, policy=POLICY)  # buckets end at 64


# --- other models -------------------------------------------------------------------


def _engine_from_graph(graph: onnx.GraphProto, name: str) -> OnnxRuntimeEngine:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return OnnxRuntimeEngine.load(model.SerializeToString(), "fp32", name=name, intra_op_threads=1)


@pytest.fixture(scope="module")
def linear() -> OnnxRuntimeEngine:
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [w, b],
    )
    return _engine_from_graph(graph, "linear")


def test_generic_model_concatenates_same_shaped_requests(linear: OnnxRuntimeEngine) -> None:
    rng = np.random.default_rng(0)
    requests = [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in (1, 2, 3)]
    counting = CountingEngine(linear)
    results = run_forward(counting, requests)
    assert counting.batches == [{"x": (6, 4)}]
    for request, result in zip(requests, results, strict=True):
        np.testing.assert_allclose(result["y"], linear.run(request)["y"], atol=1e-5)
    argmax = run_forward(linear, requests, PostProcess.ARGMAX_LAST)
    for request, result in zip(requests, argmax, strict=True):
        assert result[TOKEN_IDS].tolist() == linear.run(request)["y"].argmax(axis=1).tolist()


def test_generic_model_respects_max_batch_size(linear: OnnxRuntimeEngine) -> None:
    requests = [{"x": np.full((n, 4), n, dtype=np.float32)} for n in (2, 2, 1, 3, 5, 1)]
    counting = CountingEngine(linear)
    results = run_forward(counting, requests, policy=BucketPolicy(buckets=(1,), max_batch_size=4))
    assert [shape["x"][0] for shape in counting.batches] == [4, 4, 5, 1]
    for request, result in zip(requests, results, strict=True):
        np.testing.assert_allclose(result["y"], linear.run(request)["y"], atol=1e-5)


@pytest.fixture(scope="module")
def sequence_model() -> OnnxRuntimeEngine:
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "per_position",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 3])],
        [w],
    )
    return _engine_from_graph(graph, "per_position")


def test_generic_model_runs_differently_shaped_requests_separately(
    sequence_model: OnnxRuntimeEngine,
) -> None:
    rng = np.random.default_rng(1)
    requests = [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (2, 5)]
    counting = CountingEngine(sequence_model)
    pooled = run_forward(counting, requests, PostProcess.MEAN_POOL)
    assert len(counting.batches) == 2
    for request, result in zip(requests, pooled, strict=True):
        expected = sequence_model.run(request)["y"].mean(axis=1)
        np.testing.assert_allclose(result[MEAN_POOL], expected, atol=1e-5)


def test_token_model_without_mask_batches_equal_widths_only() -> None:
    table = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(10, 3), "table")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["emb"], axis=0),
            helper.make_node("CumSum", ["emb", "axis"], ["scores"]),
        ],
        "cumulative",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", "seq", 3])],
        [table, numpy_helper.from_array(np.array(1, dtype=np.int64), "axis")],
    )
    engine = CountingEngine(_engine_from_graph(graph, "cumulative"))
    requests = [
        {"input_ids": np.array([row], dtype=np.int64)} for row in ([1, 2], [3, 4, 5], [6, 7])
    ]
    results = run_forward(engine, requests)
    assert sorted(shape["input_ids"] for shape in engine.batches) == [(1, 3), (2, 2)]
    for request, result in zip(requests, results, strict=True):
        np.testing.assert_allclose(result["scores"], engine.inner.run(request)["scores"])


def test_the_vocabulary_is_never_read_from_an_output_named_logits(gpt: OnnxRuntimeEngine) -> None:
    """Regression: a token tagger's "logits" width (its classes) bounded its input ids."""
    layout = token_layout(gpt.io)
    assert layout is not None and layout.vocab_size is None
    assert isinstance(intake(gpt, token_request([1, 257])), WorkItem)  # no declared vocabulary
    refused = intake(gpt, token_request([1, 120]), vocab_size=100)
    assert isinstance(refused, Rejection) and refused.code is ErrorCode.BAD_REQUEST
    assert "[1, 120]; this model takes [0, 100)" in refused.message
