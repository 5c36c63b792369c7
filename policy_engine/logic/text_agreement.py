"""Shadow agreement on text: sampled generations compared by how alike their texts are.

Two sampled answers of one model to one prompt differ by chance, so an exact comparison
calls every sampled pair a disagreement, and a fixed similarity threshold is either too
strict for an open question or too lenient for a closed one. What a same-model candidate
must match is the baseline's *own* variation, measured on the same prompts at the same
time. Each scored pair therefore has a control:

- the pair: the baseline's answer ``b_i`` and the candidate's ``c_i`` to one request;
- its control: ``b_j``, the baseline's answer to an earlier shadowed request with the
  same prompt and sampling parameters (the worker's ``prompt_sha256``; the seed is not
  part of it);
- its score: ``d_i = sim(c_i, b_i) - sim(b_j, b_i)``, with ``sim`` the chrF of the first
  text against the second (0..1, the evaluation scorers' metric).

When the candidate is the same model, ``c_i`` and ``b_j`` are two independent draws for
the prompt, exchangeable given ``b_i``: ``d_i`` is symmetric about 0, whatever the
prompt, the temperature or the model. A candidate that answers otherwise (another system
prompt, a lower precision rung, another model) moves ``sim(c_i, b_i)`` down and ``d_i``
below 0.

The test (:func:`drift_wealth`) is anytime-valid: a mixture of betting martingales
``W = mean_k prod_i (1 - lambda_k (d_i + tolerance))`` over a few fixed bets
``lambda_k``. Under "the mean of ``d`` is at least ``-tolerance``" each product is a
non-negative supermartingale, so ``W`` reaches ``1 / alpha`` with probability at most
``alpha`` however often it is looked at (Ville's inequality); a drift makes it grow
geometrically. ``tolerance`` (``Gates.max_similarity_drop``) keeps a real but negligible
difference from being called a regression after enough pairs.

A pair whose prompt has no earlier baseline answer is kept only as a control for later
pairs (``uncontrolled``); greedy pairs stay with the exact-token comparison
(:mod:`~graylane.policy_engine.logic.agreement`), which this module does not replace.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graylane.evaluation.scoring import chrf
from graylane.policy_engine.logic.agreement import ShadowOutput, TokenDecoding
from graylane.policy_engine.logic.gates import GateResult, Verdict
from graylane.rollouts.spec import Gates
from graylane.rollouts.vocabulary import DecisionRule

__all__ = [
    "BETS",
    "TextAgreementStats",
    "TextAgreementTracker",
    "TextPairScore",
    "drift_wealth",
    "text_agreement_gate",
    "text_similarity",
]

BETS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7)
"""The mixture's bets: small ones win on slight drifts, large ones on gross ones. At most
1 / (1 + tolerance) so that every factor stays non-negative."""


def text_similarity(answer: str, reference: str) -> float:
    """chrF of ``answer`` against ``reference``, 0..1 (two empty texts are alike)."""
    if not answer and not reference:
        return 1.0
    return chrf(answer, reference) / 100.0


@dataclass(frozen=True)
class TextPairScore:
    """One controlled pair: the candidate's similarity to the baseline's answer and the
    control's (another baseline answer to the same prompt)."""

    at_ms: int
    similarity: float
    self_similarity: float

    @property
    def difference(self) -> float:
        return self.similarity - self.self_similarity


def drift_wealth(differences: Sequence[float], tolerance: float) -> float:
    """The log of the mixture wealth against "mean difference >= -tolerance" (0: none)."""
    if not differences:
        return 0.0
    logs = []
    for bet in BETS:
        total = 0.0
        for d in differences:
            factor = 1.0 - bet * (d + tolerance)
            if factor <= 0.0:
                total = -math.inf
                break
            total += math.log(factor)
        logs.append(total)
    top = max(logs)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(x - top) for x in logs) / len(logs))


@dataclass(frozen=True)
class TextAgreementStats:
    """The controlled text pairs of a period and the drift test over them."""

    pairs: int = 0
    similarity: float = 0.0
    """Mean similarity of the candidate's answers to the baseline's."""
    self_similarity: float = 0.0
    """Mean similarity of the controls (the baseline's answers to each other)."""
    log_wealth: float = 0.0
    uncontrolled: int = 0
    """Pairs with no earlier baseline answer to their prompt: not scored."""

    def drifted(self, alpha: float) -> bool:
        return self.log_wealth >= math.log(1.0 / alpha)

    def describe(self) -> str:
        return (
            f"text similarity {self.similarity:.3f} vs the baseline's own "
            f"{self.self_similarity:.3f} over {self.pairs} sampled pairs "
            f"(evidence {math.exp(min(self.log_wealth, 700.0)):.3g})"
        )


def text_agreement_gate(stats: TextAgreementStats, gates: Gates) -> GateResult:
    """FAIL once the drift test rejects at ``gates.alpha``; PASS while it has not."""
    threshold = 1.0 / gates.alpha
    detail = f"{stats.describe()}; drift when the evidence reaches {threshold:g}"
    verdict = Verdict.FAIL if stats.drifted(gates.alpha) else Verdict.PASS
    return GateResult(DecisionRule.TEXT_AGREEMENT, verdict, detail)


def _sampled(output: ShadowOutput) -> bool:
    return output.text is not None and output.decoding in (
        TokenDecoding.SEEDED,
        TokenDecoding.UNSEEDED,
    )


class TextAgreementTracker:
    """Pairs sampled generations by the router's pair id and scores them against a
    control from the baseline's earlier answers to the same prompt (bounded, expiring)."""

    def __init__(
        self,
        baseline: str,
        candidate: str,
        *,
        max_pending: int = 10_000,
        ttl_ms: int = 30_000,
        max_prompts: int = 10_000,
        max_results: int = 100_000,
        similarity: Callable[[str, str], float] = text_similarity,
    ) -> None:
        if baseline == candidate:
            raise ValueError("baseline and candidate must differ")
        self.baseline = baseline
        self.candidate = candidate
        self.max_pending = max_pending
        self.ttl_ms = ttl_ms
        self.max_prompts = max_prompts
        self.similarity = similarity
        self._pending: dict[tuple[bool, str], ShadowOutput] = {}
        self._controls: OrderedDict[str, str] = OrderedDict()
        self._scores: deque[TextPairScore] = deque(maxlen=max_results)
        self._uncontrolled: deque[int] = deque(maxlen=max_results)
        self._done: set[tuple[bool, str]] = set()
        self._done_order: deque[tuple[bool, str]] = deque(maxlen=max_pending)

    def add(self, output: ShadowOutput) -> TextPairScore | None:
        """Take one answer; the pair's score when this completes a controlled pair."""
        if output.version not in (self.baseline, self.candidate) or output.error:
            return None
        if not _sampled(output):
            return None
        key = output.pair_key
        if key in self._done:
            return None
        other = self._pending.get(key)
        if other is None or other.version == output.version:
            self._pending[key] = output
            if len(self._pending) > self.max_pending:
                del self._pending[next(iter(self._pending))]
            return None
        del self._pending[key]
        self._finish(key)
        base, cand = (output, other) if output.version == self.baseline else (other, output)
        return self._score(base, cand)

    def _finish(self, key: tuple[bool, str]) -> None:
        if len(self._done_order) == self._done_order.maxlen:
            self._done.discard(self._done_order[0])
        self._done_order.append(key)
        self._done.add(key)

    def _score(self, base: ShadowOutput, cand: ShadowOutput) -> TextPairScore | None:
        at = max(base.at_ms, cand.at_ms)
        prompt = base.prompt_digest
        if not prompt or prompt != cand.prompt_digest:
            self._uncontrolled.append(at)
            return None
        base_text, cand_text = base.text or "", cand.text or ""
        control = self._controls.pop(prompt, None)
        self._controls[prompt] = base_text  # the newest answer controls the next pair
        if len(self._controls) > self.max_prompts:
            self._controls.popitem(last=False)
        if control is None:
            self._uncontrolled.append(at)
            return None
        score = TextPairScore(
            at,
            self.similarity(cand_text, base_text),
            self.similarity(control, base_text),
        )
        self._scores.append(score)
        return score

    def expire(self, now_ms: int) -> int:
        stale = [k for k, out in self._pending.items() if out.at_ms + self.ttl_ms <= now_ms]
        for k in stale:
            del self._pending[k]
        return len(stale)

    def stats(self, tolerance: float, since_ms: int | None = None) -> TextAgreementStats:
        """The controlled pairs completed since ``since_ms`` and the drift test over them."""
        scores = [s for s in self._scores if since_ms is None or s.at_ms >= since_ms]
        uncontrolled = sum(1 for at in self._uncontrolled if since_ms is None or at >= since_ms)
        if not scores:
            return TextAgreementStats(uncontrolled=uncontrolled)
        n = len(scores)
        return TextAgreementStats(
            pairs=n,
            similarity=sum(s.similarity for s in scores) / n,
            self_similarity=sum(s.self_similarity for s in scores) / n,
            log_wealth=drift_wealth([s.difference for s in scores], tolerance),
            uncontrolled=uncontrolled,
        )
