"""Load-aware gates: judge the model on service time, treat queueing apart.

End-to-end latency mixes the model's service time with queueing. A candidate
whose worker carries a queue (left from an earlier run, or too few replicas)
is slow end to end while its model is not: that is a capacity problem.

- **Service time.** When both sides' windows carry service times (see
  :mod:`.window`), the latency gates compare those instead of end-to-end
  latency; older telemetry without them falls back to end-to-end latency.
- **Backlog** (rule ``candidate_backlog``). A candidate whose queue wait p99
  exceeds ``max(backlog_queue_ms, max_p99_ratio x max(baseline queue wait p99,
  p99_floor_ms))``, or whose consumer lag grows while it consumes, is held
  (no advance, no failure counted) and the hold is audited: it needs
  capacity, not a rollback. A failing *service-time* gate still rolls it back;
  a failing end-to-end gate (no service times to tell them apart) does not.

:func:`judge` runs the gates of the spec's :class:`~.rollout_spec.GateMode`.
"""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.logic.gates import (
    GateResult,
    error_gate,
    latency_gate,
)
from graylane.policy_engine.logic.rollout_state import StepEvidence
from graylane.policy_engine.logic.sequential import SequentialEvidence
from graylane.policy_engine.logic.sequential_gates import sequential_gates
from graylane.policy_engine.logic.significance import Verdict
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.spec import GateMode, Gates
from graylane.rollouts.vocabulary import DecisionRule

__all__ = ["backlog_gate", "judge", "on_service_time", "service_latency_gate", "service_view"]


def on_service_time(baseline: WindowStats, candidate: WindowStats) -> bool:
    """Both windows carry service times, so latency can be judged on them."""
    return baseline.service is not None and candidate.service is not None


def service_view(stats: WindowStats) -> WindowStats:
    """``stats`` with its latency quantiles replaced by its service-time quantiles."""
    return replace(
        stats,
        p50_ms=stats.service_p50_ms,
        p95_ms=stats.service_p95_ms,
        p99_ms=stats.service_p99_ms,
    )


def service_latency_gate(baseline: WindowStats, candidate: WindowStats, gates: Gates) -> GateResult:
    """:func:`~.gates.latency_gate` on service time where both sides have it."""
    if not on_service_time(baseline, candidate):
        result = latency_gate(baseline, candidate, gates)
        return replace(result, detail=f"end-to-end latency: {result.detail}")
    result = latency_gate(service_view(baseline), service_view(candidate), gates)
    return replace(result, detail=f"service time: {result.detail}")


def backlog_gate(
    baseline: WindowStats, candidate: WindowStats, gates: Gates, behind: str = ""
) -> GateResult | None:
    """INCONCLUSIVE ``candidate_backlog`` when the candidate queues; else None.

    ``behind`` is the liveness check's account of a lag that grows while the
    candidate consumes (see :mod:`.unresponsive`).
    """
    limit = max(
        gates.backlog_queue_ms,
        gates.max_p99_ratio * max(baseline.queue_wait_p99_ms, gates.p99_floor_ms),
    )
    queued = candidate.queue_wait_p99_ms > limit
    if not (queued or behind):
        return None
    parts = []
    if queued:
        parts.append(
            f"candidate queue wait p99 {candidate.queue_wait_p99_ms:.1f} ms vs baseline "
            f"{baseline.queue_wait_p99_ms:.1f} ms (limit {limit:.1f} ms)"
        )
    if behind:
        parts.append(behind)
    detail = "; ".join(parts) + ": a capacity problem, holding (scale the candidate out)"
    return GateResult(DecisionRule.CANDIDATE_BACKLOG, Verdict.INCONCLUSIVE, detail)


def judge(
    baseline: WindowStats,
    candidate: WindowStats,
    evidence: StepEvidence,
    sequential: SequentialEvidence,
    gates: Gates,
    *,
    behind: str = "",
) -> list[GateResult]:
    """The latency and error gates of ``gates.mode``, then the backlog check."""
    if gates.mode is GateMode.SEQUENTIAL:
        results = sequential_gates(baseline, candidate, sequential, gates)
    else:
        results = [
            service_latency_gate(baseline, candidate, gates),
            error_gate(baseline, candidate, evidence, gates),
        ]
    backlog = backlog_gate(baseline, candidate, gates, behind)
    if backlog is None:
        return results
    if not on_service_time(baseline, candidate):
        # End-to-end latency cannot tell the queue from the model: do not fail on it.
        results = [
            r for r in results if r.rule not in (DecisionRule.P99_RATIO, DecisionRule.P99_SEVERE)
        ]
    return [backlog, *results]
