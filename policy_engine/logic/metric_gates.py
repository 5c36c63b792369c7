"""Gates on any Prometheus metric (pure): what a reading means for a rollout.

The adapter (:mod:`~graylane.policy_engine.metric_probe`) renders each gate's query
(:func:`render`), asks Prometheus, and hands back one :class:`MetricReading` per gate;
:func:`next_reading` keeps, across reads, since when a gate has read inconclusive.
Here a reading becomes a gate result: a value that meets the condition passes, one
that breaks it fails (a gate failure like any other: ``failures_to_rollback`` of them
in a row roll back), and anything else is inconclusive, which holds, never passes.
:func:`overdue` names the gate held inconclusive longer than it allows: the rollout
then pauses, for a person to look.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from graylane.policy_engine.logic.gates import GateResult, Verdict
from graylane.rollouts.spec import MetricGate
from graylane.rollouts.vocabulary import DecisionRule

__all__ = [
    "MetricReading",
    "MetricTarget",
    "metric_results",
    "next_reading",
    "overdue",
    "render",
]


@dataclass(frozen=True)
class MetricTarget:
    """One query to ask Prometheus: ``gate`` of ``model``'s active rollout."""

    model: str
    gate: str
    query: str


@dataclass(frozen=True)
class MetricReading:
    """What one gate's query read at ``read_at_ms``: a value, or why there is none."""

    gate: str
    value: float | None
    inconclusive: str
    read_at_ms: int
    inconclusive_since_ms: int = 0
    """Since when the gate has read inconclusive without a break (0 with a value)."""


def render(query: str, *, model: str, baseline: str, candidate: str) -> str:
    """The query with ``{{model}}``, ``{{baseline}}`` and ``{{candidate}}`` filled in."""
    return (
        query.replace("{{model}}", model)
        .replace("{{baseline}}", baseline)
        .replace("{{candidate}}", candidate)
    )


def next_reading(
    previous: MetricReading | None, gate: str, value: float | None, why: str, at_ms: int
) -> MetricReading:
    """The reading after ``previous``: an inconclusive streak keeps its start."""
    if value is not None and math.isfinite(value):
        return MetricReading(gate, value, "", at_ms)
    reason = why or f"not a finite number ({value})"
    since = (
        previous.inconclusive_since_ms
        if previous is not None and previous.value is None and previous.inconclusive_since_ms
        else at_ms
    )
    return MetricReading(gate, None, reason, at_ms, since)


def _by_gate(readings: Iterable[MetricReading]) -> dict[str, MetricReading]:
    return {r.gate: r for r in readings}


def metric_results(
    gates: Sequence[MetricGate], readings: Iterable[MetricReading]
) -> list[GateResult]:
    """One result per gate; a gate without a reading yet is inconclusive."""
    read: Mapping[str, MetricReading] = _by_gate(readings)
    out: list[GateResult] = []
    for g in gates:
        r = read.get(g.name)
        if r is None or r.value is None:
            why = "not read yet" if r is None else r.inconclusive
            out.append(
                GateResult(
                    DecisionRule.METRIC_INCONCLUSIVE, Verdict.INCONCLUSIVE, f"{g.name}: {why}"
                )
            )
            continue
        ok = g.comparison.holds(r.value, g.threshold)
        detail = (
            f"{g.name}: {r.value:.6g} {'' if ok else 'not '}{g.comparison.value} {g.threshold:g}"
        )
        out.append(
            GateResult(DecisionRule.METRIC_GATE, Verdict.PASS if ok else Verdict.FAIL, detail)
        )
    return out


def overdue(
    gates: Sequence[MetricGate], readings: Iterable[MetricReading], now_ms: int
) -> tuple[MetricGate, MetricReading] | None:
    """The first gate held inconclusive longer than its ``pause_after_inconclusive_s``."""
    read = _by_gate(readings)
    for g in gates:
        r = read.get(g.name)
        if g.pause_after_inconclusive_s <= 0 or r is None or r.value is not None:
            continue
        if now_ms - r.inconclusive_since_ms > g.pause_after_inconclusive_s * 1000:
            return g, r
    return None
