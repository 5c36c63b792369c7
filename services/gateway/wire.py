"""OpenAI's JSON <-> the SDK's generation arguments and results (pure, no I/O).

``POST /v1/completions`` and ``POST /v1/chat/completions`` bodies are read into a
:class:`GenerationCall` (checked field by field, refusals name the field as OpenAI
does in ``error.param``); a call becomes the arguments of
:meth:`graylane.client.GraylaneClient.infer` / ``stream`` (a ``GENERATE``
``InferenceRequest``); results and streamed chunks become OpenAI's response
objects and server-sent-event chunks.

Defaults follow OpenAI's: ``temperature`` 1, ``top_p`` 1 (off), ``max_tokens`` 16 for
completions and the gateway's ``default_max_tokens`` for chat. The fields engine
servers apply (``n``, ``logprobs``/``top_logprobs``, ``response_format``, ``tools`` and
``tool_choice``, the penalties, ``logit_bias``, ``min_p``; ``top_k`` too, which
Graylane's decoder applies as well) are checked here, types and ranges
(:mod:`graylane.engine_options`), and travel with the request: a version served by an
engine server applies them, a version served by Graylane's decoder refuses them (400,
naming the field). ``best_of``, ``echo``, ``suffix`` and the audio fields are refused
here, never silently ignored; ``n`` > 1 is answered unstreamed only. A chat's messages
travel as messages too (an engine applies its own template), beside the prompt the
model's template renders for Graylane's decoder.

Answers carry what the engine gave: log probabilities (OpenAI's chat shape, or the
completions shape), tool calls (finish reason ``tool_calls``), further choices. Finish
reasons map ``LENGTH`` and ``MAX_SEQUENCE`` to ``length``, ``STOP`` and ``EOS`` to
``stop``, ``TOOL_CALLS`` to ``tool_calls``. The served version is the response's
``system_fingerprint`` (``graylane:<version>``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from graylane.client import Choice, Result, TokenLogprob, ToolCall, Usage
from graylane.engine_options import MAX_CHOICES, MAX_TOP_LOGPROBS, options_problem
from graylane.errors import ErrorCode
from graylane.services.gateway.chat import (
    ChatFormat,
    ChatMessage,
    ChatRole,
    ChatTemplateError,
)
from graylane.services.gateway.failures import ApiError
from graylane.services.gateway.logic.admission import GatewayLimits
from graylane.v1 import inference_pb2

__all__ = [
    "MAX_STOP_SEQUENCES",
    "SSE_DONE",
    "ChatDraft",
    "Endpoint",
    "GenerationCall",
    "finish_reason",
    "model_card",
    "models_body",
    "parse_chat",
    "parse_completion",
    "parse_messages",
    "read_chat",
    "render_chat",
    "response_body",
    "sse_event",
    "stream_chunk",
    "usage_chunk",
]

MAX_STOP_SEQUENCES = 15
"""The most ``stop`` strings a call may name (OpenAI allows 4; engines and Graylane's
decoder take more): the worker's limit of 16 less the chat template's end of turn."""
COMPLETION_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` of ``/v1/completions``."""
SSE_DONE = b"data: [DONE]\n\n"

_FINISH = {
    "LENGTH": "length",
    "MAX_SEQUENCE": "length",
    "STOP": "stop",
    "EOS": "stop",
    "TOOL_CALLS": "tool_calls",
}
_UNSUPPORTED_COMPLETION = ("echo", "suffix")
_UNSUPPORTED_CHAT = ("functions", "function_call", "audio", "modalities", "prediction")
MAX_COMPLETION_LOGPROBS = 5
"""OpenAI's limit on ``logprobs`` of ``/v1/completions`` (alternatives per token)."""


class Endpoint(Enum):
    """Which OpenAI endpoint a call came to; the value is its response ``object``."""

    COMPLETIONS = "text_completion"
    CHAT = "chat.completion"

    @property
    def id_prefix(self) -> str:
        return "cmpl-" if self is Endpoint.COMPLETIONS else "chatcmpl-"

    @property
    def chunk_object(self) -> str:
        return "text_completion" if self is Endpoint.COMPLETIONS else "chat.completion.chunk"


@dataclass(frozen=True, kw_only=True)
class GenerationCall:
    """One OpenAI call, checked: what to generate and how to answer."""

    endpoint: Endpoint
    model: str
    prompt: str = ""
    token_ids: tuple[int, ...] = ()
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    user: str = ""
    timeout_s: float | None = None
    """The body's ``timeout`` (a Graylane extension, seconds); None when absent."""
    top_k: int = 0
    """The ``top_k`` extension (vLLM's, llama.cpp's): the k likeliest tokens; 0 = off."""
    turn_end: tuple[str, ...] = ()
    """A chat: the strings that close the assistant's turn in the rendered prompt."""
    messages: tuple[inference_pb2.ChatMessage, ...] = ()
    """A chat: its conversation, for engine servers."""
    options: inference_pb2.EngineOptions | None = None
    """Options only engine servers apply (None: none set)."""

    @property
    def logprobs_shape(self) -> bool:
        """Whether the answer carries log probabilities (asked for)."""
        return self.options is not None and self.options.logprobs

    def sdk_arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``GraylaneClient.infer`` / ``stream`` for this call."""
        # top_p 1 keeps every token (no nucleus); top_p 0 keeps only the likeliest: greedy.
        args: dict[str, Any] = {
            "max_new_tokens": self.max_tokens,
            "temperature": 0.0 if self.top_p == 0.0 else self.temperature,
            "top_p": 0.0 if self.top_p in (0.0, 1.0) else self.top_p,
            "sampling_top_k": self.top_k,
            "seed": self.seed,
            "stop": list(self.stop),
            "turn_end": list(self.turn_end),
            "messages": list(self.messages),
            "engine_options": self.options,
        }
        if self.token_ids:
            args["token_ids"] = list(self.token_ids)
        else:
            args["prompt"] = self.prompt
        return args


# -- reading a body -------------------------------------------------------------------


def _object(body: object) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise ApiError.invalid("the request body must be a JSON object")
    return body


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError.invalid(f"{name} must be a number", name)
    if not lo <= value <= hi:
        raise ApiError.invalid(f"{name} must be between {lo:g} and {hi:g}, got {value}", name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError.invalid(f"{name} must be an integer", name)
    return value


def _max_tokens(body: Mapping[str, Any], names: Sequence[str], default: int, cap: int) -> int:
    for name in names:
        value = _integer(body, name)
        if value is None:
            continue
        if value < 1:
            raise ApiError.invalid(f"{name} must be at least 1, got {value}", name)
        if value > cap:
            raise ApiError.invalid(
                f"{name} is {value}; this gateway allows at most {cap} tokens per call", name
            )
        return value
    return min(default, cap)


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ApiError.invalid("stop must be a string or a list of strings", "stop")
    if len(value) > MAX_STOP_SEQUENCES:
        raise ApiError.invalid(f"stop takes at most {MAX_STOP_SEQUENCES} sequences", "stop")
    return tuple(s for s in value if s)


def _common(body: Mapping[str, Any], endpoint: Endpoint) -> dict[str, Any]:
    """The fields both endpoints share, checked."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid("model is required (a string)", "model")
    best_of = _integer(body, "best_of")
    if best_of is not None and best_of != 1:
        raise ApiError.invalid(
            f"best_of={best_of} is not supported: ask for n choices instead", "best_of"
        )
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError.invalid("stream must be a boolean", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError.invalid(
                "stream_options is only allowed when stream is true", "stream_options"
            )
        if not isinstance(options, Mapping):
            raise ApiError.invalid("stream_options must be an object", "stream_options")
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise ApiError.invalid(
                "stream_options.include_usage must be a boolean", "stream_options"
            )
        include_usage = usage
    seed = _integer(body, "seed")
    if seed is not None and not 0 <= seed < 2**64:
        raise ApiError.invalid("seed must be between 0 and 2**64 - 1", "seed")
    user = body.get("user") or ""
    if not isinstance(user, str):
        raise ApiError.invalid("user must be a string", "user")
    timeout = body.get("timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ApiError.invalid("timeout must be a number of seconds", "timeout")
        if not math.isfinite(timeout) or timeout <= 0:
            raise ApiError.invalid("timeout must be a positive number of seconds", "timeout")
    top_k = _integer(body, "top_k")
    if top_k is not None and not 0 <= top_k <= 1024:
        raise ApiError.invalid("top_k must be between 0 (off) and 1024", "top_k")
    options = _engine_options(body, endpoint)
    if options is not None and options.n > 1 and stream:
        raise ApiError.invalid("n > 1 is answered unstreamed only: set stream to false", "n")
    return {
        "endpoint": endpoint,
        "model": model,
        "top_k": max(0, top_k or 0),
        "options": options,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0),
        "seed": seed,
        "stop": _stop(body),
        "stream": stream,
        "include_usage": include_usage,
        "user": user,
        "timeout_s": None if timeout is None else float(timeout),
    }


def _json_text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    return "" if value is None else json.dumps(value, separators=(",", ":"))


def _engine_options(
    body: Mapping[str, Any], endpoint: Endpoint
) -> inference_pb2.EngineOptions | None:
    """The fields only engine servers apply, checked (None when none is set)."""
    options = inference_pb2.EngineOptions()
    n = _integer(body, "n")
    if n is not None:
        if not 1 <= n <= MAX_CHOICES:
            raise ApiError.invalid(f"n must be between 1 and {MAX_CHOICES}, got {n}", "n")
        options.n = n if n > 1 else 0
    raw_logprobs = body.get("logprobs")
    if endpoint is Endpoint.CHAT:
        if raw_logprobs is not None and not isinstance(raw_logprobs, bool):
            raise ApiError.invalid("logprobs must be a boolean", "logprobs")
        options.logprobs = bool(raw_logprobs)
        top = _integer(body, "top_logprobs")
        if top is not None:
            if not 0 <= top <= MAX_TOP_LOGPROBS:
                raise ApiError.invalid(
                    f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs"
                )
            if top and not options.logprobs:
                raise ApiError.invalid("top_logprobs needs logprobs set to true", "top_logprobs")
            options.top_logprobs = top
    elif raw_logprobs is not None:  # completions: how many alternatives per token
        count = _integer(body, "logprobs")
        if count is None or not 0 <= count <= MAX_COMPLETION_LOGPROBS:
            raise ApiError.invalid(
                f"logprobs must be an integer between 0 and {MAX_COMPLETION_LOGPROBS}", "logprobs"
            )
        options.logprobs = True
        options.top_logprobs = count
    for name in ("presence_penalty", "frequency_penalty"):
        setattr(options, name, _number(body, name, 0.0, -2.0, 2.0))
    options.repetition_penalty = _number(body, "repetition_penalty", 0.0, 0.0, 10.0)
    options.min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise ApiError.invalid("logit_bias must map token ids to biases", "logit_bias")
        for token, value in bias.items():
            if not (isinstance(token, str) and token.isdigit()) or isinstance(value, bool):
                raise ApiError.invalid("logit_bias keys must be token ids", "logit_bias")
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise ApiError.invalid("logit_bias values must be numbers", "logit_bias")
            options.logit_bias[int(token)] = float(value)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        options.response_format_json = _json_text(body, "response_format")
    if body.get("tools") not in (None, []):
        options.tools_json = _json_text(body, "tools")
    if body.get("tool_choice") is not None and options.tools_json:
        options.tool_choice_json = _json_text(body, "tool_choice")
    elif body.get("tool_choice") not in (None, "none"):
        raise ApiError.invalid("tool_choice needs tools", "tool_choice")
    problem = options_problem(options)
    if problem is not None:  # its first word names the field
        raise ApiError.invalid(problem, problem.split(" ", 1)[0].split("[", 1)[0])
    return options if options.ByteSize() else None


def parse_completion(body: object, limits: GatewayLimits) -> GenerationCall:
    """A ``/v1/completions`` body as a call; :class:`ApiError` (400) when it is refused."""
    fields = _object(body)
    for name in _UNSUPPORTED_COMPLETION:
        value = fields.get(name)
        if value not in (None, False, 0, "", {}, []):
            raise ApiError.invalid(f"{name} is not supported", name)
    prompt = fields.get("prompt")
    token_ids: tuple[int, ...] = ()
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ApiError.invalid(
                "prompt must be a string, a list of token ids, or a list of one of them "
                "(one prompt per call)",
                "prompt",
            )
        if any(t < 0 for t in prompt):
            raise ApiError.invalid("token ids must be >= 0", "prompt")
        token_ids, prompt = tuple(prompt), ""
    elif not isinstance(prompt, str):
        raise ApiError.invalid("prompt is required (a string)", "prompt")
    if len(prompt) > limits.max_prompt_chars or len(token_ids) > limits.max_prompt_chars:
        raise ApiError.invalid(
            f"prompt is longer than this gateway's limit of {limits.max_prompt_chars}", "prompt"
        )
    return GenerationCall(
        prompt=prompt,
        token_ids=token_ids,
        max_tokens=_max_tokens(
            fields, ("max_tokens",), COMPLETION_DEFAULT_MAX_TOKENS, limits.max_tokens
        ),
        **_common(fields, Endpoint.COMPLETIONS),
    )


def _message_text(content: object, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ApiError.invalid(
                    f"messages[{index}].content: only text parts are supported, got {kind!r}",
                    "messages",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise ApiError.invalid(
                    f"messages[{index}].content: a text part needs a string 'text'", "messages"
                )
            texts.append(text)
        return "".join(texts)
    raise ApiError.invalid(f"messages[{index}].content must be a string", "messages")


def parse_messages(raw: object, limits: GatewayLimits) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise ApiError.invalid("messages must be a non-empty list", "messages")
    if len(raw) > limits.max_messages:
        raise ApiError.invalid(
            f"{len(raw)} messages; this gateway takes at most {limits.max_messages}", "messages"
        )
    messages = []
    chars = 0
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ApiError.invalid(f"messages[{i}] must be an object", "messages")
        try:
            role = ChatRole(item.get("role"))
        except ValueError:
            roles = ", ".join(r.value for r in ChatRole)
            raise ApiError.invalid(
                f"messages[{i}].role {item.get('role')!r} is not supported ({roles})", "messages"
            ) from None
        calls = _message_tool_calls(item.get("tool_calls"), i)
        content = item.get("content")
        text = "" if content is None and (calls or role is ChatRole.ASSISTANT) else None
        name = item.get("name") or ""
        call_id = item.get("tool_call_id") or ""
        if not isinstance(name, str) or not isinstance(call_id, str):
            raise ApiError.invalid(
                f"messages[{i}]: name and tool_call_id must be strings", "messages"
            )
        if role is ChatRole.TOOL and not call_id:
            raise ApiError.invalid(
                f"messages[{i}]: a tool message needs the tool_call_id it answers", "messages"
            )
        message = ChatMessage(
            role,
            text if text is not None else _message_text(content, i),
            name=name,
            tool_call_id=call_id,
            tool_calls=calls,
        )
        chars += len(message.content) + len(message.name) + len(message.tool_call_id)
        chars += sum(len(c.id) + len(c.name) + len(c.arguments) for c in message.tool_calls)
        if chars > limits.max_prompt_chars:  # checked before any template renders them
            raise ApiError.invalid(
                f"the messages are longer than this gateway's limit of "
                f"{limits.max_prompt_chars} characters",
                "messages",
            )
        messages.append(message)
    return messages


def _message_tool_calls(raw: object, index: int) -> tuple[ToolCall, ...]:
    """An assistant message's earlier tool calls (OpenAI's shape)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ApiError.invalid(f"messages[{index}].tool_calls must be a list", "messages")
    calls = []
    for call in raw:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ApiError.invalid(
                f"messages[{index}].tool_calls: each needs a function with a name", "messages"
            )
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, separators=(",", ":"))
        call_id = call.get("id", "")
        calls.append(
            ToolCall(call_id if isinstance(call_id, str) else "", function["name"], arguments)
        )
    return tuple(calls)


@dataclass(frozen=True)
class ChatDraft:
    """A chat call read and checked, its conversation not yet rendered: all the gateway
    keeps of a chat body (the body itself is dropped once this is read)."""

    call: GenerationCall
    """Every field but the prompt and the turn's end."""
    conversation: tuple[ChatMessage, ...]


def read_chat(body: object, limits: GatewayLimits) -> ChatDraft:
    """A ``/v1/chat/completions`` body checked field by field (400 when refused); the
    messages' total length is capped before any template sees them."""
    fields = _object(body)
    for name in _UNSUPPORTED_CHAT:
        if fields.get(name) not in (None, [], "none"):
            raise ApiError.invalid(f"{name} is not supported", name)
    messages = parse_messages(fields.get("messages"), limits)
    common = _common(fields, Endpoint.CHAT)
    call = GenerationCall(
        max_tokens=_max_tokens(
            fields,
            ("max_completion_tokens", "max_tokens"),
            limits.default_max_tokens,
            limits.max_tokens,
        ),
        messages=tuple(_message_pb(m) for m in messages),
        **common,
    )
    return ChatDraft(call, tuple(messages))


def render_chat(draft: ChatDraft, limits: GatewayLimits, template: ChatFormat) -> GenerationCall:
    """The draft's call with its conversation rendered by ``template``.

    A conversation the template rejects answers 400 with its reason; a template that
    fails on it answers 500 with a generic message (the failure is the answer's
    ``detail``, for the logs only).
    """
    try:
        prompt = template.render(draft.conversation)
    except ChatTemplateError as exc:
        if exc.rejected:
            raise ApiError.invalid(f"the model's chat template: {exc}", "messages") from exc
        raise ApiError(
            ErrorCode.INTERNAL,
            "the model's chat template failed on this conversation",
            openai_code="chat_template",
            detail=str(exc),
        ) from exc
    if len(prompt) > limits.max_prompt_chars:
        raise ApiError.invalid(
            f"the rendered conversation is longer than this gateway's limit of "
            f"{limits.max_prompt_chars} characters",
            "messages",
        )
    return replace(draft.call, prompt=prompt, turn_end=tuple(template.stop))


def parse_chat(body: object, limits: GatewayLimits, template: ChatFormat) -> GenerationCall:
    """A ``/v1/chat/completions`` body as a call, its messages rendered by ``template``
    (:func:`read_chat`, then :func:`render_chat`)."""
    return render_chat(read_chat(body, limits), limits, template)


def _message_pb(message: ChatMessage) -> inference_pb2.ChatMessage:
    pb = inference_pb2.ChatMessage(
        role=message.role.value,
        content=message.content,
        name=message.name,
        tool_call_id=message.tool_call_id,
    )
    for call in message.tool_calls:
        pb.tool_calls.add(id=call.id, name=call.name, arguments=call.arguments)
    return pb


# -- writing answers --------------------------------------------------------------------


def finish_reason(name: str) -> str:
    """OpenAI's finish reason for a ``graylane.v1.FinishReason`` name."""
    return _FINISH.get(name, "stop")


def _usage(usage: Usage | None) -> dict[str, int] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _fingerprint(version: str) -> str | None:
    return f"graylane:{version}" if version else None


def _token_logprob(entry: TokenLogprob) -> dict[str, Any]:
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.utf8 or entry.token.encode("utf-8")),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(b) if b else list(t.encode("utf-8"))}
            for t, lp, b in entry.top
        ],
    }


def logprobs_body(
    call: GenerationCall, entries: Sequence[TokenLogprob], *, offset: int = 0
) -> dict[str, Any] | None:
    """OpenAI's ``logprobs`` of a choice: the chat shape (``content``), or the completions
    shape (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset`` from
    ``offset``); None when they were not asked for."""
    if not call.logprobs_shape:
        return None
    if call.endpoint is Endpoint.CHAT:
        return {"content": [_token_logprob(e) for e in entries], "refusal": None}
    offsets = []
    at = offset
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{t: lp for t, lp, _ in e.top} for e in entries],
        "text_offset": offsets,
    }


def _tool_calls_body(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "id": call.id or f"call_{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for i, call in enumerate(calls)
    ]


def _choice(
    call: GenerationCall,
    index: int,
    text: str,
    finish: str,
    logprobs: Sequence[TokenLogprob],
    tool_calls: Sequence[ToolCall],
) -> dict[str, Any]:
    if call.endpoint is Endpoint.COMPLETIONS:
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs_body(call, logprobs),
            "finish_reason": finish_reason(finish),
        }
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = _tool_calls_body(tool_calls)
        message["content"] = text or None
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs_body(call, logprobs),
        "finish_reason": finish_reason(finish),
    }


def response_body(
    call: GenerationCall, *, request_id: str, created: int, result: Result
) -> dict[str, Any]:
    """The non-streamed answer (``text_completion`` or ``chat.completion``)."""
    choices = [
        _choice(call, 0, result.text, result.finish_reason, result.logprobs, result.tool_calls)
    ]
    extra: Sequence[Choice] = result.extra_choices
    choices.extend(
        _choice(call, c.index, c.text, c.finish_reason, c.logprobs, c.tool_calls) for c in extra
    )
    return {
        "id": call.endpoint.id_prefix + request_id,
        "object": call.endpoint.value,
        "created": created,
        "model": call.model,
        "system_fingerprint": _fingerprint(result.version),
        "choices": choices,
        "usage": _usage(result.usage),
    }


def stream_chunk(
    call: GenerationCall,
    *,
    request_id: str,
    created: int,
    text: str,
    finish: str | None,
    first: bool,
    version: str = "",
    logprobs: Sequence[TokenLogprob] = (),
    tool_calls: Sequence[ToolCall] = (),
    text_offset: int = 0,
) -> dict[str, Any]:
    """One streamed chunk; ``first`` opens the assistant's message (chat), ``finish``
    (a ``FinishReason`` name) closes the choice; ``tool_calls`` (the final chunk's) are
    sent whole in one delta."""
    reason = finish_reason(finish) if finish else None
    if call.endpoint is Endpoint.COMPLETIONS:
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": logprobs_body(call, logprobs, offset=text_offset) if logprobs else None,
            "finish_reason": reason,
        }
    else:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text or first:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = _tool_calls_body(tool_calls)
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": logprobs_body(call, logprobs) if logprobs else None,
            "finish_reason": reason,
        }
    chunk: dict[str, Any] = {
        "id": call.endpoint.id_prefix + request_id,
        "object": call.endpoint.chunk_object,
        "created": created,
        "model": call.model,
        "system_fingerprint": _fingerprint(version),
        "choices": [choice],
    }
    if call.include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(
    call: GenerationCall, *, request_id: str, created: int, usage: Usage | None, version: str
) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices."""
    return {
        "id": call.endpoint.id_prefix + request_id,
        "object": call.endpoint.chunk_object,
        "created": created,
        "model": call.model,
        "system_fingerprint": _fingerprint(version),
        "choices": [],
        "usage": _usage(usage or Usage(0, 0)),
    }


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"


def models_body(models: Sequence[str], created: int = 0) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {"object": "list", "data": [model_card(m, created) for m in models]}


def model_card(model: str, created: int = 0) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": created, "owned_by": "graylane"}
