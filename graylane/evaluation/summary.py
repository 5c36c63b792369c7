"""A target's scores on a set, and two targets compared on the same items (pure).

A :class:`Summary` is the mean item score with a 95 % confidence interval (normal, from
the items' standard error: sets of tens to hundreds of items), the pass count and the
calls that failed. :func:`compare` pairs two targets' scores item by item: the mean
difference with its 95 % interval, and a two-sided p-value from a paired permutation test
(random sign flips of the per-item differences, seeded, so the same scores give the same
p): no assumption about how item scores are distributed, which matters for 0/1 scores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from graylane.evaluation.scoring import ItemScore

__all__ = ["Comparison", "Summary", "compare", "summarize"]

Z95 = 1.959963984540054
PERMUTATIONS = 10_000


@dataclass(frozen=True)
class Summary:
    target: str
    items: int
    mean: float
    ci_low: float
    ci_high: float
    passed: int
    errors: int

    @property
    def half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2.0


@dataclass(frozen=True)
class Comparison:
    """``candidate`` minus ``baseline`` on the items both answered."""

    baseline: str
    candidate: str
    items: int
    difference: float
    ci_low: float
    ci_high: float
    p_value: float

    def drops_more_than(self, allowance: float) -> bool:
        """The candidate scores lower than the baseline by more than ``allowance``."""
        return -self.difference > allowance


def _mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = Z95 * math.sqrt(var / n)
    return mean, mean - half, mean + half


def summarize(target: str, scores: Sequence[ItemScore]) -> Summary:
    mean, low, high = _mean_ci([s.score for s in scores])
    return Summary(
        target=target,
        items=len(scores),
        mean=mean,
        ci_low=max(0.0, low),
        ci_high=min(1.0, high),
        passed=sum(1 for s in scores if s.passed),
        errors=sum(1 for s in scores if s.error),
    )


def _permutation_p(diffs: Sequence[float], seed: int) -> float:
    observed = abs(sum(diffs))
    if observed == 0.0:
        return 1.0
    rng = random.Random(seed)
    extreme = 0
    for _ in range(PERMUTATIONS):
        total = sum(d if rng.random() < 0.5 else -d for d in diffs)
        if abs(total) >= observed - 1e-12:
            extreme += 1
    return (extreme + 1) / (PERMUTATIONS + 1)


def compare(
    baseline: str,
    base_scores: Sequence[ItemScore],
    candidate: str,
    cand_scores: Sequence[ItemScore],
    *,
    seed: int = 0,
) -> Comparison:
    """The candidate against the baseline on the items both were scored on."""
    base = {s.item_id: s.score for s in base_scores}
    cand = {s.item_id: s.score for s in cand_scores}
    common = [i for i in base if i in cand]
    diffs = [cand[i] - base[i] for i in common]
    mean, low, high = _mean_ci(diffs)
    return Comparison(
        baseline=baseline,
        candidate=candidate,
        items=len(common),
        difference=mean,
        ci_low=low,
        ci_high=high,
        p_value=_permutation_p(diffs, seed),
    )
