"""The fixed-horizon rollout gates (``GateMode.FIXED``, kept for comparison) under
noise: no false rollbacks, fast detection of real regressions.

Traffic is simulated with binomial errors and lognormal latencies; every
window's stats are built the way the policy engine builds them (histograms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.gates import latency_gate, step_alpha
from graylane.policy_engine.logic.rollout import evaluate, start
from graylane.policy_engine.logic.rollout_state import Decision
from graylane.policy_engine.logic.significance import Verdict
from graylane.policy_engine.logic.window import (
    SlidingWindow,
    TelemetrySample,
    WindowKey,
    WindowStats,
)
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionKind, Phase

WINDOW_MS = 10_000


def stats_of(version: str, latencies: np.ndarray, errors: int, start_ms: int) -> WindowStats:
    h = LatencyHistogram.of(latencies.tolist())
    return WindowStats(
        model="m",
        version=version,
        variant="fp32",
        window_start_ms=start_ms,
        window_end_ms=start_ms + WINDOW_MS,
        requests=h.count,
        errors=errors,
        p50_ms=h.quantile(0.5),
        p95_ms=h.quantile(0.95),
        p99_ms=h.quantile(0.99),
        mean_ms=h.mean_ms,
        throughput_rps=h.count / (WINDOW_MS / 1000),
    )


@dataclass(frozen=True)
class Traffic:
    rps: float = 50.0
    base_error: float = 0.01
    cand_error: float = 0.01
    median_ms: float = 20.0
    sigma: float = 0.4
    cand_slowdown: float = 1.0


def holding_spec(weight: float) -> RolloutSpec:
    """A step that never advances (sample minimum out of reach): pure gate exposure."""
    return RolloutSpec(
        rollout_id="r",
        model="m",
        baseline="v1",
        candidate="v2",
        steps=(Step(weight, 10**12, 0.0), Step(100.0)),
        gates=Gates(mode=GateMode.FIXED),
    )


def simulate(spec: RolloutSpec, traffic: Traffic, windows: int, seed: int) -> list[Decision]:
    """One evaluation per disjoint 10 s window; stops at a terminal decision."""
    rng = np.random.default_rng(seed)
    decisions = [start(spec, 0)]
    for i in range(windows):
        state = decisions[-1].after
        share = state.candidate_weight_percent / 100.0
        n_b = int(rng.poisson(traffic.rps * 10 * (1 - share)))
        n_c = int(rng.poisson(traffic.rps * 10 * share))
        mu = np.log(traffic.median_ms)
        lat_b = rng.lognormal(mu, traffic.sigma, n_b)
        lat_c = rng.lognormal(mu + np.log(traffic.cand_slowdown), traffic.sigma, n_c)
        t = i * WINDOW_MS
        baseline = stats_of("v1", lat_b, int(rng.binomial(n_b, traffic.base_error)), t)
        candidate = stats_of("v2", lat_c, int(rng.binomial(n_c, traffic.cand_error)), t)
        decisions.append(evaluate(state, spec, baseline, candidate, None, t + WINDOW_MS))
        if decisions[-1].after.terminal:
            break
    return decisions


def evaluations_to_rollback(decisions: list[Decision]) -> int | None:
    for i, d in enumerate(decisions[1:], start=1):
        if d.kind is DecisionKind.ROLLBACK:
            return i
    return None


@pytest.mark.parametrize(
    ("weight", "rps", "seed"),
    [(1.0, 50.0, 1), (5.0, 50.0, 2), (25.0, 50.0, 3), (50.0, 50.0, 4), (5.0, 200.0, 5)],
)
def test_healthy_candidate_is_never_rolled_back_over_200_windows(
    weight: float, rps: float, seed: int
) -> None:
    decisions = simulate(holding_spec(weight), Traffic(rps=rps), 200, seed)
    assert len(decisions) == 201
    assert evaluations_to_rollback(decisions) is None
    assert all(d.after.phase is Phase.PROGRESSING for d in decisions[1:])


@pytest.mark.parametrize("seed", range(10))
def test_plus_5pp_errors_caught_within_3_evaluations(seed: int) -> None:
    # 25 % of 100 req/s: 250 candidate requests a window, 1 % -> 6 % errors.
    decisions = simulate(holding_spec(25.0), Traffic(rps=100.0, cand_error=0.06), 10, seed)
    n = evaluations_to_rollback(decisions)
    assert n is not None and n <= 3
    assert decisions[-1].rule in ("error_rate", "error_rate_decisive")


def test_plus_5pp_errors_at_a_5_percent_canary_caught_by_step_evidence() -> None:
    # 5 % of 50 req/s: ~25 candidate requests (1.5 expected errors) a window. No
    # single window can tell that from noise; the step's evidence can, in about a minute.
    counts = []
    for seed in range(10):
        decisions = simulate(holding_spec(5.0), Traffic(cand_error=0.06), 30, seed)
        n = evaluations_to_rollback(decisions)
        assert n is not None, f"seed {seed}: never caught"
        assert "step (" in decisions[-1].reason
        counts.append(n)
    assert float(np.median(counts)) <= 8
    assert max(counts) <= 20


@pytest.mark.parametrize("seed", range(10))
def test_3x_latency_caught_within_3_evaluations(seed: int) -> None:
    decisions = simulate(holding_spec(5.0), Traffic(cand_slowdown=3.0), 10, seed)
    n = evaluations_to_rollback(decisions)
    assert n is not None and n <= 3
    assert decisions[-1].rule in ("p99_ratio", "p99_severe")


def test_healthy_candidate_is_promoted_through_all_steps() -> None:
    spec = RolloutSpec(
        rollout_id="r",
        model="m",
        baseline="v1",
        candidate="v2",
        steps=(
            Step(1.0, 20, 30.0),
            Step(5.0, 50, 30.0),
            Step(25.0, 100, 30.0),
            Step(50.0, 200, 30.0),
            Step(100.0),
        ),
    )
    decisions = simulate(spec, Traffic(), 400, seed=7)
    assert decisions[-1].kind is DecisionKind.PROMOTE
    weights = [d.routing.candidate_weight_percent for d in decisions if d.routing]
    assert weights == [1.0, 5.0, 25.0, 50.0, 100.0]


def test_step_alpha_spends_the_level_over_looks() -> None:
    assert sum(step_alpha(0.01, k) for k in range(1, 100_000)) == pytest.approx(0.01, rel=1e-4)


def test_latency_quantile_follows_the_sample_size() -> None:
    def pair(n: int, p50: float, p95: float, p99: float) -> tuple[WindowStats, WindowStats]:
        base = WindowStats(
            model="m", version="v1", variant="a", window_start_ms=0, window_end_ms=1,
            requests=5000, errors=0, p50_ms=10, p95_ms=15, p99_ms=20, mean_ms=10,
            throughput_rps=1,
        )  # fmt: skip
        cand = WindowStats(
            model="m", version="v2", variant="a", window_start_ms=0, window_end_ms=1,
            requests=n, errors=0, p50_ms=p50, p95_ms=p95, p99_ms=p99, mean_ms=10,
            throughput_rps=1,
        )  # fmt: skip
        return base, cand

    gates = Gates()
    # Under 20 requests: the median, and a moderate ratio only holds.
    r = latency_gate(*pair(10, 20.0, 100.0, 100.0), gates)
    assert r.verdict is Verdict.INCONCLUSIVE and "p50" in r.detail
    r = latency_gate(*pair(10, 40.0, 100.0, 100.0), gates)
    assert r.verdict is Verdict.FAIL and not r.severe
    # 20..99 requests: p95.
    r = latency_gate(*pair(50, 10.0, 16.0, 100.0), gates)
    assert r.verdict is Verdict.PASS
    # 100+ requests: p99.
    r = latency_gate(*pair(100, 10.0, 16.0, 100.0), gates)
    assert r.verdict is Verdict.FAIL and r.severe is False


def test_end_to_end_with_sliding_windows_every_two_seconds() -> None:
    """Evaluations every step (2 s) over 10 s windows: overlap never double-counts."""
    rng = np.random.default_rng(11)
    spec = RolloutSpec(
        rollout_id="r",
        model="m",
        baseline="v1",
        candidate="v2",
        steps=(Step(5.0, 50, 20.0), Step(50.0, 100, 20.0), Step(100.0)),
    )

    def run(slowdown_after_ms: int | None) -> list[Decision]:
        window = SlidingWindow(10_000, 2_000)
        decisions = [start(spec, 0)]
        for tick in range(1, 300):
            now = tick * 2_000
            state = decisions[-1].after
            share = state.candidate_weight_percent / 100.0
            for version, frac in (("v1", 1 - share), ("v2", share)):
                n = int(rng.poisson(100 * 2 * frac))
                slow = version == "v2" and slowdown_after_ms is not None and now > slowdown_after_ms
                lat = rng.lognormal(np.log(20 * (3 if slow else 1)), 0.3, n)
                window.add(
                    TelemetrySample(
                        model="m",
                        version=version,
                        variant="fp32",
                        worker_id=version,
                        completed_at_ms=now - 1,
                        request_count=n,
                        error_count=int(rng.binomial(n, 0.01)),
                        latency=LatencyHistogram.of(lat.tolist()),
                    )
                )
            window.evict(now)
            b = window.stats(WindowKey("m", "v1", "fp32"), now)
            c = window.stats(WindowKey("m", "v2", "fp32"), now)
            decisions.append(evaluate(state, spec, b, c, None, now))
            if decisions[-1].after.terminal:
                break
        return decisions

    healthy = run(None)
    assert healthy[-1].kind is DecisionKind.PROMOTE
    assert not any(d.kind is DecisionKind.GATE_FAILED for d in healthy)

    degraded = run(slowdown_after_ms=0)
    assert degraded[-1].kind is DecisionKind.ROLLBACK
    # Caught within the first windows that hold candidate traffic.
    assert degraded[-1].at_ms <= 30_000
