"""Output agreement of shadow pairs: the candidate's answer vs the baseline's.

The router mirrors a sampled share of requests to the candidate and stamps
both halves with its own ``shadow_pair_id`` (it clears whatever a client sent
there); the workers echo it on the results. :class:`AgreementTracker` pairs
answers on that id, never on the client's ``request_id`` (two requests may share
one), with a bounded map of results still waiting for their other half (oldest
dropped first when full) and time-based expiry, and keeps the outcomes of
completed pairs so a window's agreement can be read with
:meth:`AgreementTracker.stats`. An answer without a pair id (from a router or
worker that predates it) pairs only with another such answer, by request id.

Outputs are reduced to small plain data by whoever reads the results topic
(token ids of a generation, a class label, or a short vector) and compared by
:func:`outputs_agree`. Redelivered results (at-least-once) are recognised by
pair id and ignored, both while waiting and for a while after pairing.

Generations compare token sequences, which is meaningful only when decoding is
deterministic: both answers *greedy* (temperature 0) or sampled with the *same
seed* (the shadow copy carries the request's seed). A pair where either side
sampled without a seed is not compared and not counted (``unseeded``): two
such answers differ by chance. :class:`AgreementStats` says which basis its
pairs had.

Before a pair is compared, the output schemas (names, dtypes, shapes) of both
answers are: a mismatch (a new head with more classes, a renamed output) makes
the pair *incomparable*. It is not counted as a pair; the first mismatch is
kept and reported by :meth:`AgreementTracker.stats`, so the controller can stop
the shadow phase instead of promoting on a meaningless agreement figure.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "AgreementStats",
    "AgreementTracker",
    "OutputField",
    "PairResult",
    "SchemaMismatch",
    "ShadowOutput",
    "TokenDecoding",
    "describe_schema",
    "outputs_agree",
    "schema_mismatch",
]


@dataclass(frozen=True)
class OutputField:
    """One output tensor's name, element type and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.name}:{self.dtype}[{','.join(str(d) for d in self.shape)}]"


def describe_schema(fields: tuple[OutputField, ...]) -> str:
    """A canonical text of an answer's outputs (sorted by name), e.g. ``logits:float32[1,10]``."""
    return " ".join(f.describe() for f in sorted(fields, key=lambda f: f.name)) or "(no outputs)"


@dataclass(frozen=True)
class SchemaMismatch:
    """Baseline and candidate answers with different outputs, each as :func:`describe_schema`."""

    baseline: str
    candidate: str

    def __str__(self) -> str:
        return f"baseline outputs {self.baseline} vs candidate outputs {self.candidate}"


class TokenDecoding(Enum):
    """How a generation chose its tokens (what makes two of them comparable)."""

    GREEDY = "greedy"
    SEEDED = "seeded"
    UNSEEDED = "unseeded"


@dataclass(frozen=True)
class AgreementStats:
    pairs: int = 0
    agreeing: int = 0
    mismatch: SchemaMismatch | None = None
    greedy: int = 0
    """Pairs of generations compared under greedy decoding (of ``pairs``)."""
    seeded: int = 0
    """Pairs of generations compared under the same seed (of ``pairs``)."""
    unseeded: int = 0
    """Pairs of generations sampled without a seed: not compared, not in ``pairs``."""

    def __post_init__(self) -> None:
        if not 0 <= self.agreeing <= self.pairs:
            raise ValueError(f"{self.agreeing} agreeing of {self.pairs} pairs is impossible")
        if min(self.greedy, self.seeded, self.unseeded) < 0 or (
            self.greedy + self.seeded > self.pairs
        ):
            raise ValueError(f"decoding counts do not fit {self.pairs} pairs: {self}")

    @property
    def basis(self) -> str:
        """What the pairs compared: token sequences under greedy decoding or the same
        seed (with how many of each), or outputs; and the pairs left out."""
        parts = []
        if self.greedy:
            parts.append(f"{self.greedy} under greedy decoding")
        if self.seeded:
            parts.append(f"{self.seeded} under the same seed")
        text = "token sequences: " + ", ".join(parts) if parts else "outputs"
        if self.unseeded:
            text += f"; {self.unseeded} sampled without a seed not compared"
        return text

    @property
    def rate(self) -> float:
        """Share of agreeing pairs; 0.0 without pairs."""
        return self.agreeing / self.pairs if self.pairs else 0.0

    @property
    def disagreeing(self) -> int:
        return self.pairs - self.agreeing

    @property
    def comparable(self) -> bool:
        """False once a baseline/candidate pair had different output schemas."""
        return self.mismatch is None

    def merge(self, other: AgreementStats) -> AgreementStats:
        return AgreementStats(
            self.pairs + other.pairs,
            self.agreeing + other.agreeing,
            self.mismatch if self.mismatch is not None else other.mismatch,
            greedy=self.greedy + other.greedy,
            seeded=self.seeded + other.seeded,
            unseeded=self.unseeded + other.unseeded,
        )


@dataclass(frozen=True, kw_only=True)
class ShadowOutput:
    """One version's answer to one request, reduced for comparison."""

    request_id: str
    version: str
    at_ms: int
    tokens: tuple[int, ...] | None = None
    label: int | None = None
    vector: tuple[float, ...] | None = None
    error: bool = False
    schema: tuple[OutputField, ...] | None = None
    """The outputs' names, dtypes and shapes; None when unknown (not checked)."""
    pair_id: str = ""
    """The router's shadow pair id; "" from a router or worker that predates it."""
    decoding: TokenDecoding | None = None
    """Generations: how the tokens were chosen; None when unknown (compared as is)."""
    text: str | None = None
    """Generations: the answer's text (compared by similarity when sampled, see
    :mod:`~graylane.policy_engine.logic.text_agreement`)."""
    prompt_digest: str = ""
    """Generations: the worker's digest of the prompt and sampling parameters (not the
    seed); "" when unknown."""

    @property
    def pair_key(self) -> tuple[bool, str]:
        """What pairs it: the router's pair id, else (older records) the request id."""
        return (True, self.pair_id) if self.pair_id else (False, self.request_id)


def outputs_agree(
    a: ShadowOutput, b: ShadowOutput, *, rtol: float = 1e-2, atol: float = 1e-3
) -> bool:
    """Whether two answers agree.

    Two errors agree, an error and an answer do not. Otherwise the first kind
    both carry decides: token ids must be equal, labels equal, vectors close
    (``|a - b| <= atol + rtol * |b|`` elementwise). Answers with nothing in
    common to compare disagree.
    """
    if a.error or b.error:
        return a.error and b.error
    if a.tokens is not None and b.tokens is not None:
        return a.tokens == b.tokens
    if a.label is not None and b.label is not None:
        return a.label == b.label
    if a.vector is not None and b.vector is not None:
        return len(a.vector) == len(b.vector) and all(
            abs(x - y) <= atol + rtol * abs(y) for x, y in zip(a.vector, b.vector, strict=True)
        )
    return False


class _Side(Enum):
    BASELINE = "baseline"
    CANDIDATE = "candidate"


@dataclass(frozen=True)
class PairResult:
    request_id: str
    """The request id of the pair's baseline answer (for logs; pairs are keyed by pair id)."""
    completed_at_ms: int
    agreed: bool
    basis: TokenDecoding | None = None
    """Generations: GREEDY when both sides decoded greedily, SEEDED when they sampled
    with the request's seed; None for other answers."""


class AgreementTracker:
    """Pairs baseline and candidate answers by the router's pair id (bounded, expiring)."""

    def __init__(
        self,
        baseline: str,
        candidate: str,
        *,
        max_pending: int = 10_000,
        ttl_ms: int = 30_000,
        max_results: int = 100_000,
        rtol: float = 1e-2,
        atol: float = 1e-3,
    ) -> None:
        if baseline == candidate:
            raise ValueError("baseline and candidate must differ")
        if max_pending <= 0 or ttl_ms <= 0 or max_results <= 0:
            raise ValueError("limits must be positive")
        self.baseline = baseline
        self.candidate = candidate
        self.max_pending = max_pending
        self.ttl_ms = ttl_ms
        self.rtol = rtol
        self.atol = atol
        self._pending: dict[tuple[bool, str], tuple[_Side, ShadowOutput]] = {}
        self._results: deque[PairResult] = deque(maxlen=max_results)
        self._recent: deque[tuple[bool, str]] = deque(maxlen=max_pending)
        self._recent_set: set[tuple[bool, str]] = set()
        self.expired = 0
        self.evicted = 0
        self.duplicates = 0
        self.foreign = 0
        self.mismatch: SchemaMismatch | None = None
        self._unseeded: deque[int] = deque(maxlen=max_results)
        """When each pair left out for unseeded sampling completed."""

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, output: ShadowOutput) -> PairResult | None:
        """Take one answer; returns the pair's outcome when this completes one."""
        if output.version == self.baseline:
            side = _Side.BASELINE
        elif output.version == self.candidate:
            side = _Side.CANDIDATE
        else:
            self.foreign += 1
            return None
        rid = output.pair_key
        if rid in self._recent_set:
            self.duplicates += 1
            return None
        waiting = self._pending.get(rid)
        if waiting is None:
            self._pending[rid] = (side, output)
            if len(self._pending) > self.max_pending:
                del self._pending[next(iter(self._pending))]
                self.evicted += 1
            return None
        other_side, other = waiting
        if other_side is side:
            self.duplicates += 1
            return None
        del self._pending[rid]
        base, cand = (other, output) if side is _Side.CANDIDATE else (output, other)
        self._remember(rid)
        mismatch = schema_mismatch(base, cand)
        if mismatch is not None:
            if self.mismatch is None:
                self.mismatch = mismatch
            return None
        basis = _basis(base, cand)
        if basis is TokenDecoding.UNSEEDED:
            self._unseeded.append(max(base.at_ms, cand.at_ms))
            return None
        result = PairResult(
            base.request_id,
            max(base.at_ms, cand.at_ms),
            outputs_agree(cand, base, rtol=self.rtol, atol=self.atol),
            basis,
        )
        self._results.append(result)
        return result

    def _remember(self, rid: tuple[bool, str]) -> None:
        if len(self._recent) == self._recent.maxlen:
            self._recent_set.discard(self._recent[0])
        self._recent.append(rid)
        self._recent_set.add(rid)

    def expire(self, now_ms: int) -> int:
        """Drop answers that waited longer than ``ttl_ms`` for their pair."""
        stale = [
            rid for rid, (_, out) in self._pending.items() if out.at_ms + self.ttl_ms <= now_ms
        ]
        for rid in stale:
            del self._pending[rid]
        self.expired += len(stale)
        return len(stale)

    def stats(self, since_ms: int | None = None, until_ms: int | None = None) -> AgreementStats:
        """Agreement of pairs completed in ``[since_ms, until_ms)`` (unbounded when None)."""

        def within(at_ms: int) -> bool:
            return (since_ms is None or at_ms >= since_ms) and (
                until_ms is None or at_ms < until_ms
            )

        pairs = agreeing = greedy = seeded = 0
        for r in self._results:
            if not within(r.completed_at_ms):
                continue
            pairs += 1
            agreeing += r.agreed
            greedy += r.basis is TokenDecoding.GREEDY
            seeded += r.basis is TokenDecoding.SEEDED
        unseeded = sum(1 for at in self._unseeded if within(at))
        return AgreementStats(
            pairs, agreeing, self.mismatch, greedy=greedy, seeded=seeded, unseeded=unseeded
        )


def _basis(baseline: ShadowOutput, candidate: ShadowOutput) -> TokenDecoding | None:
    """How a pair of generations can be compared: UNSEEDED when either side sampled
    without a seed, SEEDED when either sampled with one, GREEDY when both were greedy;
    None when either is not a generation (no tokens, no text) or does not say."""
    if (baseline.tokens is None and baseline.text is None) or (
        candidate.tokens is None and candidate.text is None
    ):
        return None
    ways = {baseline.decoding, candidate.decoding}
    if TokenDecoding.UNSEEDED in ways:
        return TokenDecoding.UNSEEDED
    if None in ways:
        return None
    return TokenDecoding.SEEDED if TokenDecoding.SEEDED in ways else TokenDecoding.GREEDY


def schema_mismatch(baseline: ShadowOutput, candidate: ShadowOutput) -> SchemaMismatch | None:
    """The two answers' schemas when both are known, neither is an error, and they differ."""
    if baseline.schema is None or candidate.schema is None or baseline.error or candidate.error:
        return None
    b, c = describe_schema(baseline.schema), describe_schema(candidate.schema)
    return None if b == c else SchemaMismatch(b, c)
