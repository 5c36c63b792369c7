"""Load-aware gates and liveness: backlog is capacity (hold), a dead candidate rolls back.

Regression (issue 11): a healthy candidate whose worker still carried a queue
(candidate p99 1442 ms vs baseline 215 ms, all of it queue wait) was rolled
back within 1 s by the severe-latency rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.gates import Verdict, latency_gate
from graylane.policy_engine.logic.liveness import (
    LagSample,
    Liveness,
    VersionLiveness,
    judge_liveness,
)
from graylane.policy_engine.logic.rollout import Decision, RolloutSignals, evaluate, start
from graylane.policy_engine.logic.window import SlidingWindow, TelemetrySample, WindowKey
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase

WINDOW_MS, STEP_MS = 10_000, 2_000


def spec(mode: GateMode, steps: tuple[Step, ...] | None = None) -> RolloutSpec:
    return RolloutSpec(
        rollout_id="r",
        model="m",
        baseline="v1",
        candidate="v2",
        steps=steps or (Step(5.0, 10**12, 0.0), Step(100.0)),
        gates=Gates(mode=mode),
    )


def batch(
    rng: np.random.Generator, version: str, now: int, n: int, service_ms: float, queue_ms: float
) -> TelemetrySample:
    """``n`` requests served in batches whose service time is ``service_ms`` (jittered)."""
    service = float(service_ms * rng.lognormal(0.0, 0.2))
    queue = rng.exponential(3.0, n) + queue_ms
    return TelemetrySample(
        model="m",
        version=version,
        variant="fp32",
        worker_id=version,
        completed_at_ms=now - 1,
        started_at_ms=now - 1 - round(service),
        compute_ms=service,
        request_count=n,
        error_count=0,
        latency=LatencyHistogram.of((queue + service).tolist()),
        queue_wait=LatencyHistogram.of(queue.tolist()),
    )


def run(
    mode: GateMode,
    *,
    seconds: int = 120,
    cand_service: float = 20.0,
    cand_queue: float = 0.0,
    seed: int = 0,
) -> list[Decision]:
    rng = np.random.default_rng(seed)
    rollout = spec(mode)
    window = SlidingWindow(WINDOW_MS, STEP_MS)
    decisions = [start(rollout, 0)]
    for tick in range(1, seconds * 1000 // STEP_MS + 1):
        now = tick * STEP_MS
        for _ in range(10):  # batches of 10 per step and side
            window.add(batch(rng, "v1", now, 10, 20.0, 0.0))
            window.add(batch(rng, "v2", now, 10, cand_service, cand_queue))
        window.evict(now)
        b = window.stats(WindowKey("m", "v1", "fp32"), now)
        c = window.stats(WindowKey("m", "v2", "fp32"), now)
        signals = RolloutSignals(
            baseline_step=window.step_stats_by_version("m", "v1", now),
            candidate_step=window.step_stats_by_version("m", "v2", now),
        )
        decisions.append(evaluate(decisions[-1].after, rollout, b, c, None, now, signals=signals))
        if decisions[-1].after.terminal:
            break
    return decisions


def test_windows_carry_service_time_apart_from_queue_wait() -> None:
    window = SlidingWindow(WINDOW_MS, STEP_MS)
    window.add(batch(np.random.default_rng(0), "v2", 2_000, 10, 20.0, 1_400.0))
    stats = window.stats(WindowKey("m", "v2", "fp32"), 2_000)
    assert stats is not None and stats.service is not None
    assert stats.service.count == 10
    assert 10.0 < stats.service_p99_ms < 40.0
    assert stats.p99_ms > 1_400.0 and stats.queue_wait_p99_ms > 1_400.0
    step = window.step_stats_by_version("m", "v2", 2_000)
    assert step is not None and step.window_start_ms == 0 and step.requests == 10


@pytest.mark.parametrize("mode", list(GateMode))
def test_backlog_only_candidate_is_held_never_rolled_back(mode: GateMode) -> None:
    decisions = run(mode, cand_queue=1_400.0)
    assert not any(d.kind is DecisionKind.ROLLBACK for d in decisions)
    held = [d for d in decisions if d.rule == DecisionRule.CANDIDATE_BACKLOG]
    assert len(held) >= len(decisions) - 3  # from the first full evaluation on
    assert all(d.kind is DecisionKind.HOLD for d in held)
    # The same windows judged on end-to-end latency would have failed, severely.
    last = held[-1].inputs
    assert latency_gate(last[0], last[1], Gates()).severe


@pytest.mark.parametrize("mode", list(GateMode))
def test_service_time_regression_is_caught_even_behind_a_backlog(mode: GateMode) -> None:
    decisions = run(mode, cand_service=40.0, cand_queue=1_400.0)
    assert decisions[-1].kind is DecisionKind.ROLLBACK
    assert decisions[-1].at_ms <= 12_000
    assert "service" in decisions[-1].reason


@pytest.mark.parametrize("seed", range(3))
def test_service_time_x15_caught_by_sequential_gates(seed: int) -> None:
    decisions = run(GateMode.SEQUENTIAL, cand_service=30.0, seed=seed)
    assert decisions[-1].kind is DecisionKind.ROLLBACK
    assert decisions[-1].at_ms <= 12_000


def test_severe_latency_needs_a_minimum_sample_count() -> None:
    rng = np.random.default_rng(1)
    window = SlidingWindow(WINDOW_MS, STEP_MS)
    window.add(batch(rng, "v1", 2_000, 500, 20.0, 0.0))
    for _ in range(3):
        window.add(batch(rng, "v2", 2_000, 10, 200.0, 0.0))  # 30 requests, 10x slower
    b = window.stats(WindowKey("m", "v1", "fp32"), 2_000)
    c = window.stats(WindowKey("m", "v2", "fp32"), 2_000)
    assert b is not None and c is not None
    result = latency_gate(b, c, Gates())
    assert result.verdict is Verdict.FAIL and not result.severe


# -- liveness ----------------------------------------------------------------------------


def dead_candidate_run(t_s: float, died_at_ms: int, *, baseline_dead: bool = False) -> Decision:
    """Evaluate at ``t_s`` with traffic routed to the candidate since it died."""
    rollout = spec(GateMode.FIXED)
    state = start(rollout, 0).after
    now = int(t_s * 1000)
    silent = VersionLiveness(
        version="v2",
        routed_since_telemetry=25,
        first_routed_since_telemetry_ms=died_at_ms + 1,
        last_telemetry_ms=died_at_ms,
    )
    alive = VersionLiveness(version="v1", last_telemetry_ms=now)
    signals = RolloutSignals(
        baseline_liveness=(
            VersionLiveness(
                version="v1",
                routed_since_telemetry=500,
                first_routed_since_telemetry_ms=died_at_ms + 1,
            )
            if baseline_dead
            else alive
        ),
        candidate_liveness=silent,
    )
    return evaluate(state, rollout, None, None, None, now, signals=signals)


def test_unresponsive_candidate_rolled_back_within_t() -> None:
    before = dead_candidate_run(10.0, died_at_ms=1_000)  # silent for 9 s
    assert before.kind is DecisionKind.HOLD and before.rule == "no_data"
    at = dead_candidate_run(11.002, died_at_ms=1_000)  # silent for 10 s
    assert at.kind is DecisionKind.ROLLBACK and at.rule == DecisionRule.CANDIDATE_UNRESPONSIVE
    assert at.after.phase is Phase.ROLLED_BACK and at.routing is not None
    assert at.routing.candidate_weight_percent == 0.0


def test_unresponsive_baseline_holds_and_never_promotes() -> None:
    d = dead_candidate_run(30.0, died_at_ms=1_000, baseline_dead=True)
    assert d.kind is DecisionKind.HOLD and d.rule == DecisionRule.BASELINE_UNRESPONSIVE
    assert "candidate" in d.reason
    # Even with a promotable healthy candidate: hold while the baseline is silent.
    rollout = spec(GateMode.FIXED, steps=(Step(50.0, 0, 0.0), Step(100.0)))
    state = start(rollout, 0).after
    signals = RolloutSignals(
        baseline_liveness=VersionLiveness(
            version="v1", routed_since_telemetry=1, first_routed_since_telemetry_ms=0
        )
    )
    d = evaluate(state, rollout, None, None, None, 60_000, signals=signals)
    assert d.kind is DecisionKind.HOLD and d.rule == DecisionRule.BASELINE_UNRESPONSIVE


def lag(values: list[int], committed: list[int] | None) -> tuple[LagSample, ...]:
    return tuple(
        LagSample(i * 2_000, v, committed[i] if committed else None) for i, v in enumerate(values)
    )


def test_growing_lag_nobody_consumes_is_unresponsive() -> None:
    grows = [0, 40, 80, 120, 160, 200, 240]
    signals = VersionLiveness(version="v2", lag=lag(grows, [7] * 7))
    assert judge_liveness(signals, 12_000, 10_000).liveness is Liveness.UNRESPONSIVE
    # Not before it grew for T.
    short = VersionLiveness(version="v2", lag=lag(grows[:5], [7] * 5))
    assert judge_liveness(short, 8_000, 10_000).liveness is Liveness.ALIVE


def test_growing_lag_while_consuming_is_behind_not_dead() -> None:
    signals = VersionLiveness(version="v2", lag=lag([0, 40, 80, 120, 160, 200], list(range(6))))
    verdict = judge_liveness(signals, 10_000, 10_000)
    assert verdict.liveness is Liveness.BEHIND and "consumed" in verdict.reason


def test_wobbling_small_lag_is_alive() -> None:
    signals = VersionLiveness(version="v2", lag=lag([1, 1, 2, 3, 3, 4], None))
    assert judge_liveness(signals, 10_000, 10_000).liveness is Liveness.ALIVE
    falls = VersionLiveness(version="v2", lag=lag([0, 40, 10, 50, 90, 130], [1] * 6))
    assert judge_liveness(falls, 10_000, 10_000).liveness is Liveness.ALIVE


def test_lag_that_starts_from_zero_waits_t_from_the_first_waiting_record() -> None:
    # Nothing consumes; the first record arrives between the first and second sample.
    grows = [0, 40, 80, 120, 160, 200, 240]
    for committed in ([0] * 7, None):
        signals = VersionLiveness(version="v2", lag=lag(grows[:6], committed))
        # The span from 0 ms is T long, but at 0 ms nothing waited: the oldest record
        # has waited less than T.
        assert judge_liveness(signals, 10_000, 10_000).liveness is Liveness.ALIVE
        signals = VersionLiveness(version="v2", lag=lag(grows, committed))
        verdict = judge_liveness(signals, 12_000, 10_000)
        assert verdict.liveness is Liveness.UNRESPONSIVE, verdict
        assert "from 40 to 240 over 10 s" in verdict.reason
