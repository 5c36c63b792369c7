"""An engine-served version's rungs scored on an evaluation set (``engine.evaluation``).

Each endpoint answers every item of the set (greedy, through the same runner as
``graylane eval``); the first rung of the ladder is the reference. A rung's quality cost
is the reference's mean item score minus its own on the same items; a rung that costs
more than ``max_drop``, or whose calls failed, is refused: not published, and the build
is not ok (exit 2). The scores of the published rungs are recorded in the registry as
their measured quality (what ``graylane model show`` lists and a QoS policy's
``max_quality_drop`` caps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass

from graylane.artifacts.naming import Precision
from graylane.builder.spec import EngineSpec
from graylane.evaluation.sets import EvalSet, EvalSetError, load_set
from graylane.evaluation.summary import Summary, summarize
from graylane.registry.records import RungQuality

__all__ = ["ScoredRungs", "rung_refusal", "score_rungs"]


@dataclass(frozen=True)
class ScoredRungs:
    """The rungs' scores on one set: the first precision is the reference."""

    set_name: str
    set_sha256: str
    items: int
    reference: Precision
    summaries: dict[Precision, Summary]

    def record(self, precision: Precision) -> RungQuality | None:
        """The rung's measured quality, as the registry stores it (None: not scored)."""
        summary, reference = self.summaries.get(precision), self.summaries.get(self.reference)
        if summary is None or reference is None or summary.errors or reference.errors:
            return None
        return RungQuality(
            precision=precision,
            set_name=self.set_name,
            set_sha256=self.set_sha256,
            items=summary.items,
            score=summary.mean,
            ci_low=summary.ci_low,
            ci_high=summary.ci_high,
            reference_precision=self.reference,
            reference_score=reference.mean,
        )


def rung_refusal(
    reference: Summary | None, rung: Summary, max_drop: float, set_name: str
) -> str | None:
    """Why a rung is refused on its score (None: it is not)."""
    if rung.errors:
        return f"evaluation on {set_name}: {rung.errors} of {rung.items} calls failed"
    if reference is None or reference.errors:
        return f"evaluation on {set_name}: no score of the reference rung to compare with"
    drop = reference.mean - rung.mean
    if drop > max_drop:
        return (
            f"quality drop {drop:.3f} > {max_drop:g} on {set_name} ({rung.mean:.3f} vs the "
            f"reference {reference.target}'s {reference.mean:.3f})"
        )
    return None


def _subset_digest(evaluation: EvalSet, items: int) -> tuple[str, str]:
    import hashlib

    if items >= len(evaluation.items):
        return evaluation.name, evaluation.digest
    digest = hashlib.sha256(f"{evaluation.digest}:{items}".encode()).hexdigest()
    return f"{evaluation.name}[:{items}]", digest


def score_rungs(spec: EngineSpec, skip: Collection[Precision]) -> ScoredRungs:
    """Every rung of ``spec`` but those in ``skip`` scored on ``engine.evaluation``'s set.

    Raises :class:`~graylane.evaluation.sets.EvalSetError` for an unreadable set.
    """
    evaluation = spec.engine.evaluation
    if evaluation is None:
        raise EvalSetError("the spec names no evaluation set")
    loaded = load_set(evaluation.set_path)
    items = loaded.items[: evaluation.limit] if evaluation.limit > 0 else loaded.items
    name, digest = _subset_digest(loaded, len(items))
    rungs = [v for v in spec.engine.variants if v.precision not in skip]

    async def run() -> dict[Precision, Summary]:
        import httpx

        from graylane.evaluation.runner import OpenAITarget, answer_all, score_all

        out: dict[Precision, Summary] = {}
        for variant in rungs:
            async with httpx.AsyncClient(
                base_url=variant.url, timeout=120, trust_env=False
            ) as http:
                target = OpenAITarget(variant.precision.value, http, variant.served_model)
                answers = await answer_all(target, items, concurrency=evaluation.concurrency)
            out[variant.precision] = summarize(target.name, await score_all(answers, None))
        return out

    return ScoredRungs(
        set_name=name,
        set_sha256=digest,
        items=len(items),
        reference=spec.engine.variants[0].precision,
        summaries=asyncio.run(run()),
    )
