"""One generation as an engine server's OpenAI call, and its answer read back (pure).

An engine-served ``GENERATE`` (:mod:`~graylane.engine_worker.engine_server`) becomes
one streamed call: a conversation (``messages``) goes to ``/v1/chat/completions``, so
the engine applies the chat template it was deployed with; a text or token prompt goes
to ``/v1/completions``. :func:`build_call` writes the body from the request and its
validated work item: the sampling (temperature 0 is greedy; ``top_p``, ``top_k``,
``seed``, ``stop`` strings and token ids), ``max_tokens``, and the options only
engines apply (``n``, ``logprobs``, ``response_format``, ``tools``, penalties,
``logit_bias``, ``min_p``), always ``stream`` with ``stream_options.include_usage``
so that the last event counts the tokens.

The answer is server-sent events, ``data: {...}`` lines ending with ``data: [DONE]``.
:func:`read_event` turns one line into an :class:`EngineEvent` (each choice's new
text, log probabilities, tool-call fragments and finish reason; the usage) or an
:class:`EngineFault` (the engine's error event, or bytes that are no event);
:class:`ChoiceText` gathers a choice across events. :func:`http_rejection` is the
refusal for a call the engine answered with an HTTP error: the caller's fault (4xx:
``BAD_REQUEST``, ``SEQUENCE_TOO_LONG``; the engine's message is for the caller),
overload (429: ``SHED``), not ready (503: ``ENGINE_UNAVAILABLE``) or the version's
own failure (5xx: ``ENGINE_FAILURE``, a generic message).

Engines differ in a few names, taken from :class:`~graylane.artifacts.naming.Backend`:
llama.cpp calls the repetition penalty ``repeat_penalty``; the others
``repetition_penalty``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from graylane.artifacts.naming import Backend
from graylane.engine_worker.requests import WorkItem
from graylane.errors import ErrorCode, Rejection, clip
from graylane.v1 import inference_pb2

__all__ = [
    "DONE",
    "ChoiceDelta",
    "ChoiceText",
    "EngineAnswer",
    "EngineCall",
    "EngineEvent",
    "EngineFault",
    "Route",
    "ToolCallPiece",
    "build_call",
    "finish_reason",
    "http_rejection",
    "read_event",
]

DONE = "[DONE]"
"""The data of the last event of a stream."""
MAX_ERROR_CHARS = 512
"""The longest engine error message passed on to a caller."""


class Route(Enum):
    """Which OpenAI endpoint a call goes to."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


@dataclass(frozen=True)
class EngineCall:
    """The HTTP call: its route and its JSON body."""

    route: Route
    body: Mapping[str, Any]


def _messages(request: inference_pb2.InferenceRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in request.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name:
            message["name"] = m.name
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in m.tool_calls
            ]
            if not m.content:
                message["content"] = None
        out.append(message)
    return out


def _f(value: float) -> float:
    """A float the wire carried in 32 bits, as the caller wrote it (0.7, not 0.69999998)."""
    return float(f"{value:.6g}")


def build_call(
    request: inference_pb2.InferenceRequest,
    work: WorkItem,
    *,
    served_model: str,
    backend: Backend,
) -> EngineCall:
    """The streamed call that generates ``request`` (its ``work`` checked already)."""
    sampling = work.sampling
    chat = len(request.messages) > 0
    body: dict[str, Any] = {
        "model": served_model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": work.max_new_tokens,
        "temperature": _f(sampling.temperature),
    }
    if chat:
        body["messages"] = _messages(request)
    elif work.prompt_text:
        body["prompt"] = work.prompt_text
    else:
        body["prompt"] = list(work.prompt_tokens)
    if 0.0 < sampling.top_p < 1.0:
        body["top_p"] = _f(sampling.top_p)
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    turn_end = set(request.generation.turn_end)
    stops = [s for s in sampling.stop if s not in turn_end]
    if stops:
        body["stop"] = stops
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    options = request.engine_options
    if options.n > 1:
        body["n"] = options.n
    if options.logprobs:
        if chat:
            body["logprobs"] = True
            if options.top_logprobs:
                body["top_logprobs"] = options.top_logprobs
        else:  # the completions endpoint counts the alternatives in `logprobs`
            body["logprobs"] = max(1, options.top_logprobs)
    if options.response_format_json:
        body["response_format"] = json.loads(options.response_format_json)
    if options.tools_json:
        body["tools"] = json.loads(options.tools_json)
    if options.tool_choice_json:
        body["tool_choice"] = json.loads(options.tool_choice_json)
    if options.presence_penalty:
        body["presence_penalty"] = _f(options.presence_penalty)
    if options.frequency_penalty:
        body["frequency_penalty"] = _f(options.frequency_penalty)
    if options.repetition_penalty:
        name = "repeat_penalty" if backend is Backend.LLAMACPP else "repetition_penalty"
        body[name] = _f(options.repetition_penalty)
    if options.logit_bias:
        body["logit_bias"] = {str(t): _f(b) for t, b in sorted(options.logit_bias.items())}
    if options.min_p:
        body["min_p"] = _f(options.min_p)
    return EngineCall(Route.CHAT if chat else Route.COMPLETIONS, body)


# -- reading the stream ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    """A fragment of one tool call (OpenAI streams a call's arguments in pieces)."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """What one event adds to one choice."""

    index: int
    text: str = ""
    logprobs: tuple[inference_pb2.TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCallPiece, ...] = ()
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One event of the stream: each choice's new part, and the usage when it comes."""

    choices: tuple[ChoiceDelta, ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def tokens_seen(self) -> int:
        """Pieces of generated output in this event: one per choice that grew (an
        engine streams a token per event; the usage gives the exact count at the end)."""
        return sum(1 for c in self.choices if c.text or c.logprobs or c.tool_calls)


@dataclass(frozen=True, slots=True)
class EngineFault:
    """The engine's error event, or bytes that are no event: the call failed."""

    rejection: Rejection


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _number(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return -math.inf if value is None else 0.0


def _bytes(value: object) -> bytes:
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value)
    return b""


def _chat_logprobs(raw: object) -> tuple[inference_pb2.TokenLogprob, ...]:
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list):
        return ()
    out = []
    for item in content:
        if not isinstance(item, dict):
            continue
        entry = inference_pb2.TokenLogprob(
            token=_text(item.get("token")),
            logprob=_number(item.get("logprob")),
            bytes=_bytes(item.get("bytes")),
        )
        for alt in item.get("top_logprobs") or ():
            if isinstance(alt, dict):
                entry.top_logprobs.add(
                    token=_text(alt.get("token")),
                    logprob=_number(alt.get("logprob")),
                    bytes=_bytes(alt.get("bytes")),
                )
        out.append(entry)
    return tuple(out)


def _completion_logprobs(raw: object) -> tuple[inference_pb2.TokenLogprob, ...]:
    if not isinstance(raw, dict):
        return ()
    if isinstance(raw.get("content"), list):  # some engines answer in the chat shape
        return _chat_logprobs(raw)
    tokens = raw.get("tokens")
    values = raw.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return ()
    tops = raw.get("top_logprobs")
    out = []
    for i, token in enumerate(tokens):
        entry = inference_pb2.TokenLogprob(
            token=_text(token), logprob=_number(values[i] if i < len(values) else None)
        )
        alts = tops[i] if isinstance(tops, list) and i < len(tops) else None
        if isinstance(alts, dict):
            for alt_token, alt_logprob in alts.items():
                entry.top_logprobs.add(token=str(alt_token), logprob=_number(alt_logprob))
        out.append(entry)
    return tuple(out)


def _tool_pieces(raw: object) -> tuple[ToolCallPiece, ...]:
    if not isinstance(raw, list):
        return ()
    pieces = []
    for position, item in enumerate(raw):
        if not isinstance(item, dict):
            continue
        raw_function = item.get("function")
        function: dict[str, Any] = raw_function if isinstance(raw_function, dict) else {}
        index = item.get("index")
        pieces.append(
            ToolCallPiece(
                index=index if isinstance(index, int) and not isinstance(index, bool) else position,
                id=_text(item.get("id")),
                name=_text(function.get("name")),
                arguments=_text(function.get("arguments")),
            )
        )
    return tuple(pieces)


def _choice(raw: dict[str, Any], position: int) -> ChoiceDelta:
    index = raw.get("index")
    index = index if isinstance(index, int) and not isinstance(index, bool) else position
    reason = raw.get("finish_reason")
    delta = raw.get("delta")
    if isinstance(delta, dict):  # chat
        return ChoiceDelta(
            index=index,
            text=_text(delta.get("content")),
            logprobs=_chat_logprobs(raw.get("logprobs")),
            tool_calls=_tool_pieces(delta.get("tool_calls")),
            finish_reason=reason if isinstance(reason, str) else None,
        )
    message = raw.get("message")
    if isinstance(message, dict):  # an engine that answers a stream's end unstreamed
        return ChoiceDelta(
            index=index,
            text=_text(message.get("content")),
            logprobs=_chat_logprobs(raw.get("logprobs")),
            tool_calls=_tool_pieces(message.get("tool_calls")),
            finish_reason=reason if isinstance(reason, str) else None,
        )
    return ChoiceDelta(  # completions
        index=index,
        text=_text(raw.get("text")),
        logprobs=_completion_logprobs(raw.get("logprobs")),
        finish_reason=reason if isinstance(reason, str) else None,
    )


def _error_event(raw: object) -> Rejection:
    """The rejection for an ``{"error": ...}`` event in a stream (after a 200)."""
    error = raw if isinstance(raw, dict) else {}
    code = error.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else 500
    return http_rejection(status, json.dumps({"error": error}))


def read_event(data: str) -> EngineEvent | EngineFault:
    """One event's ``data`` (without ``data: ``; not ``[DONE]``) as what it says."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return EngineFault(_garbage("an event that is not JSON"))
    if not isinstance(raw, dict):
        return EngineFault(_garbage("an event that is not a JSON object"))
    if "error" in raw:
        return EngineFault(_error_event(raw["error"]))
    choices_raw = raw.get("choices", [])
    if not isinstance(choices_raw, list):
        return EngineFault(_garbage("an event whose choices are not a list"))
    choices = tuple(_choice(c, i) for i, c in enumerate(choices_raw) if isinstance(c, dict))
    usage = raw.get("usage")
    prompt = completion = None
    if isinstance(usage, dict):
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
        prompt = p if isinstance(p, int) and not isinstance(p, bool) and p >= 0 else None
        completion = c if isinstance(c, int) and not isinstance(c, bool) and c >= 0 else None
    return EngineEvent(choices, prompt, completion)


def _garbage(what: str) -> Rejection:
    return Rejection(ErrorCode.ENGINE_FAILURE, f"the engine server sent {what}")


@dataclass
class ChoiceText:
    """One choice gathered across the events of a stream."""

    index: int
    text: str = ""
    logprobs: list[inference_pb2.TokenLogprob] = field(default_factory=list)
    tool_calls: dict[int, inference_pb2.ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None

    def add(self, delta: ChoiceDelta) -> None:
        self.text += delta.text
        self.logprobs.extend(delta.logprobs)
        for piece in delta.tool_calls:
            call = self.tool_calls.setdefault(piece.index, inference_pb2.ToolCall())
            call.id = call.id or piece.id
            call.name = call.name or piece.name  # some engines repeat it in every piece
            call.arguments += piece.arguments
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason

    def calls(self) -> list[inference_pb2.ToolCall]:
        return [self.tool_calls[i] for i in sorted(self.tool_calls)]


@dataclass(frozen=True, kw_only=True)
class EngineAnswer:
    """What an engine server answered one generation, and when (unix ms) its tokens came."""

    choices: tuple[tuple[ChoiceText, inference_pb2.FinishReason], ...]
    """Each choice, in order, with its ``graylane.v1.FinishReason``."""
    prompt_tokens: int
    completion_tokens: int
    """The engine's own count (its usage), over every choice."""
    started_ms: int
    """When the call began (the request left the worker's queue)."""
    first_token_ms: int
    last_token_ms: int
    inter_token_p99_ms: float


_FINISH: dict[str, inference_pb2.FinishReason] = {
    "stop": inference_pb2.EOS,
    "eos": inference_pb2.EOS,
    "length": inference_pb2.LENGTH,
    "tool_calls": inference_pb2.TOOL_CALLS,
    "function_call": inference_pb2.TOOL_CALLS,
    "content_filter": inference_pb2.STOP,
}


def finish_reason(
    reason: str | None, *, stopped_by_string: bool = False
) -> inference_pb2.FinishReason:
    """``graylane.v1.FinishReason`` of an engine's finish reason. OpenAI's ``stop``
    covers both the model's end of sequence and a stop string: ``STOP`` when the
    request named stop strings and one ended it, else ``EOS``."""
    if reason == "stop" and stopped_by_string:
        return inference_pb2.STOP
    return _FINISH.get(reason or "", inference_pb2.FAILED)


# -- refusals ----------------------------------------------------------------------------


def _engine_message(body: str) -> tuple[str, str]:
    """The error message and type an engine's error body holds (OpenAI's shape, or
    vLLM's and llama.cpp's variants); the raw text clipped when it has none."""
    try:
        raw = json.loads(body) if body else None
    except (ValueError, RecursionError):
        raw = None
    error = raw.get("error", raw) if isinstance(raw, dict) else None
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or ""
        kind = error.get("type") or ""
        return clip(str(message), MAX_ERROR_CHARS), str(kind)
    if isinstance(error, str):
        return clip(error, MAX_ERROR_CHARS), ""
    return clip(body.strip(), MAX_ERROR_CHARS), ""


_CONTEXT_WORDS = ("context length", "context size", "maximum context", "exceed_context")


def http_rejection(status: int, body: str) -> Rejection:
    """The refusal for a call the engine answered with HTTP ``status`` and ``body``."""
    message, kind = _engine_message(body)
    if status == 429:
        return Rejection(ErrorCode.SHED, f"the engine server is at capacity: {message}")
    if status == 503:
        return Rejection(ErrorCode.ENGINE_UNAVAILABLE, "the engine server is not ready")
    if status == 404:  # a model name the engine does not serve: the version's configuration
        return Rejection(
            ErrorCode.ENGINE_FAILURE, f"the engine server does not serve this model: {message}"
        )
    if 400 <= status < 500:
        lowered = f"{kind} {message}".lower()
        if any(word in lowered for word in _CONTEXT_WORDS):
            return Rejection(ErrorCode.SEQUENCE_TOO_LONG, message or "prompt too long")
        return Rejection(
            ErrorCode.BAD_REQUEST, message or f"the engine refused the call ({status})"
        )
    return Rejection(ErrorCode.ENGINE_FAILURE, f"the engine server failed (HTTP {status})")
