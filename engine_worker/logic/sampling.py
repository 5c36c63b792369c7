"""How a generating sequence picks its next token and where it stops (pure numpy).

:class:`SamplingParams` is what a GENERATE request asks for, checked when it is
made. Temperature 0 (the default) is greedy decoding: exactly ``int(np.argmax(logits))``,
so a request that asks for nothing new gets the tokens it always got. Otherwise the
next token is drawn from ``softmax(logits / temperature)`` (float64), restricted first
to the ``top_k`` most likely tokens, then to the smallest set of those whose probability
reaches ``top_p`` (nucleus), and renormalized (:func:`next_token_probs`).

Each sequence has its own :class:`TokenSampler` and its own
``numpy.random.Generator``, seeded by the request's seed (unseeded: from the OS's
entropy). One uniform draw per token, read against the distribution of the sequence's
own logits: a seeded request gives the same tokens on the same variant whatever else
shares its batch and in whatever order.

Stop strings are matched on the decoded text of the generated tokens
(:class:`StopStrings`): the answer's text ends before the earliest stop string, and a
stop string may span several tokens. :meth:`StopStrings.safe_length` tells a streaming
caller how much text can go out now because no stop string can still start in it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from graylane.errors import ErrorCode, GraylaneError

__all__ = [
    "GREEDY",
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "MAX_STOP_TOKEN_IDS",
    "SamplingError",
    "SamplingParams",
    "StopMatch",
    "StopStrings",
    "TextCut",
    "TokenSampler",
    "next_token_probs",
    "tokens_before",
]

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 64
"""Longest stop string, in characters."""
MAX_STOP_TOKEN_IDS = 64
MAX_SEED = 2**64 - 1
"""The wire's seed is a uint64."""


class SamplingError(GraylaneError, ValueError):
    """Sampling parameters a request may not ask for (answered ``BAD_REQUEST``)."""

    code = ErrorCode.BAD_REQUEST


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How one sequence chooses its tokens and when it stops; checked when made."""

    temperature: float = 0.0
    """0: greedy (argmax); > 0: sample from softmax(logits / temperature)."""
    top_p: float = 0.0
    """Nucleus filtering: keep the smallest set of likeliest tokens whose probability
    reaches it, in (0, 1]; 0 (or 1) keeps every token."""
    top_k: int = 0
    """Keep the ``top_k`` likeliest tokens (ties: lower id first); 0 keeps every token."""
    seed: int | None = None
    """Seeds the sequence's generator; ``None`` draws from the OS's entropy."""
    stop_token_ids: tuple[int, ...] = ()
    """Producing one of these finishes the sequence (the token is not kept)."""
    stop: tuple[str, ...] = ()
    """Text containing one of these finishes the sequence (the text is cut before it)."""

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise SamplingError(problem)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _problem(p: SamplingParams) -> str | None:
    if not isinstance(p.temperature, int | float) or not math.isfinite(p.temperature):
        return f"temperature must be a finite number, got {p.temperature!r}"
    if p.temperature < 0:
        return f"temperature must be >= 0 (0 = greedy), got {p.temperature}"
    if not isinstance(p.top_p, int | float) or not math.isfinite(p.top_p):
        return f"top_p must be a finite number, got {p.top_p!r}"
    if not 0.0 <= p.top_p <= 1.0:
        return f"top_p must be in [0, 1] (0 = off), got {p.top_p}"
    if not isinstance(p.top_k, int) or p.top_k < 0:
        return f"sampling top_k must be >= 0 (0 = off), got {p.top_k!r}"
    if p.seed is not None and (not isinstance(p.seed, int) or not 0 <= p.seed <= MAX_SEED):
        return f"seed must be in [0, 2**64), got {p.seed!r}"
    if not isinstance(p.stop_token_ids, tuple) or not isinstance(p.stop, tuple):
        return "stop_token_ids and stop must be tuples"
    if len(p.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        return f"{len(p.stop_token_ids)} stop_token_ids; the limit is {MAX_STOP_TOKEN_IDS}"
    if any(not isinstance(t, int) or t < 0 for t in p.stop_token_ids):
        return f"stop_token_ids must be ids >= 0, got {list(p.stop_token_ids)[:8]}"
    if len(p.stop) > MAX_STOP_STRINGS:
        return f"{len(p.stop)} stop strings; the limit is {MAX_STOP_STRINGS}"
    for s in p.stop:
        if not isinstance(s, str) or not s:
            return "stop strings must be non-empty text"
        if len(s) > MAX_STOP_CHARS:
            return f"a stop string is {len(s)} characters; the limit is {MAX_STOP_CHARS}"
    return None


GREEDY = SamplingParams()
"""Greedy decoding, no stop ids or strings: what a request that asks for nothing gets."""


# --- the distribution and the draw -----------------------------------------------------


def _support(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Token ids that may be drawn, ascending, and their probabilities (float64, > 0,
    summing to 1)."""
    x = np.asarray(logits, dtype=np.float64).ravel()
    if x.size == 0:
        raise SamplingError("cannot sample from an empty logits vector")
    x = np.where(np.isnan(x), -np.inf, x)
    top = x.max()
    if top == np.inf:  # infinitely likely tokens share all the mass
        ids = np.flatnonzero(x == np.inf)
        return ids, np.full(ids.size, 1.0 / ids.size)
    if top == -np.inf:  # nothing is likely: fall back to the greedy choice
        return np.array([int(np.argmax(logits))]), np.ones(1)
    k = params.top_k
    if 0 < k < x.size:
        kth = np.partition(x, x.size - k)[x.size - k]
        above = np.flatnonzero(x > kth)
        ties = np.flatnonzero(x == kth)[: k - above.size]  # lower ids first
        ids = np.concatenate([above, ties])
    else:
        ids = np.flatnonzero(x > -np.inf)
    if 0.0 < params.top_p < 1.0:
        ids = ids[np.lexsort((ids, -x[ids]))]  # likeliest first, ties: lower id first
    # Scaled after ordering: the order comes from the exact logits.
    weights = np.exp((x[ids] - top) / params.temperature)
    probs = weights / weights.sum()
    if 0.0 < params.top_p < 1.0:
        reach = int(np.searchsorted(np.cumsum(probs), params.top_p, side="left")) + 1
        ids, probs = ids[:reach], probs[:reach]
        probs = probs / probs.sum()
    order = np.argsort(ids)
    ids, probs = ids[order], probs[order]
    drawable = probs > 0  # drop tokens whose weight underflowed
    return ids[drawable], probs[drawable]


def next_token_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution a sampled token is drawn from: one float64 per id, summing to 1.

    For greedy params, all the mass on ``argmax(logits)``.
    """
    flat = np.asarray(logits).ravel()
    out = np.zeros(flat.size, dtype=np.float64)
    if params.greedy:
        out[int(np.argmax(flat))] = 1.0
        return out
    ids, probs = _support(flat, params)
    out[ids] = probs
    return out


class TokenSampler:
    """One sequence's token choices and stops: greedy, or one seeded draw per token.

    ``decode`` (the tokenizer's) turns generated tokens into text; stop strings need it.
    """

    __slots__ = ("_decode", "_rng", "_stop_ids", "_stops", "params")

    def __init__(
        self,
        params: SamplingParams = GREEDY,
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        if params.stop and decode is None:
            raise SamplingError("stop strings need the model's tokenizer to decode text")
        self.params = params
        self._rng = None if params.greedy else np.random.default_rng(params.seed)
        self._stop_ids = frozenset(params.stop_token_ids)
        self._stops = StopStrings(params.stop)
        self._decode = decode

    def choose(self, logits: np.ndarray) -> int:
        """The next token from this sequence's logits vector [vocab].

        Sampled: one uniform ``u`` from the sequence's generator, read against the
        cumulative probabilities of the kept tokens in id order.
        """
        if self._rng is None:
            return int(np.argmax(logits))
        ids, probs = _support(logits, self.params)
        u = self._rng.random()  # exactly one draw per token, whatever the support
        cdf = np.cumsum(probs)
        pick = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), ids.size - 1)
        return int(ids[pick])

    def stops_on(self, token: int) -> bool:
        """Whether ``token`` is one of the request's stop token ids."""
        return token in self._stop_ids

    def cut(self, generated: Sequence[int]) -> TextCut | None:
        """Where the generation stops if its text now holds a stop string."""
        if self._decode is None:
            return None
        return self._stops.cut(generated, self._decode)


# --- stop strings ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StopMatch:
    stop: str
    """The stop string found (the longest of those found at the earliest position)."""
    cut: int
    """Where it starts: the text to return is ``text[:cut]``."""


@dataclass(frozen=True, slots=True)
class TextCut:
    """A generation stopped by a stop string: its kept tokens and its cut text."""

    tokens: int
    """How many generated tokens to keep: those that begin before the cut."""
    text: str


@dataclass(frozen=True, slots=True)
class StopStrings:
    """A request's stop strings, matched against its generated text."""

    stops: tuple[str, ...]

    def find(self, text: str) -> StopMatch | None:
        """The earliest stop string in ``text``, if any."""
        best: StopMatch | None = None
        for stop in self.stops:
            at = text.find(stop)
            if at < 0:
                continue
            if best is None or at < best.cut or (at == best.cut and len(stop) > len(best.stop)):
                best = StopMatch(stop, at)
        return best

    def safe_length(self, text: str) -> int:
        """How much of ``text`` can be emitted now: it cannot hold or begin a stop string.

        Neither past the start of a stop string found nor into the longest end of
        ``text`` that some stop string starts with (more text may complete it, and a
        longer stop string begun earlier would cut earlier).
        """
        found = self.find(text)
        held = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:n]):
                    held = n
                    break
        # A longer stop string that began before a found one may still complete there.
        return min(found.cut if found is not None else len(text), len(text) - held)

    def cut(self, tokens: Sequence[int], decode: Callable[[Sequence[int]], str]) -> TextCut | None:
        """Where the text of ``tokens`` stops, if it holds a stop string."""
        if not self.stops:
            return None
        text = decode(tokens)
        found = self.find(text)
        if found is None:
            return None
        head = text[: found.cut]
        return TextCut(tokens_before(tokens, decode, head), head)


def tokens_before(tokens: Sequence[int], decode: Callable[[Sequence[int]], str], head: str) -> int:
    """The fewest leading tokens whose text begins with ``head`` (the text before a cut).

    Tokens wholly after the cut are dropped; one that straddles it is kept, and so are
    all the tokens of a character that several tokens spell (a multi-byte character).
    """
    n = len(tokens)
    while n > 0 and decode(tokens[: n - 1]).startswith(head):
        n -= 1
    return n
