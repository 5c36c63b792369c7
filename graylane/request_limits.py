"""Length and range caps on the identifying fields of an ``InferenceRequest`` (pure).

Router and workers refuse a request over a cap with ``BAD_REQUEST``; messages
quote at most a short prefix of the offending value, never the whole of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from graylane.v1 import inference_pb2

__all__ = ["MAX_TOP_K", "FieldCaps", "clip", "field_problem"]

MAX_TOP_K = 1024
"""The largest ``top_k`` a request may ask for."""


@dataclass(frozen=True, kw_only=True)
class FieldCaps:
    """Longest accepted value (characters) of each identifying field."""

    request_id: int = 256
    model: int = 128
    version: int = 128
    routing_key: int = 512
    reply_topic: int = 249  # Kafka's own topic-name limit
    tag: int = 256
    tags: int = 64


def clip(text: str, limit: int = 80) -> str:
    """``text`` shortened for a log line or an error message."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def field_problem(
    request: inference_pb2.InferenceRequest, caps: FieldCaps = FieldCaps()
) -> str | None:
    """Why ``request`` breaks a cap, or None."""
    fields = (
        ("request_id", request.request_id, caps.request_id),
        ("model", request.model, caps.model),
        ("pinned_version", request.pinned_version, caps.version),
        ("routed_version", request.routed_version, caps.version),
        ("routing_key", request.routing_key, caps.routing_key),
        ("reply_topic", request.reply_topic, caps.reply_topic),
    )
    for name, value, limit in fields:
        if len(value) > limit:
            return f"{name} is {len(value)} characters; the limit is {limit}"
    if len(request.tags) > caps.tags:
        return f"{len(request.tags)} tags; the limit is {caps.tags}"
    for key, value in request.tags.items():
        if len(key) > caps.tag or len(value) > caps.tag:
            return f"tag {clip(key, 40)!r} is longer than {caps.tag} characters"
    if not 0 <= request.top_k <= MAX_TOP_K:
        return f"top_k must be in 0..{MAX_TOP_K}, got {request.top_k}"
    if request.generation.max_new_tokens < 0:
        return f"max_new_tokens must not be negative, got {request.generation.max_new_tokens}"
    if request.deadline_unix_ms < 0 or request.created_at_unix_ms < 0:
        return "timestamps must not be negative"
    return None
