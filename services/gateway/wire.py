"""OpenAI's JSON <-> the SDK's generation arguments and results (pure, no I/O).

``POST /v1/completions`` and ``POST /v1/chat/completions`` bodies are read into a
:class:`GenerationCall` (checked field by field, refusals name the field as OpenAI
does in ``error.param``); a call becomes the arguments of
:meth:`graylane.client.GraylaneClient.infer` / ``stream`` (a ``GENERATE``
``InferenceRequest``); results and streamed chunks become OpenAI's response
objects and server-sent-event chunks.

Defaults follow OpenAI's: ``temperature`` 1, ``top_p`` 1 (off), ``max_tokens`` 16 for
completions and the gateway's ``default_max_tokens`` for chat; ``n`` (and
``best_of``) other than 1, ``echo``, ``logprobs``, ``suffix``, ``logit_bias``, penalties
and tools are refused, never silently ignored. Finish reasons map ``LENGTH`` and
``MAX_SEQUENCE`` to ``length``, ``STOP`` and ``EOS`` to ``stop``. The served version
is the response's ``system_fingerprint`` (``graylane:<version>``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from graylane.client import Usage
from graylane.services.gateway.admission import GatewayLimits
from graylane.services.gateway.chat import ChatFormat, ChatMessage, ChatRole, ChatTemplateError
from graylane.services.gateway.failures import ApiError, ErrorType

__all__ = [
    "MAX_STOP_SEQUENCES",
    "SSE_DONE",
    "Endpoint",
    "GenerationCall",
    "finish_reason",
    "model_card",
    "models_body",
    "parse_chat",
    "parse_completion",
    "parse_messages",
    "response_body",
    "sse_event",
    "stream_chunk",
    "usage_chunk",
]

MAX_STOP_SEQUENCES = 4
"""OpenAI's limit on ``stop``."""
COMPLETION_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` of ``/v1/completions``."""
SSE_DONE = b"data: [DONE]\n\n"

_FINISH = {"LENGTH": "length", "MAX_SEQUENCE": "length", "STOP": "stop", "EOS": "stop"}
_UNSUPPORTED_COMPLETION = ("echo", "logprobs", "suffix", "logit_bias")
_UNSUPPORTED_CHAT = ("tools", "functions", "tool_choice", "audio", "modalities", "prediction")


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

    def sdk_arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``GraylaneClient.infer`` / ``stream`` for this call."""
        # top_p 1 keeps every token (no nucleus); top_p 0 keeps only the likeliest: greedy.
        args: dict[str, Any] = {
            "max_new_tokens": self.max_tokens,
            "temperature": 0.0 if self.top_p == 0.0 else self.temperature,
            "top_p": 0.0 if self.top_p in (0.0, 1.0) else self.top_p,
            "seed": self.seed,
            "stop": list(self.stop),
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
    for name in ("n", "best_of"):
        n = _integer(body, name)
        if n is not None and n != 1:
            raise ApiError.invalid(
                f"{name}={n} is not supported: Graylane generates one choice per call "
                "(send several calls instead)",
                name,
            )
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise ApiError.invalid(f"{name} is not supported", name)
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
    return {
        "endpoint": endpoint,
        "model": model,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0),
        "seed": seed,
        "stop": _stop(body),
        "stream": stream,
        "include_usage": include_usage,
        "user": user,
        "timeout_s": None if timeout is None else float(timeout),
    }


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
        messages.append(ChatMessage(role, _message_text(item.get("content"), i)))
    return messages


def parse_chat(body: object, limits: GatewayLimits, template: ChatFormat) -> GenerationCall:
    """A ``/v1/chat/completions`` body as a call, its messages rendered by ``template``.

    A conversation the template rejects answers 400 with its reason; a template that
    fails on it answers 500 with the failure.
    """
    fields = _object(body)
    for name in _UNSUPPORTED_CHAT:
        if fields.get(name) not in (None, [], "none"):
            raise ApiError.invalid(f"{name} is not supported", name)
    if fields.get("logprobs") or fields.get("top_logprobs"):
        raise ApiError.invalid("logprobs are not supported", "logprobs")
    if fields.get("logit_bias"):
        raise ApiError.invalid("logit_bias is not supported", "logit_bias")
    fmt = fields.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        raise ApiError.invalid(
            "only response_format {'type': 'text'} is supported", "response_format"
        )
    messages = parse_messages(fields.get("messages"), limits)
    try:
        prompt = template.render(messages)
    except ChatTemplateError as exc:
        if exc.rejected:
            raise ApiError.invalid(f"the model's chat template: {exc}", "messages") from exc
        raise ApiError(500, str(exc), type=ErrorType.SERVER, code="chat_template") from exc
    if len(prompt) > limits.max_prompt_chars:
        raise ApiError.invalid(
            f"the rendered conversation is longer than this gateway's limit of "
            f"{limits.max_prompt_chars} characters",
            "messages",
        )
    common = _common(fields, Endpoint.CHAT)
    stops = tuple(dict.fromkeys((*common.pop("stop"), *template.stop)))
    return GenerationCall(
        prompt=prompt,
        max_tokens=_max_tokens(
            fields,
            ("max_completion_tokens", "max_tokens"),
            limits.default_max_tokens,
            limits.max_tokens,
        ),
        stop=stops,
        **common,
    )


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


def response_body(
    call: GenerationCall,
    *,
    request_id: str,
    created: int,
    text: str,
    finish: str,
    usage: Usage | None,
    version: str,
) -> dict[str, Any]:
    """The non-streamed answer (``text_completion`` or ``chat.completion``)."""
    if call.endpoint is Endpoint.COMPLETIONS:
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason(finish),
        }
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason(finish),
        }
    return {
        "id": call.endpoint.id_prefix + request_id,
        "object": call.endpoint.value,
        "created": created,
        "model": call.model,
        "system_fingerprint": _fingerprint(version),
        "choices": [choice],
        "usage": _usage(usage),
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
) -> dict[str, Any]:
    """One streamed chunk; ``first`` opens the assistant's message (chat), ``finish``
    (a ``FinishReason`` name) closes the choice."""
    reason = finish_reason(finish) if finish else None
    if call.endpoint is Endpoint.COMPLETIONS:
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": reason,
        }
    else:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text or first:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
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
