"""What an engine-served generation may ask for beyond Graylane's own decoder: one check.

A ``GENERATE`` request may carry the conversation (``messages``) and OpenAI options
that engine servers apply and the native decoder does not (``EngineOptions``: ``n``,
``logprobs``, ``response_format``, ``tools``, penalties, ``logit_bias``, ``min_p``).
:func:`options_problem` checks them, types and ranges (the gateway before it sends, the
engine-server worker again, since any producer can write to the ingress);
:func:`native_refusal` names the first one a native worker cannot honour, so it answers
``BAD_REQUEST`` instead of silently ignoring it.

Pure module: no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from graylane.v1 import inference_pb2

__all__ = [
    "CHAT_ROLES",
    "MAX_CHOICES",
    "MAX_LOGIT_BIAS",
    "MAX_MESSAGES",
    "MAX_OPTION_JSON_CHARS",
    "MAX_TOOL_CALLS",
    "MAX_TOP_LOGPROBS",
    "RESPONSE_FORMATS",
    "messages_problem",
    "native_refusal",
    "options_problem",
]

MAX_CHOICES = 8
"""The most choices (``n``) one call may ask for."""
MAX_TOP_LOGPROBS = 20
"""OpenAI's limit on ``top_logprobs``."""
MAX_LOGIT_BIAS = 300
"""Entries of ``logit_bias`` (OpenAI allows 300)."""
MAX_OPTION_JSON_CHARS = 256 * 1024
"""Longest ``response_format`` / ``tools`` / ``tool_choice`` JSON text."""
MAX_MESSAGES = 1024
"""Messages of one conversation."""
MAX_TOOL_CALLS = 64
"""Tool calls of one assistant message."""
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
RESPONSE_FORMATS = frozenset({"text", "json_object", "json_schema"})
_TOOL_CHOICES = frozenset({"none", "auto", "required"})


def _json(text: str, what: str) -> tuple[object, str | None]:
    if len(text) > MAX_OPTION_JSON_CHARS:
        return None, f"{what} is longer than {MAX_OPTION_JSON_CHARS} characters"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError):
        return None, f"{what} is not valid JSON"


def _response_format_problem(text: str) -> str | None:
    value, problem = _json(text, "response_format")
    if problem is not None:
        return problem
    if not isinstance(value, dict) or value.get("type") not in RESPONSE_FORMATS:
        kinds = ", ".join(sorted(RESPONSE_FORMATS))
        return f"response_format must be an object whose type is one of {kinds}"
    if value["type"] == "json_schema":
        schema = value.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("schema", {}), dict):
            return "response_format json_schema needs an object 'json_schema' with a 'schema'"
    return None


def _tools_problem(text: str) -> str | None:
    value, problem = _json(text, "tools")
    if problem is not None:
        return problem
    if not isinstance(value, list) or not value:
        return "tools must be a non-empty list"
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}"
    return None


def _tool_choice_problem(text: str) -> str | None:
    value, problem = _json(text, "tool_choice")
    if problem is not None:
        return problem
    if isinstance(value, str):
        return (
            None
            if value in _TOOL_CHOICES
            else f"tool_choice {value!r} is not one of none, auto, required"
        )
    function = value.get("function") if isinstance(value, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return "tool_choice must be none, auto, required or a function {'function': {'name': ...}}"
    return None


def options_problem(options: inference_pb2.EngineOptions) -> str | None:
    """Why ``options`` cannot be sent to an engine, or None."""
    if not 0 <= options.n <= MAX_CHOICES:
        return f"n must be between 1 and {MAX_CHOICES}, got {options.n}"
    if not 0 <= options.top_logprobs <= MAX_TOP_LOGPROBS:
        return f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {options.top_logprobs}"
    if options.top_logprobs and not options.logprobs:
        return "top_logprobs needs logprobs"
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(options, name)
        if not math.isfinite(value) or not -2.0 <= value <= 2.0:
            return f"{name} must be between -2 and 2, got {value}"
    rep = options.repetition_penalty
    if not math.isfinite(rep) or rep < 0.0 or rep > 10.0:
        return f"repetition_penalty must be between 0 (the engine's default) and 10, got {rep}"
    if not math.isfinite(options.min_p) or not 0.0 <= options.min_p <= 1.0:
        return f"min_p must be between 0 and 1, got {options.min_p}"
    if len(options.logit_bias) > MAX_LOGIT_BIAS:
        return f"logit_bias has {len(options.logit_bias)} entries; the limit is {MAX_LOGIT_BIAS}"
    for token, bias in options.logit_bias.items():
        if token < 0 or not math.isfinite(bias) or not -100.0 <= bias <= 100.0:
            return "logit_bias maps token ids (>= 0) to biases between -100 and 100"
    if options.response_format_json:
        problem = _response_format_problem(options.response_format_json)
        if problem is not None:
            return problem
    if options.tools_json:
        problem = _tools_problem(options.tools_json)
        if problem is not None:
            return problem
    if options.tool_choice_json:
        if not options.tools_json:
            return "tool_choice needs tools"
        return _tool_choice_problem(options.tool_choice_json)
    return None


def messages_problem(messages: Sequence[inference_pb2.ChatMessage]) -> str | None:
    """Why a conversation cannot be sent to an engine, or None."""
    if len(messages) > MAX_MESSAGES:
        return f"{len(messages)} messages; the limit is {MAX_MESSAGES}"
    for i, message in enumerate(messages):
        if message.role not in CHAT_ROLES:
            roles = ", ".join(sorted(CHAT_ROLES))
            return f"messages[{i}].role {message.role[:32]!r} is not one of {roles}"
        if message.tool_calls and message.role != "assistant":
            return f"messages[{i}]: only an assistant message calls tools"
        if len(message.tool_calls) > MAX_TOOL_CALLS:
            return f"messages[{i}] has more than {MAX_TOOL_CALLS} tool calls"
        if message.role == "tool" and not message.tool_call_id:
            return f"messages[{i}]: a tool message needs the tool_call_id it answers"
    return None


def native_refusal(request: inference_pb2.InferenceRequest) -> str | None:
    """The first option of ``request`` that Graylane's native decoder cannot honour
    (its name, for the refusal's message), or None."""
    options = request.engine_options
    checks = (
        ("n", options.n > 1),
        ("logprobs", options.logprobs or options.top_logprobs > 0),
        ("response_format", bool(options.response_format_json)),
        ("tools", bool(options.tools_json or options.tool_choice_json)),
        ("presence_penalty", options.presence_penalty != 0.0),
        ("frequency_penalty", options.frequency_penalty != 0.0),
        ("repetition_penalty", options.repetition_penalty != 0.0),
        ("logit_bias", bool(options.logit_bias)),
        ("min_p", options.min_p != 0.0),
        ("tool messages", any(m.role == "tool" or m.tool_calls for m in request.messages)),
    )
    for name, used in checks:
        if used:
            return name
    return None
