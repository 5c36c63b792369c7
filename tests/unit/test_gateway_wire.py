"""OpenAI's JSON <-> the gateway's calls and answers; the chat template; the error bodies."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from graylane.client import Choice, Result, TokenLogprob, ToolCall, Usage
from graylane.errors import ErrorCode
from graylane.services.gateway.catalog import ModelDirectory, served_models
from graylane.services.gateway.chat import CHATML, ChatMessage, ChatRole
from graylane.services.gateway.failures import ApiError, from_error_code
from graylane.services.gateway.logic.admission import GatewayLimits
from graylane.services.gateway.wire import (
    SSE_DONE,
    Endpoint,
    finish_reason,
    models_body,
    parse_chat,
    parse_completion,
    read_chat,
    render_chat,
    response_body,
    sse_event,
    stream_chunk,
    usage_chunk,
)
from graylane.topics import TopicLayout

LIMITS = GatewayLimits(max_tokens=512, default_max_tokens=64, max_prompt_chars=1000)


def _refusal(parse: Any, body: object) -> ApiError:
    with pytest.raises(ApiError) as refused:
        parse(body)
    assert refused.value.status == 400
    return refused.value


def _completion(body: object) -> Any:
    return parse_completion(body, LIMITS)


def _chat(body: object) -> Any:
    return parse_chat(body, LIMITS, CHATML)


def test_a_completion_takes_openai_defaults() -> None:
    call = _completion({"model": "gpt", "prompt": "hi"})
    assert call.endpoint is Endpoint.COMPLETIONS
    assert (call.max_tokens, call.temperature, call.top_p, call.stream) == (16, 1.0, 1.0, False)
    assert call.sdk_arguments() == {
        "max_new_tokens": 16,
        "temperature": 1.0,
        "top_p": 0.0,  # 1 keeps every token: no nucleus
        "sampling_top_k": 0,
        "seed": None,
        "stop": [],
        "turn_end": [],
        "messages": [],
        "engine_options": None,
        "prompt": "hi",
    }


def test_completion_fields_map_to_the_sdk() -> None:
    call = _completion(
        {
            "model": "gpt",
            "prompt": ["one prompt"],
            "max_tokens": 8,
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 42,
            "stop": "\n",
            "user": "u-1",
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
        }
    )
    assert call.include_usage and call.user == "u-1"
    args = call.sdk_arguments()
    assert args["prompt"] == "one prompt" and args["stop"] == ["\n"]
    assert (args["max_new_tokens"], args["temperature"], args["top_p"], args["seed"]) == (
        8,
        0.7,
        0.9,
        42,
    )
    tokens = _completion({"model": "gpt", "prompt": [1, 2, 3]}).sdk_arguments()
    assert tokens["token_ids"] == [1, 2, 3] and "prompt" not in tokens
    assert (
        _completion({"model": "gpt", "prompt": "x", "top_p": 0}).sdk_arguments()["temperature"]
        == 0.0
    )  # top_p 0 keeps only the likeliest token: greedy


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x"}, "model"),
        ({"model": "gpt"}, "prompt"),
        ({"model": "gpt", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "gpt", "prompt": "x", "n": 9}, "n"),
        ({"model": "gpt", "prompt": "x", "n": 2, "stream": True}, "n"),
        ({"model": "gpt", "prompt": "x", "best_of": 3}, "best_of"),
        ({"model": "gpt", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "gpt", "prompt": "x", "max_tokens": 513}, "max_tokens"),
        ({"model": "gpt", "prompt": "x", "temperature": 2.5}, "temperature"),
        ({"model": "gpt", "prompt": "x", "temperature": True}, "temperature"),
        ({"model": "gpt", "prompt": "x", "stop": [str(i) for i in range(17)]}, "stop"),
        (
            {"model": "gpt", "prompt": "x", "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ({"model": "gpt", "prompt": "x", "echo": True}, "echo"),
        ({"model": "gpt", "prompt": "x", "logprobs": 6}, "logprobs"),
        ({"model": "gpt", "prompt": "x", "logprobs": True}, "logprobs"),
        ({"model": "gpt", "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        ({"model": "gpt", "prompt": "x", "repetition_penalty": -1}, "repetition_penalty"),
        ({"model": "gpt", "prompt": "x", "min_p": 1.5}, "min_p"),
        ({"model": "gpt", "prompt": "x", "logit_bias": {"x": 1}}, "logit_bias"),
        ({"model": "gpt", "prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
        ({"model": "gpt", "prompt": "x", "top_k": -1}, "top_k"),
        ({"model": "gpt", "prompt": "x", "timeout": -1}, "timeout"),
        ({"model": "gpt", "prompt": "x" * 1001}, "prompt"),
    ],
)
def test_a_completion_refuses_what_it_cannot_honour(body: dict[str, Any], param: str) -> None:
    assert _refusal(_completion, body).param == param


def test_a_chat_renders_chatml_and_stops_at_the_end_of_the_turn() -> None:
    call = _chat(
        {
            "model": "gpt",
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "{format} me"},
            ],
            "stop": ["END"],
            "max_completion_tokens": 5,
            "max_tokens": 50,
        }
    )
    assert call.endpoint is Endpoint.CHAT
    assert call.prompt == (
        "<|im_start|>system\nBe terse.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\n{format} me<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert call.stop == ("END",) and call.turn_end == ("<|im_end|>",)
    assert call.max_tokens == 5  # max_completion_tokens wins
    assert _chat({"model": "gpt", "messages": [{"role": "user", "content": "x"}]}).max_tokens == 64
    assert CHATML.render([ChatMessage(ChatRole.USER, "x")]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "tool", "content": "x"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": 3}],
        ["hello"],
    ],
)
def test_a_chat_refuses_messages_it_cannot_render(messages: list[Any]) -> None:
    assert _refusal(_chat, {"model": "gpt", "messages": messages}).param == "messages"


def test_a_chat_carries_tools_json_mode_and_logprobs_for_engine_servers() -> None:
    base = {"model": "gpt", "messages": [{"role": "user", "content": "x"}]}
    tool = {"type": "function", "function": {"name": "now", "parameters": {}}}
    call = _chat(
        {
            **base,
            "tools": [tool],
            "tool_choice": "auto",
            "response_format": {"type": "json_object"},
            "logprobs": True,
            "top_logprobs": 3,
            "n": 2,
            "presence_penalty": 0.5,
            "logit_bias": {"42": -100},
            "top_k": 40,
        }
    )
    options = call.options
    assert options is not None
    assert (
        json.loads(options.tools_json) == [tool] and json.loads(options.tool_choice_json) == "auto"
    )
    assert json.loads(options.response_format_json) == {"type": "json_object"}
    assert (options.logprobs, options.top_logprobs, options.n) == (True, 3, 2)
    assert options.presence_penalty == 0.5 and dict(options.logit_bias) == {42: -100.0}
    args = call.sdk_arguments()
    assert args["engine_options"] is options and args["sampling_top_k"] == 40
    # the conversation travels as messages too, the template's end of turn apart from stop
    assert [(m.role, m.content) for m in args["messages"]] == [("user", "x")]
    assert args["turn_end"] == ["<|im_end|>"] and args["stop"] == []
    # plain text output and no options: nothing for engines to apply
    assert _chat({**base, "response_format": {"type": "text"}}).options is None
    # what is malformed is refused here, naming the field
    assert _refusal(_chat, {**base, "tools": [{"type": "function"}]}).param == "tools"
    assert _refusal(_chat, {**base, "response_format": {"type": "xml"}}).param == (
        "response_format"
    )
    assert _refusal(_chat, {**base, "top_logprobs": 2}).param == "top_logprobs"
    assert _refusal(_chat, {**base, "tool_choice": "required"}).param == "tool_choice"


def test_a_chat_carries_tool_turns() -> None:
    messages = [
        {"role": "user", "content": "What time is it?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    call = _chat({"model": "gpt", "messages": messages})
    assistant, tool = call.messages[1], call.messages[2]
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [("c1", "now", "{}")]
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "c1", "12:00")
    nameless = [{"role": "tool", "content": "12:00"}]
    assert _refusal(_chat, {"model": "gpt", "messages": nameless}).param == "messages"


def _result(**fields: Any) -> Result:
    return Result(
        request_id="r1",
        model="gpt",
        version=fields.pop("version", "v1"),
        variant="q4_1",
        ok=True,
        error_code="",
        error_message="",
        **fields,
    )


def test_what_an_engine_answered_has_openai_shapes() -> None:
    messages = [{"role": "user", "content": "x"}]
    chat = _chat(
        {"model": "gpt", "messages": messages, "logprobs": True, "top_logprobs": 1, "n": 2}
    )
    top = (("Hi", -0.5, b"Hi"),)
    result = _result(
        text="Hi",
        finish_reason="TOOL_CALLS",
        usage=Usage(3, 1),
        logprobs=(TokenLogprob("Hi", -0.1, b"Hi", top),),
        tool_calls=(ToolCall("c1", "now", '{"tz": "UTC"}'),),
        extra_choices=(Choice(1, "Hey", "LENGTH"),),
    )
    body = response_body(chat, request_id="r1", created=7, result=result)
    first, second = body["choices"]
    assert first["finish_reason"] == "tool_calls"
    assert first["message"]["tool_calls"] == [
        {
            "index": 0,
            "id": "c1",
            "type": "function",
            "function": {"name": "now", "arguments": '{"tz": "UTC"}'},
        }
    ]
    assert first["logprobs"]["content"] == [
        {
            "token": "Hi",
            "logprob": -0.1,
            "bytes": [72, 105],
            "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}],
        }
    ]
    assert (second["index"], second["message"]["content"], second["finish_reason"]) == (
        1,
        "Hey",
        "length",
    )
    completion = _completion({"model": "gpt", "prompt": "x", "logprobs": 1})
    lp = response_body(completion, request_id="r2", created=7, result=result)["choices"][0]
    assert lp["logprobs"] == {
        "tokens": ["Hi"],
        "token_logprobs": [-0.1],
        "top_logprobs": [{"Hi": -0.5}],
        "text_offset": [0],
    }
    streamed = _completion({"model": "gpt", "prompt": "x", "logprobs": 1, "stream": True})
    piece = stream_chunk(
        streamed,
        request_id="r2",
        created=7,
        text="Hi",
        finish=None,
        first=False,
        logprobs=result.logprobs,
        text_offset=5,
    )
    assert piece["choices"][0]["logprobs"]["text_offset"] == [5]


def test_answers_have_openai_shapes() -> None:
    chat = _chat(
        {
            "model": "gpt",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    whole = response_body(
        chat,
        request_id="r1",
        created=7,
        result=_result(text="hey", finish_reason="EOS", usage=Usage(3, 2), version="v2"),
    )
    assert whole == {
        "id": "chatcmpl-r1",
        "object": "chat.completion",
        "created": 7,
        "model": "gpt",
        "system_fingerprint": "graylane:v2",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hey"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    opening = stream_chunk(chat, request_id="r1", created=7, text="", finish=None, first=True)
    assert opening["object"] == "chat.completion.chunk" and opening["usage"] is None
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    piece = stream_chunk(chat, request_id="r1", created=7, text="he", finish=None, first=False)
    assert piece["choices"][0]["delta"] == {"content": "he"}
    closing = stream_chunk(chat, request_id="r1", created=7, text="", finish="LENGTH", first=False)
    assert closing["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    usage = usage_chunk(chat, request_id="r1", created=7, usage=Usage(3, 2), version="v2")
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 5
    completion = _completion({"model": "gpt", "prompt": "x", "stream": True})
    chunk = stream_chunk(completion, request_id="r2", created=7, text="a", finish=None, first=True)
    assert chunk["object"] == "text_completion" and "usage" not in chunk
    assert chunk["choices"][0]["text"] == "a"
    event = sse_event({"a": 1})
    assert event == b'data: {"a":1}\n\n' and SSE_DONE == b"data: [DONE]\n\n"
    assert json.loads(event[len(b"data: ") :]) == {"a": 1}
    assert [finish_reason(n) for n in ("LENGTH", "MAX_SEQUENCE", "STOP", "EOS", "TOOL_CALLS")] == [
        "length",
        "length",
        "stop",
        "stop",
        "tool_calls",
    ]
    assert models_body(["a"])["data"][0] == {
        "id": "a",
        "object": "model",
        "created": 0,
        "owned_by": "graylane",
    }


def test_error_results_become_http_statuses() -> None:
    def status(code: ErrorCode) -> int:
        return from_error_code(code, "why", retry_after_s=2).status

    assert status(ErrorCode.UNKNOWN_MODEL) == 404 and status(ErrorCode.UNKNOWN_VERSION) == 404
    assert status(ErrorCode.BAD_SHAPE) == 400 and status(ErrorCode.SEQUENCE_TOO_LONG) == 400
    assert status(ErrorCode.PAYLOAD_TOO_LARGE) == 413
    assert status(ErrorCode.DEADLINE_EXCEEDED) == 504
    assert status(ErrorCode.ENGINE_FAILURE) == 500
    shed = from_error_code(ErrorCode.SHED, "busy", retry_after_s=2)
    assert shed.status == 503 and shed.headers() == {"Retry-After": "2"}
    limited = ApiError.rate_limited("team", 0.2)
    assert limited.status == 429 and limited.headers() == {"Retry-After": "1"}
    assert limited.openai_body()["error"]["type"] == "rate_limit_error"
    assert ApiError.model_not_found("gone").inference_protocol_body() == {"error": "gone"}


def test_failures_inside_are_answered_generically_with_the_detail_kept_for_logs() -> None:
    """Pins the leak: ONNX Runtime's and Kafka's exception text reached callers verbatim."""
    inner = "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : /opt/models/gpt/v1/model.onnx node 7"
    for code in (ErrorCode.ENGINE_FAILURE, ErrorCode.ENGINE_UNAVAILABLE, ErrorCode.SHED):
        err = from_error_code(code, inner, retry_after_s=1)
        assert "ONNX" not in err.message and "/opt/models" not in err.message
        assert err.detail == inner
    caller = from_error_code(ErrorCode.BAD_SHAPE, "input x: expected 2 dims", retry_after_s=1)
    assert caller.message == "input x: expected 2 dims" and caller.status == 400


def test_messages_are_capped_before_a_template_renders_them() -> None:
    class Counting:
        stop = ("<e>",)
        calls = 0

        def render(self, messages: object) -> str:
            Counting.calls += 1
            return "p"

    limits = GatewayLimits(max_prompt_chars=100)
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 60}] * 2}
    with pytest.raises(ApiError, match="messages are longer"):
        parse_chat(body, limits, Counting())
    assert Counting.calls == 0
    draft = read_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, limits)
    assert draft.call.prompt == ""  # nothing rendered yet
    assert render_chat(draft, limits, Counting()).prompt == "p"


def test_served_models_are_the_ingress_topics_and_their_versions() -> None:
    layout = TopicLayout(prefix="p")
    topics = {
        "p.requests.gpt",
        "p.requests.gpt.1.0.0",
        "p.requests.gpt.1.1.0",
        "p.requests.tagger",
        "p.requests.orphan.2.0.0",  # a version topic without an ingress: not served
        "p.results.gpt",
        "q.requests.other",
        "p.control.routing",
    }
    assert served_models(topics, layout) == {"gpt": ("1.0.0", "1.1.0"), "tagger": ()}


async def test_the_model_directory_refreshes_once_at_a_time_and_spares_unknown_names() -> None:
    layout = TopicLayout(prefix="p")
    topics = {"p.requests.gpt"}
    fetches: list[float] = []
    now = [0.0]
    gate = asyncio.Event()

    async def fetch() -> set[str]:
        fetches.append(now[0])
        await gate.wait()
        return set(topics)

    directory = ModelDirectory(layout, fetch, ttl_s=30.0, miss_refresh_s=5.0, clock=lambda: now[0])
    first = [asyncio.create_task(directory.versions("gpt")) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*first) == [()] * 5
    assert fetches == [0.0]  # five callers, one metadata request
    for _ in range(50):
        assert await directory.versions("nope") is None
    assert fetches == [0.0]  # unknown names are answered from the list
    topics.add("p.requests.new")
    now[0] = 6.0
    assert await directory.versions("new") == ()  # looked up again: it may be new
    assert fetches == [0.0, 6.0]
    topics.add("p.requests.newer")
    now[0] = 40.0
    assert "newer" not in await directory.models()  # expired: the older list, meanwhile...
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert "newer" in await directory.models()  # ...one refresh in the background
    assert fetches == [0.0, 6.0, 40.0]
