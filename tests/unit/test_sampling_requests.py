"""Sampling through the worker: intake maps a request's generation params to
:class:`SamplingParams` (or answers ``BAD_REQUEST``), rows with different sampling and
EOS share one batch on the demo GPT, and results carry finish reason, usage and cut text."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graylane.artifacts.model_info import ModelInfo, ModelTask
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.backend import BatchClock, ResultContext
from graylane.engine_worker.compute import GenerateOutcome, run_batch
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.logic.sampling import GREEDY, SamplingParams
from graylane.engine_worker.requests import (
    DemoByteTokenizer,
    IntakeRules,
    Job,
    Limits,
    WorkItem,
    validate,
)
from graylane.engine_worker.wire import build_batch
from graylane.errors import ErrorCode, Rejection
from graylane.kafka.seam import Record
from graylane.models.byte_vocab import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, encode_text
from graylane.v1 import inference_pb2
from tests.support.generation import (
    MAX_SEQ,
    TOKENIZER,
    ascii_pair,
    demo_engine,
    first_new,
    generate,
)


@pytest.fixture(scope="module")
def plain() -> OnnxRuntimeEngine:
    return demo_engine(kv_cache=False)


@pytest.fixture(scope="module")
def cached() -> OnnxRuntimeEngine:
    return demo_engine(kv_cache=True)


@pytest.fixture(params=["plain", "cached"])
def engine(request: pytest.FixtureRequest) -> OnnxRuntimeEngine:
    """The worker's batch run on the recompute path and on the KV-cache path."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


LIMITS = Limits(max_seq_len=MAX_SEQ, max_new_tokens=32)
POLICY = BucketPolicy(buckets=(16, 32, 64), max_batch_size=8)
INFO = ModelInfo(ModelTask.CAUSAL_LM, VOCAB_SIZE, "input_ids")


def rules(
    engine: OnnxRuntimeEngine, tokenizer: DemoByteTokenizer | None = TOKENIZER
) -> IntakeRules:
    return IntakeRules(
        model="demo",
        max_request_bytes=1 << 20,
        io=engine.io,
        limits=LIMITS,
        tokenizer=tokenizer,
        model_info=INFO,
    )


def request(rid: str = "r", **generation: object) -> inference_pb2.InferenceRequest:
    params = {"max_new_tokens": 8, **generation}
    return inference_pb2.InferenceRequest(
        request_id=rid,
        model="demo",
        prompt="Hello",
        task=inference_pb2.GENERATE,
        generation=inference_pb2.GenerationParams(**params),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("generation", "says"),
    [
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"temperature": math.nan}, "temperature must be a finite number"),
        ({"temperature": math.inf}, "temperature must be a finite number"),
        ({"top_p": 1.5}, "top_p must be in [0, 1]"),
        ({"sampling_top_k": -2}, "top_k must be >= 0"),
        ({"stop": ["a"] * 17}, "17 stop strings; the limit is 16"),
        ({"stop": ["x" * 65]}, "65 characters; the limit is 64"),
        ({"stop": [""]}, "stop strings must be non-empty"),
        ({"stop_token_ids": list(range(65))}, "65 stop_token_ids; the limit is 64"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must be ids >= 0"),
        ({"stop_token_ids": [3, VOCAB_SIZE]}, f"stop_token_ids must be in [0, {VOCAB_SIZE})"),
    ],
)
def test_invalid_sampling_is_answered_bad_request_at_intake(
    plain: OnnxRuntimeEngine, generation: dict[str, object], says: str
) -> None:
    got = validate(request(**generation), 100, 0, rules(plain), 0)
    assert isinstance(got, Rejection), got
    assert got.code is ErrorCode.BAD_REQUEST
    assert says in got.message


def test_stop_strings_without_a_tokenizer_are_refused_at_intake(plain: OnnxRuntimeEngine) -> None:
    got = validate(request(stop=["\n"]), 100, 0, rules(plain, None), 0)
    assert isinstance(got, Rejection) and got.code is ErrorCode.BAD_REQUEST
    assert "stop strings need the model's tokenizer" in got.message
    ids_only = validate(request(stop_token_ids=[10]), 100, 0, rules(plain, None), 0)
    assert isinstance(ids_only, WorkItem) and ids_only.sampling.stop_token_ids == (10,)


def test_intake_carries_the_sampling_on_the_work_item(plain: OnnxRuntimeEngine) -> None:
    asked = request(
        temperature=0.5,
        top_p=0.9,
        sampling_top_k=40,
        seed=2**64 - 1,
        has_seed=True,
        stop=["\n\n", "END"],
        stop_token_ids=[EOS_ID, 10],
    )
    item = validate(asked, 100, 0, rules(plain), 0)
    assert isinstance(item, WorkItem)
    assert item.sampling == SamplingParams(
        temperature=0.5,
        top_p=float(np.float32(0.9)),  # the wire's float
        top_k=40,
        seed=2**64 - 1,
        stop_token_ids=(EOS_ID, 10),
        stop=("\n\n", "END"),
    )
    plain_item = validate(request(seed=7), 100, 0, rules(plain), 0)  # has_seed unset
    assert isinstance(plain_item, WorkItem) and plain_item.sampling == GREEDY
    forward = inference_pb2.InferenceRequest(
        request_id="f",
        model="demo",
        token_ids=[1, 2],
        generation=inference_pb2.GenerationParams(temperature=-1.0),  # not a generation
    )
    assert isinstance(validate(forward, 100, 0, rules(plain), 0), WorkItem)


def job_of(req: inference_pb2.InferenceRequest, item: WorkItem) -> Job:
    return Job(Record("t", 0, item.index, 0, 0, None, b"", None, 0, 0, ()), req, item)


def test_rows_with_different_sampling_and_eos_share_one_batch_and_answer_each(
    engine: OnnxRuntimeEngine,
) -> None:
    greedy_tokens = generate(engine, [encode_text("Hello")], 30)[0].tokens
    j = ascii_pair(greedy_tokens, 2)
    stop = bytes(greedy_tokens[j : j + 2]).decode()
    k = first_new(greedy_tokens, 2)
    requests = [
        request("greedy"),
        request("seeded", temperature=1.0, top_p=0.95, seed=1234, has_seed=True),
        request("stopped", max_new_tokens=30, stop=[stop]),
        request("eos", eos_token_id=greedy_tokens[k], has_eos=True),
    ]
    items = [validate(r, 100, i, rules(engine), 0) for i, r in enumerate(requests)]
    assert all(isinstance(i, WorkItem) for i in items)
    work = [i for i in items if isinstance(i, WorkItem)]
    assert len({i.group_key for i in work}) == 1  # neither sampling nor EOS splits the batch
    run = run_batch(engine, work, POLICY, MAX_SEQ, PAD_ID, TOKENIZER.decode)
    assert run.engine_calls == 1
    seeded_alone = run_batch(engine, [work[1]], POLICY, MAX_SEQ, PAD_ID, TOKENIZER.decode)
    assert seeded_alone.outcomes[1] == run.outcomes[1]
    ctx = ResultContext(
        model="demo", version="v1", variant="fp32", worker_id="w", tokenizer=TOKENIZER
    )
    report = build_batch(
        [job_of(r, i) for r, i in zip(requests, work, strict=True)],
        run,
        None,
        ctx,
        BatchClock(dequeued_ms=1000, started_ms=1001, done_ms=1010),
        bucket_len=16,
        device_load=0.5,
    )
    results = {job.request.request_id: job.result for job in report.answers}
    assert all(r is not None for r in results.values())
    greedy, seeded, stopped, eos = (results[k] for k in ("greedy", "seeded", "stopped", "eos"))
    assert greedy is not None and seeded is not None and stopped is not None and eos is not None
    assert list(greedy.generated_token_ids) == list(greedy_tokens[:8])
    assert greedy.finish_reason == inference_pb2.LENGTH
    assert greedy.text == TOKENIZER.decode(greedy_tokens[:8])
    assert (greedy.usage.prompt_tokens, greedy.usage.completion_tokens) == (5, 8)
    assert seeded.finish_reason == inference_pb2.LENGTH
    assert list(seeded.generated_token_ids) != list(greedy_tokens[:8])
    assert stopped.finish_reason == inference_pb2.STOP
    assert stopped.text == TOKENIZER.decode(greedy_tokens[:j])
    assert list(stopped.generated_token_ids) == list(greedy_tokens[:j])
    assert stopped.usage.completion_tokens == j
    assert eos.finish_reason == inference_pb2.EOS
    assert list(eos.generated_token_ids) == list(greedy_tokens[:k])
    outcome = run.outcomes[2]
    assert isinstance(outcome, GenerateOutcome) and outcome.result.text == stopped.text


def test_a_max_sequence_finish_is_named_on_the_wire(plain: OnnxRuntimeEngine) -> None:
    long = inference_pb2.InferenceRequest(
        request_id="long",
        model="demo",
        token_ids=[BOS_ID] * (MAX_SEQ - 2),
        task=inference_pb2.GENERATE,
        generation=inference_pb2.GenerationParams(max_new_tokens=8),
    )
    item = validate(long, 100, 0, rules(plain), 0)
    assert isinstance(item, WorkItem)
    run = run_batch(plain, [item], POLICY, MAX_SEQ, PAD_ID)
    ctx = ResultContext(model="demo", version="v1", variant="fp32", worker_id="w")
    clock = BatchClock(dequeued_ms=1000, started_ms=1001, done_ms=1010)
    report = build_batch([job_of(long, item)], run, None, ctx, clock, bucket_len=64, device_load=0)
    result = report.answers[0].result
    assert result is not None and result.finish_reason == inference_pb2.MAX_SEQUENCE
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (MAX_SEQ - 2, 2)
