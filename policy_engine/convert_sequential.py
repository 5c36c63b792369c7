"""The sequential gates' running tests <-> ``graylane.v1.SequentialEvidence``.

Part of the rollout state on the wire, so that a restarted engine and
``audit verify`` continue the same anytime-valid tests (every value is a
double or a count: the round trip is exact).
"""

from __future__ import annotations

from graylane.policy_engine.logic.sequential import (
    RATE_GRID,
    RATIO_GRID,
    RateTest,
    RatioTest,
    SequentialEvidence,
)
from graylane.v1 import rollout_pb2

__all__ = ["sequential_from_pb", "sequential_to_pb"]


def _ratio_to_pb(t: RatioTest) -> rollout_pb2.RatioTestState:
    return rollout_pb2.RatioTestState(
        r0=t.r0,
        log_lr=list(t.log_lr),
        candidate_events=t.candidate_events,
        candidate_requests=t.candidate_requests,
        baseline_events=t.baseline_events,
        baseline_requests=t.baseline_requests,
        recent_up=list(t.recent_up),
    )


def _ratio_from_pb(pb: rollout_pb2.RatioTestState) -> RatioTest:
    return RatioTest(
        r0=pb.r0 or 1.0,
        log_lr=tuple(pb.log_lr) or (0.0,) * len(RATIO_GRID),
        candidate_events=pb.candidate_events,
        candidate_requests=pb.candidate_requests,
        baseline_events=pb.baseline_events,
        baseline_requests=pb.baseline_requests,
        recent_up=tuple(pb.recent_up),
    )


def _rate_to_pb(t: RateTest) -> rollout_pb2.RateTestState:
    return rollout_pb2.RateTestState(
        p0=t.p0, log_lr=list(t.log_lr), events=t.events, requests=t.requests
    )


def _rate_from_pb(pb: rollout_pb2.RateTestState) -> RateTest:
    return RateTest(
        p0=pb.p0,
        log_lr=tuple(pb.log_lr) or (0.0,) * len(RATE_GRID),
        events=pb.events,
        requests=pb.requests,
    )


def sequential_to_pb(ev: SequentialEvidence) -> rollout_pb2.SequentialEvidence | None:
    """None for the evidence of a rollout that has consumed no increment."""
    if ev == SequentialEvidence():
        return None
    return rollout_pb2.SequentialEvidence(
        errors=_ratio_to_pb(ev.errors),
        budget=_rate_to_pb(ev.budget),
        slow_p95=_ratio_to_pb(ev.slow_p95),
        slow_p99=_ratio_to_pb(ev.slow_p99),
        increments=ev.increments,
        through_unix_ms=ev.through_ms,
        baseline_p95_ms=list(ev.baseline_p95_ms),
        baseline_p99_ms=list(ev.baseline_p99_ms),
    )


def sequential_from_pb(pb: rollout_pb2.RolloutState) -> SequentialEvidence:
    """The state's sequential evidence; none yet when the field is absent."""
    if not pb.HasField("sequential"):
        return SequentialEvidence()
    s = pb.sequential
    return SequentialEvidence(
        errors=_ratio_from_pb(s.errors),
        budget=_rate_from_pb(s.budget),
        slow_p95=_ratio_from_pb(s.slow_p95),
        slow_p99=_ratio_from_pb(s.slow_p99),
        increments=s.increments,
        through_ms=s.through_unix_ms,
        baseline_p95_ms=tuple(s.baseline_p95_ms),
        baseline_p99_ms=tuple(s.baseline_p99_ms),
    )
