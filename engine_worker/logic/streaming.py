"""Streaming a generation, and remembering cancels (pure: no clock, no I/O).

A streamed generation goes out as ordered chunks: :class:`StreamPolicy` says when one is
due (``every_tokens`` new tokens or ``every_ms`` since the last, whichever first; the
first token at once, it is the time to first token), :class:`StreamCursor` how far a
generation has been published, and :func:`safe_text` holds back text that may still be
cut by a stop string or ends inside a UTF-8 character. A chunk is a :class:`ChunkPiece`
(its place in the stream and what is new in it); the worker's wire turns it into a
result chunk. :func:`gap_p99` is one generation's inter-token p99;
Times are given by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from graylane.engine_worker.logic.sampling import StopStrings

__all__ = ["ChunkPiece", "StreamCursor", "StreamPolicy", "gap_p99", "safe_text"]


@dataclass(frozen=True, kw_only=True)
class StreamPolicy:
    """When a streamed generation publishes a chunk (whichever comes first)."""

    every_tokens: int = 4
    """New tokens that make a chunk."""
    every_ms: float = 50.0
    """Time since the previous chunk that makes one (once a new token is there)."""

    def __post_init__(self) -> None:
        if self.every_tokens < 1 or self.every_ms < 0:
            raise ValueError(f"stream policy needs every_tokens >= 1, every_ms >= 0: {self}")

    def for_request(self, every_tokens: int, every_ms: float) -> StreamPolicy:
        """The request's own chunking where it names one (0 keeps the worker's)."""
        return StreamPolicy(
            every_tokens=every_tokens or self.every_tokens,
            every_ms=float(every_ms or self.every_ms),
        )


def safe_text(text: str, stops: Sequence[str] = ()) -> str:
    """The part of ``text`` that may be streamed now: without a trailing incomplete
    UTF-8 character (decoded as U+FFFD) and without a suffix that could begin a stop
    string (the final text may still be cut there)."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    return text[: StopStrings(tuple(stops)).safe_length(text[:end])]


@dataclass(frozen=True, slots=True)
class ChunkPiece:
    """What one chunk carries: its place in the stream and what is new in it."""

    sequence: int
    token_ids: tuple[int, ...]
    text: str
    final: bool


@dataclass(slots=True)
class StreamCursor:
    """How far one streamed generation has been published."""

    policy: StreamPolicy
    stops: tuple[str, ...] = ()
    sequence: int = 0
    tokens_sent: int = 0
    text_sent: str = ""
    last_ms: float = 0.0

    def due(self, tokens: int, at_ms: float) -> bool:
        """Whether ``tokens`` generated so far make a chunk now."""
        new = tokens - self.tokens_sent
        if new <= 0:
            return False
        if self.sequence == 0:
            return True  # the first token goes out at once: it is the time to first token
        return new >= self.policy.every_tokens or at_ms - self.last_ms >= self.policy.every_ms

    def take(self, tokens: Sequence[int], text: str, at_ms: float) -> ChunkPiece:
        """The next chunk of a running generation (``text``: all its text so far)."""
        shown = safe_text(text, self.stops)
        if not shown.startswith(self.text_sent):
            shown = self.text_sent  # decoding changed earlier text: wait for the final
        return self._piece(tokens, shown, at_ms, final=False)

    def finish(self, tokens: Sequence[int], text: str, at_ms: float) -> ChunkPiece:
        """The final chunk: the rest of the tokens and of the (final) text."""
        return self._piece(tokens, text, at_ms, final=True)

    def _piece(self, tokens: Sequence[int], text: str, at_ms: float, *, final: bool) -> ChunkPiece:
        new_text = text[len(self.text_sent) :] if text.startswith(self.text_sent) else text
        piece = ChunkPiece(self.sequence, tuple(tokens[self.tokens_sent :]), new_text, final)
        self.sequence += 1
        self.tokens_sent = len(tokens)
        self.text_sent = text if text.startswith(self.text_sent) else self.text_sent + text
        self.last_ms = at_ms
        return piece


def gap_p99(gaps_ms: Sequence[float]) -> float:
    """The nearest-rank p99 of one generation's inter-token gaps; 0.0 without any."""
    if not gaps_ms:
        return 0.0
    ordered = sorted(gaps_ms)
    rank = max(1, math.ceil(0.99 * len(ordered) - 1e-9))
    return ordered[rank - 1]
