"""Rollout controller gates: failures counted per window, severe regressions at once,
error evidence (fixed-horizon gates; the sequential ones: test_policy_gates.py)."""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.logic.rollout import (
    evaluate,
)
from graylane.rollouts.spec import Step
from graylane.rollouts.vocabulary import DecisionKind, Phase
from tests.support.rollout_run import SPEC, WINDOW, Run, window_pair, ws

# -- gate failures ------------------------------------------------------------------


def test_p99_gate_counts_failures_and_rolls_back_at_n() -> None:
    run = Run()
    d = run.window(p99=35.0)  # 1.75x of 20 ms
    assert (d.kind, d.rule) == (DecisionKind.GATE_FAILED, "p99_ratio")
    assert d.after.consecutive_failures == 1 and d.routing is None
    assert "1.75x" in d.reason
    d = run.window(p99=35.0)
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "p99_ratio")
    assert d.after.phase is Phase.ROLLED_BACK
    assert d.routing is not None and d.routing.candidate_weight_percent == 0.0
    assert d.routing.stable_version == "v1"


def test_a_pass_resets_the_failure_count() -> None:
    run = Run()
    run.window(p99=35.0)
    d = run.window()
    assert d.kind is DecisionKind.HOLD and d.after.consecutive_failures == 0
    d = run.window(p99=35.0)
    assert d.kind is DecisionKind.GATE_FAILED and d.after.consecutive_failures == 1


def test_overlapping_windows_count_one_failure() -> None:
    run = Run()
    base = run.state
    t = run.t
    first = evaluate(base, SPEC, *window_pair(t, p99=35.0), None, t + WINDOW)
    assert first.after.consecutive_failures == 1
    # The window slid by 2 s only: same bad stretch, not a second failure.
    again = evaluate(first.after, SPEC, *window_pair(t + 2_000, p99=35.0), None, t + WINDOW + 2_000)
    assert again.kind is DecisionKind.GATE_FAILED
    assert again.after.consecutive_failures == 1 and "not counted" in again.reason
    disjoint = evaluate(again.after, SPEC, *window_pair(t + WINDOW, p99=35.0), None, t + 2 * WINDOW)
    assert disjoint.kind is DecisionKind.ROLLBACK


def test_baseline_floor_keeps_tiny_latencies_from_failing() -> None:
    run = Run()
    baseline = ws("v1", run.t, 1000, p99=0.2)
    candidate = ws("v2", run.t, 200, p99=0.9)  # 4.5x of 0.2 ms, but under the 1 ms floor
    d = evaluate(run.state, SPEC, baseline, candidate, None, run.t + WINDOW)
    assert d.kind is DecisionKind.HOLD and "p99_ratio pass" in d.reason


def test_small_windows_compare_p95_not_the_maximum() -> None:
    run = Run()
    # 50 requests: p99 is the slowest request (one outlier); p95 is fine.
    d = run.window(cand_n=50, p99=200.0, p95=16.0)
    assert d.kind is DecisionKind.HOLD
    assert "candidate p95" in d.reason and "p99 needs 100" in d.reason


def test_severe_p99_rolls_back_at_once() -> None:
    run = Run()
    d = run.window(p99=80.0, p95=64.0)  # 4x p99 and p95 over the limit too
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "p99_severe")
    assert d.after.phase is Phase.ROLLED_BACK


def test_one_outlier_is_not_severe() -> None:
    run = Run()
    d = run.window(p99=80.0, p95=16.0)  # tail only: p95 is within limits
    assert (d.kind, d.rule) == (DecisionKind.GATE_FAILED, "p99_ratio")


def test_error_gate_fails_on_a_significant_regression() -> None:
    run = Run()
    d = run.window(cand_n=200, errors=10, base_errors=10)  # 5 % vs 1 %, p ~ 5e-4
    assert (d.kind, d.rule) == (DecisionKind.GATE_FAILED, "error_rate")
    assert "+4.00pp" in d.reason


def test_decisive_error_evidence_rolls_back_at_once() -> None:
    # 8 % vs 0 %: p ~ 1e-20. A second window would only serve more errors.
    run = Run()
    d = run.window(cand_n=500, errors=40)
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "error_rate_decisive")
    assert "+8.00pp" in d.reason
    assert d.after.candidate_weight_percent == 0.0


def test_error_gate_severe_rolls_back_at_once() -> None:
    run = Run()
    d = run.window(cand_n=200, errors=100)
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "error_rate_severe")


def test_inconclusive_error_evidence_holds_without_counting() -> None:
    run = Run(replace(SPEC, steps=(Step(1.0, 10, 0.0), Step(100.0))))
    # 8 % of 25 vs 1 %: over the tolerance, but two errors are no evidence yet.
    d = run.window(cand_n=25, errors=2, base_errors=10)
    assert (d.kind, d.rule) == (DecisionKind.HOLD, "error_rate")
    assert "inconclusive" in d.reason and d.after.consecutive_failures == 0
