"""Which ingress requests the router refuses, and why (pure, in the order checked).

A request is refused when it is larger than the broker-facing limit, has a field
beyond its cap, names a model this router does not serve or one other than its ingress
topic's, asks for a reply topic outside ``<p>.reply.*`` / ``<p>.results.<model>``, or
arrives after its deadline. The first reason found is the answer; the router replies
with it (an error result) instead of forwarding.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from graylane.errors import ErrorCode, Rejection, clip

__all__ = ["IngressFacts", "refusal"]


@dataclass(frozen=True, kw_only=True)
class IngressFacts:
    """What the intake rules judge of one ingress request (gathered by the wire)."""

    size_bytes: int
    model: str
    topic_model: str
    """The model whose ingress topic the request came from."""
    field_problem: str | None
    """Why a field is beyond its cap (None: all within)."""
    reply_problem: Rejection | None
    """Why the reply topic it names is refused (None: allowed)."""
    deadline_unix_ms: int
    """0: none."""


def refusal(
    facts: IngressFacts, *, limit_bytes: int, served: Collection[str], now_ms: int
) -> Rejection | None:
    """The first reason to refuse the request, or None to route it."""
    if facts.size_bytes > limit_bytes:
        return Rejection(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request is {facts.size_bytes} bytes; the limit is {limit_bytes}",
        )
    if facts.field_problem is not None:
        return Rejection(ErrorCode.BAD_REQUEST, facts.field_problem)
    if facts.model not in served:
        return Rejection(
            ErrorCode.UNKNOWN_MODEL,
            f"model {clip(facts.model)!r} is not served here; "
            f"known models: {', '.join(sorted(served))}",
        )
    if facts.model != facts.topic_model:
        return Rejection(
            ErrorCode.BAD_REQUEST,
            f"request for model {clip(facts.model)!r} arrived on the ingress of "
            f"{facts.topic_model!r}",
        )
    if facts.reply_problem is not None:
        return facts.reply_problem
    if facts.deadline_unix_ms and facts.deadline_unix_ms < now_ms:
        return Rejection(
            ErrorCode.DEADLINE_EXCEEDED,
            f"deadline {facts.deadline_unix_ms} passed before routing",
        )
    return None
