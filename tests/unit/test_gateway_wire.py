"""OpenAI's JSON <-> the gateway's calls and answers; the chat template; the error bodies."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from graylane.client import Usage
from graylane.errors import ErrorCode
from graylane.services.gateway.admission import GatewayLimits
from graylane.services.gateway.catalog import ModelDirectory, served_models
from graylane.services.gateway.chat import CHATML, ChatMessage, ChatRole
from graylane.services.gateway.failures import ApiError, from_error_code
from graylane.services.gateway.wire import (
    SSE_DONE,
    Endpoint,
    finish_reason,
    models_body,
    parse_chat,
    parse_completion,
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
        "seed": None,
        "stop": [],
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
        ({"model": "gpt", "prompt": "x", "n": 2}, "n"),
        ({"model": "gpt", "prompt": "x", "best_of": 3}, "best_of"),
        ({"model": "gpt", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "gpt", "prompt": "x", "max_tokens": 513}, "max_tokens"),
        ({"model": "gpt", "prompt": "x", "temperature": 2.5}, "temperature"),
        ({"model": "gpt", "prompt": "x", "temperature": True}, "temperature"),
        ({"model": "gpt", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (
            {"model": "gpt", "prompt": "x", "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ({"model": "gpt", "prompt": "x", "echo": True}, "echo"),
        ({"model": "gpt", "prompt": "x", "logprobs": 2}, "logprobs"),
        ({"model": "gpt", "prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
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
    assert call.stop == ("END", "<|im_end|>")
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


def test_a_chat_refuses_tools_and_json_mode() -> None:
    base = {"model": "gpt", "messages": [{"role": "user", "content": "x"}]}
    assert _refusal(_chat, {**base, "tools": [{"type": "function"}]}).param == "tools"
    assert _refusal(_chat, {**base, "response_format": {"type": "json_object"}}).param == (
        "response_format"
    )
    assert _chat({**base, "response_format": {"type": "text"}}).model == "gpt"


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
        text="hey",
        finish="EOS",
        usage=Usage(3, 2),
        version="v2",
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
    assert [finish_reason(n) for n in ("LENGTH", "MAX_SEQUENCE", "STOP", "EOS")] == [
        "length",
        "length",
        "stop",
        "stop",
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
