"""An engine-served generation as an OpenAI call, and its events read back (pure)."""

from __future__ import annotations

import json

import pytest

from graylane.artifacts.naming import Backend
from graylane.clock import now_ms
from graylane.engine_options import native_refusal, options_problem
from graylane.engine_worker.engine_load import (
    EngineLoad,
    llamacpp_slots,
    parse_prometheus,
    read_load,
    trtllm_iteration_stats,
)
from graylane.engine_worker.openai_calls import (
    ChoiceText,
    EngineEvent,
    EngineFault,
    Route,
    build_call,
    finish_reason,
    http_rejection,
    read_event,
)
from graylane.engine_worker.requests import EngineRules, WorkItem, validate_engine_call
from graylane.errors import ErrorCode, Rejection
from graylane.v1 import inference_pb2

RULES = EngineRules(model="m", max_request_bytes=1 << 20, max_new_tokens=64)


def _work(request: inference_pb2.InferenceRequest) -> WorkItem:
    work = validate_engine_call(request, request.ByteSize(), 0, RULES, now_ms())
    assert not isinstance(work, Rejection), work
    return work


def _request(**fields: object) -> inference_pb2.InferenceRequest:
    return inference_pb2.InferenceRequest(
        request_id="r",
        model="m",
        task=inference_pb2.GENERATE,
        **fields,  # type: ignore[arg-type]
    )


def test_a_conversation_goes_to_the_chat_route_with_its_options() -> None:
    request = _request(
        messages=[
            inference_pb2.ChatMessage(role="system", content="Be brief."),
            inference_pb2.ChatMessage(
                role="assistant",
                tool_calls=[inference_pb2.ToolCall(id="c1", name="now", arguments="{}")],
            ),
            inference_pb2.ChatMessage(role="tool", tool_call_id="c1", content="12:00"),
        ],
        generation=inference_pb2.GenerationParams(
            max_new_tokens=8,
            temperature=0.7,
            top_p=0.9,
            sampling_top_k=40,
            seed=5,
            has_seed=True,
            stop=["END"],
            turn_end=["<|im_end|>"],
        ),
        engine_options=inference_pb2.EngineOptions(
            logprobs=True,
            top_logprobs=2,
            response_format_json='{"type":"json_object"}',
            repetition_penalty=1.1,
            logit_bias={7: -100.0},
        ),
    )
    call = build_call(request, _work(request), served_model="smollm2", backend=Backend.LLAMACPP)
    body = dict(call.body)
    assert call.route is Route.CHAT
    assert body["model"] == "smollm2" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["top_k"]) == (
        8,
        0.7,  # as the caller wrote it, not its 32-bit neighbour
        0.9,
        40,
    )
    assert body["seed"] == 5 and body["stop"] == ["END"]  # the template's end of turn is not
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert body["response_format"] == {"type": "json_object"}
    assert body["repeat_penalty"] == 1.1  # llama.cpp's name
    assert body["logit_bias"] == {"7": -100.0}
    assert body["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
        ],
    }
    assert body["messages"][2] == {"role": "tool", "content": "12:00", "tool_call_id": "c1"}
    vllm = build_call(request, _work(request), served_model="m", backend=Backend.VLLM)
    assert "repetition_penalty" in vllm.body and "repeat_penalty" not in vllm.body


def test_a_text_or_token_prompt_goes_to_the_completions_route() -> None:
    text = _request(prompt="Once", generation=inference_pb2.GenerationParams(max_new_tokens=4))
    call = build_call(text, _work(text), served_model="m", backend=Backend.VLLM)
    assert call.route is Route.COMPLETIONS and call.body["prompt"] == "Once"
    assert call.body["temperature"] == 0.0 and "top_p" not in call.body  # greedy
    tokens = _request(
        token_ids=[1, 2, 3],
        generation=inference_pb2.GenerationParams(max_new_tokens=4),
        engine_options=inference_pb2.EngineOptions(logprobs=True, top_logprobs=3, n=2),
    )
    call = build_call(tokens, _work(tokens), served_model="m", backend=Backend.VLLM)
    assert call.body["prompt"] == [1, 2, 3]
    assert call.body["logprobs"] == 3 and call.body["n"] == 2  # completions: a count


def test_events_of_both_endpoints_are_read() -> None:
    chat = read_event(
        json.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "content": "Hi",
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "c1",
                                    "function": {"name": "now", "arguments": "{"},
                                }
                            ],
                        },
                        "logprobs": {
                            "content": [
                                {
                                    "token": "Hi",
                                    "logprob": -0.25,
                                    "bytes": [72, 105],
                                    "top_logprobs": [{"token": "Hey", "logprob": -2.0}],
                                }
                            ]
                        },
                        "finish_reason": None,
                    }
                ]
            }
        )
    )
    assert isinstance(chat, EngineEvent) and chat.tokens_seen == 1
    (delta,) = chat.choices
    assert delta.text == "Hi" and delta.logprobs[0].logprob == -0.25
    assert delta.logprobs[0].top_logprobs[0].token == "Hey"
    more = read_event(
        json.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]},
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 4},
            }
        )
    )
    assert isinstance(more, EngineEvent) and more.completion_tokens == 4
    gathered = ChoiceText(0)
    gathered.add(delta)
    gathered.add(more.choices[0])
    assert [(c.id, c.name, c.arguments) for c in gathered.calls()] == [("c1", "now", "{}")]
    assert finish_reason(gathered.finish_reason) == inference_pb2.TOOL_CALLS
    completion = read_event(
        json.dumps(
            {
                "choices": [
                    {
                        "index": 1,
                        "text": " Paris",
                        "logprobs": {
                            "tokens": [" Paris"],
                            "token_logprobs": [-0.1],
                            "top_logprobs": [{" Paris": -0.1, " Lyon": -3.0}],
                        },
                        "finish_reason": "length",
                    }
                ]
            }
        )
    )
    assert isinstance(completion, EngineEvent)
    (piece,) = completion.choices
    assert (piece.index, piece.text, piece.finish_reason) == (1, " Paris", "length")
    assert [t.token for t in piece.logprobs[0].top_logprobs] == [" Paris", " Lyon"]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ("{not json", ErrorCode.ENGINE_FAILURE),
        ("[1, 2]", ErrorCode.ENGINE_FAILURE),
        ('{"choices": 3}', ErrorCode.ENGINE_FAILURE),
        ('{"error": {"code": 500, "message": "boom"}}', ErrorCode.ENGINE_FAILURE),
        ('{"error": {"code": 400, "message": "bad grammar"}}', ErrorCode.BAD_REQUEST),
    ],
)
def test_what_is_no_event_is_a_fault(data: str, code: ErrorCode) -> None:
    fault = read_event(data)
    assert isinstance(fault, EngineFault) and fault.rejection.code is code


def test_http_errors_say_whose_fault() -> None:
    context = '{"error": {"type": "exceed_context_size_error", "message": "too long"}}'
    assert http_rejection(400, context).code is ErrorCode.SEQUENCE_TOO_LONG
    vllm = '{"object": "error", "message": "This model\'s maximum context length is 2048"}'
    assert http_rejection(400, vllm).code is ErrorCode.SEQUENCE_TOO_LONG
    refused = http_rejection(422, '{"detail": "n must be at most 4"}')
    assert refused.code is ErrorCode.BAD_REQUEST and "n must be at most 4" in refused.message
    assert http_rejection(429, "").code is ErrorCode.SHED
    assert http_rejection(503, "Loading model").code is ErrorCode.ENGINE_UNAVAILABLE
    assert http_rejection(404, '{"error": {"message": "no model x"}}').code is (
        ErrorCode.ENGINE_FAILURE
    )
    failed = http_rejection(500, '{"error": {"message": "CUDA error at /src/x.cu:42"}}')
    assert failed.code is ErrorCode.ENGINE_FAILURE and "CUDA" not in failed.message
    assert len(http_rejection(400, "x" * 10_000).message) < 1000


def test_engine_options_are_checked_once_for_gateway_and_worker() -> None:
    assert options_problem(inference_pb2.EngineOptions(n=2, logprobs=True)) is None
    for bad in (
        inference_pb2.EngineOptions(n=9),
        inference_pb2.EngineOptions(top_logprobs=3),
        inference_pb2.EngineOptions(logprobs=True, top_logprobs=21),
        inference_pb2.EngineOptions(presence_penalty=3.0),
        inference_pb2.EngineOptions(logit_bias={1: 500.0}),
        inference_pb2.EngineOptions(response_format_json="[]"),
        inference_pb2.EngineOptions(response_format_json='{"type": "yaml"}'),
        inference_pb2.EngineOptions(tools_json='[{"type": "function"}]'),
        inference_pb2.EngineOptions(tool_choice_json='"auto"'),
        inference_pb2.EngineOptions(tools_json="[" * 100_000),
    ):
        assert options_problem(bad) is not None, bad
    plain = _request(prompt="x")
    assert native_refusal(plain) is None
    plain.engine_options.logprobs = True
    assert native_refusal(plain) == "logprobs"


def test_engines_tell_their_load() -> None:
    vllm = """# HELP vllm:num_requests_waiting waiting
vllm:num_requests_waiting{model_name="a"} 3.0
vllm:num_requests_waiting{model_name="b"} 2.0
vllm:num_requests_running{model_name="a"} 4.0
vllm:kv_cache_usage_perc{model_name="a"} 0.75
vllm:broken line
"""
    assert parse_prometheus(vllm)["vllm:num_requests_waiting"] == 5.0
    assert read_load(Backend.VLLM, {"/metrics": vllm}) == EngineLoad(5, 4, 0.75)
    old = "vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_waiting 0\n"
    assert read_load(Backend.VLLM, {"/metrics": old}).kv_cache_occupancy == 0.5
    sglang = "sglang:num_queue_reqs 7\nsglang:num_running_reqs 2\nsglang:token_usage 0.4\n"
    assert read_load(Backend.SGLANG, {"/metrics": sglang}) == EngineLoad(7, 2, 0.4)
    slots = json.dumps(
        [
            {"id": 0, "n_ctx": 1000, "is_processing": True, "n_prompt_tokens": 100,
             "next_token": [{"n_decoded": 50}]},
            {"id": 1, "n_ctx": 1000, "is_processing": False, "n_prompt_tokens": 900},
        ]
    )  # fmt: skip
    assert llamacpp_slots(slots) == EngineLoad(None, 1, 0.075)
    llama = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 6\n"
    load = read_load(Backend.LLAMACPP, {"/metrics": llama, "/slots": slots})
    assert load == EngineLoad(6, 1, 0.075)
    trt = json.dumps(
        [
            {"numQueuedRequests": 1, "numActiveRequests": 1},
            {
                "numQueuedRequests": 2,
                "numActiveRequests": 8,
                "kvCacheStats": {"usedNumBlocks": 30, "maxNumBlocks": 120},
            },
        ]
    )
    assert trtllm_iteration_stats(trt) == EngineLoad(2, 8, 0.25)
    assert read_load(Backend.TRTLLM, {}) == EngineLoad()
    assert read_load(Backend.LLAMACPP, {"/slots": "garbage"}) == EngineLoad()
