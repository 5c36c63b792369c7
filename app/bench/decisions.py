"""``graylane bench decisions``: the pure rollout controller on synthetic telemetry.

No broker, no services: thousands of simulated rollouts (see
:mod:`graylane.app.bench.decisions_sim` for the traffic) with deterministic
seeds, for every scenario, candidate request rate and gate mode. The same
seeds drive both gate modes, so their figures compare like for like.

Per ``<mode>/<scenario>@<rate>`` row: ``runs``; ``detected`` (runs in which
the controller acted on the scenario: rolled back a harmful candidate, held a
backlogged one on ``candidate_backlog``; for a healthy one, any rollback);
``rolled_back``; ``promoted``; ``detect_s_p50`` / ``detect_s_p95`` (seconds
from the onset to that action, over detected runs; null when none).
``false_rollback_rate`` is the share of healthy runs rolled back under the
primary gate mode (``--mode``, default sequential), over all rates; the rows
of the other mode are there for comparison. The last output line is that JSON.

Generation scenarios (``gen_*``) also count ``latency_rollbacks`` (rollbacks on a
latency rule: TTFT, TPOT, service time, p99) and ``length_drift`` (runs with an
``output_length_drift`` verdict); for ``gen_length_x2`` "detected" is that drift
verdict, and ``detect_s_*`` its time. ``generation_false_rollback_rate`` is the
share of ``gen_healthy`` runs rolled back under the primary mode, and a table of
the generation rows at the target rate comes next.

A/B on user outcomes (:mod:`graylane.app.bench.decisions_outcomes`): per
``<scenario>@<rated/s>`` row (``outcomes`` in the JSON), the candidate's thumbs-up
rate 2 and 5 points lower or the same, at 10 and 50 rated answers a second: who won,
the time to decide, and for equal rates ``false_winner_rate`` (also at the top level:
all equal runs, against the test's alpha). Its table comes last before the JSON.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from graylane.app.bench.decisions_outcomes import (
    ALPHA,
    HORIZON_S,
    OutcomeRun,
    OutcomeScenario,
    outcome_row,
    simulate_outcomes,
)
from graylane.app.bench.decisions_sim import RunResult, Scenario, simulate
from graylane.rollouts.spec import GateMode

TARGET_RATE = 50.0


@dataclass(frozen=True)
class DecisionsConfig:
    rates: tuple[float, ...] = (10.0, 50.0, 200.0)
    runs: int = 40
    """Runs per scenario at the target rate (half at other rates)."""
    healthy_factor: int = 5
    """Healthy scenarios run this many times more (false rollbacks are rare)."""
    workers: int = 2
    seed: int = 11
    mode: GateMode = GateMode.SEQUENTIAL
    """The primary gate mode (``false_rollback_rate``); the others run for comparison."""
    outcome_rates: tuple[float, ...] = (10.0, 50.0)
    """Rated answers a second of the A/B outcome scenarios."""


@dataclass(frozen=True)
class _Job:
    mode: GateMode
    scenario: Scenario
    rate: float
    seeds: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.mode.value}/{self.scenario.value}@{self.rate:g}"


def _run(job: _Job) -> list[RunResult]:
    return [simulate(job.scenario, job.mode, job.rate, seed) for seed in job.seeds]


@dataclass(frozen=True)
class _OutcomeJob:
    scenario: OutcomeScenario
    rate: float
    seeds: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.scenario.value}@{self.rate:g}"


def _run_outcomes(job: _OutcomeJob) -> list[OutcomeRun]:
    return [simulate_outcomes(job.scenario, job.rate, seed) for seed in job.seeds]


def _outcome_jobs(cfg: DecisionsConfig) -> Iterator[_OutcomeJob]:
    for si, scenario in enumerate(OutcomeScenario):
        for ri, rate in enumerate(cfg.outcome_rates):
            n = cfg.runs * (cfg.healthy_factor if scenario is OutcomeScenario.OUTCOME_EQUAL else 1)
            base = cfg.seed * 1_000_033 + (si + 50) * 100_003 + ri * 10_007
            yield _OutcomeJob(scenario, rate, tuple(base + i for i in range(n)))


def outcome_table(rows: dict[str, dict[str, object]]) -> str:
    """The A/B outcome rows, as a table."""
    head = (
        f"{'scenario':16s} {'rated/s':>8s} {'runs':>5s} {'baseline won':>13s} "
        f"{'candidate won':>14s} {'no diff':>8s} {'decide p50':>11s} {'decide p95':>11s} "
        f"{'rated p50':>10s}"
    )
    lines = [
        f"A/B on outcomes: baseline thumbs up 70 %, alpha {ALPHA:g}, "
        f"horizon {HORIZON_S:g} s, a look every 2 s",
        head,
    ]
    for name, row in rows.items():
        scenario, _, rate = name.partition("@")

        def fmt(key: str, values: dict[str, object] = row, unit: str = " s") -> str:
            value = values[key]
            return f"{value:.0f}{unit}" if isinstance(value, float) else "-"

        lines.append(
            f"{scenario:16s} {rate:>8s} {row['runs']:>5} {row['baseline_won']:>13} "
            f"{row['candidate_won']:>14} {row['no_difference']:>8} "
            f"{fmt('decide_s_p50'):>11s} {fmt('decide_s_p95'):>11s} "
            f"{fmt('rated_p50', unit=''):>10s}"
        )
    return "\n".join(lines)


def _jobs(cfg: DecisionsConfig) -> Iterator[_Job]:
    for si, scenario in enumerate(Scenario):
        for ri, rate in enumerate(cfg.rates):
            n = cfg.runs if rate == TARGET_RATE else max(1, cfg.runs // 2)
            if scenario.healthy:
                n *= cfg.healthy_factor
            seeds = tuple(cfg.seed * 1_000_003 + si * 100_003 + ri * 10_007 + i for i in range(n))
            for mode in GateMode:
                yield _Job(mode, scenario, rate, seeds)


def _detected(scenario: Scenario, r: RunResult) -> float | None:
    """Seconds from onset to the controller's action on ``scenario``; None if none."""
    if scenario is Scenario.BACKLOG:
        return r.detect_s if not r.rolled_back and r.detect_s is not None else None
    if scenario is Scenario.GEN_LENGTH_X2:
        return r.drift_s if not r.latency_rollback else None
    return r.detect_s if r.rolled_back else None


def summarize(scenario: Scenario, results: list[RunResult]) -> dict[str, object]:
    times = [t for t in (_detected(scenario, r) for r in results) if t is not None]
    row: dict[str, object] = {
        "runs": len(results),
        "detected": len(times),
        "rolled_back": sum(r.rolled_back for r in results),
        "promoted": sum(r.promoted for r in results),
        "detect_s_p50": float(np.percentile(times, 50)) if times else None,
        "detect_s_p95": float(np.percentile(times, 95)) if times else None,
    }
    if scenario.generative:
        row["latency_rollbacks"] = sum(r.latency_rollback for r in results)
        row["length_drift"] = sum(r.drift_s is not None for r in results)
    return row


def generation_table(scenarios: dict[str, dict[str, object]], mode: GateMode) -> str:
    """The generation rows of ``mode`` at the target rate, as a table."""
    head = (
        f"{'scenario':16s} {'runs':>5s} {'detected':>9s} {'rolled back':>12s} "
        f"{'latency rb':>11s} {'length drift':>13s} {'promoted':>9s} "
        f"{'detect p50':>11s} {'detect p95':>11s}"
    )
    lines = [f"generations, {mode.value} gates, {TARGET_RATE:g} candidate generations/s", head]
    for scenario in Scenario:
        row = scenarios.get(f"{mode.value}/{scenario.value}@{TARGET_RATE:g}")
        if not scenario.generative or row is None:
            continue

        def secs(key: str, values: dict[str, object] = row) -> str:
            value = values[key]
            return f"{value:.1f} s" if isinstance(value, float) else "-"

        lines.append(
            f"{scenario.value:16s} {row['runs']:>5} {row['detected']:>9} "
            f"{row['rolled_back']:>12} {row['latency_rollbacks']:>11} "
            f"{row['length_drift']:>13} {row['promoted']:>9} "
            f"{secs('detect_s_p50'):>11s} {secs('detect_s_p95'):>11s}"
        )
    return "\n".join(lines)


def main(cfg: DecisionsConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    jobs = list(_jobs(cfg))
    total = sum(len(j.seeds) for j in jobs)
    workers = max(1, min(cfg.workers, os.cpu_count() or 1))
    progress(f"{total} simulated rollouts, {len(jobs)} rows, {workers} processes")
    scenarios: dict[str, dict[str, object]] = {}
    healthy = {mode: [0, 0] for mode in GateMode}
    gen_healthy = {mode: [0, 0] for mode in GateMode}
    with ProcessPoolExecutor(workers) as pool:
        for job, results in zip(jobs, pool.map(_run, jobs), strict=True):
            row = summarize(job.scenario, results)
            scenarios[job.name] = row
            if job.scenario.healthy:
                tally = gen_healthy if job.scenario.generative else healthy
                tally[job.mode][0] += int(str(row["rolled_back"]))
                tally[job.mode][1] += len(results)
            rules = sorted({r.rule for r in results if r.rolled_back})
            progress(
                f"{job.name:32s} runs {row['runs']:4} rolled back {row['rolled_back']:4} "
                f"promoted {row['promoted']:4} detect p50 {row['detect_s_p50']} "
                f"p95 {row['detect_s_p95']} s {','.join(rules)}"
            )
        outcome_jobs = list(_outcome_jobs(cfg))
        outcomes: dict[str, dict[str, object]] = {}
        equal = [0, 0]
        for ojob, oresults in zip(outcome_jobs, pool.map(_run_outcomes, outcome_jobs), strict=True):
            orow = outcome_row(ojob.scenario, oresults)
            outcomes[ojob.name] = orow
            if ojob.scenario is OutcomeScenario.OUTCOME_EQUAL:
                equal[0] += len(oresults) - int(str(orow["no_difference"]))
                equal[1] += len(oresults)
            progress(
                f"{ojob.name:32s} runs {orow['runs']:4} baseline won {orow['baseline_won']:4} "
                f"candidate won {orow['candidate_won']:4} decide p50 {orow['decide_s_p50']} "
                f"p95 {orow['decide_s_p95']} s"
            )
    for mode, (bad, n) in healthy.items():
        progress(f"{mode.value}: {bad}/{n} healthy runs rolled back ({bad / n:.2%})")
    for mode, (bad, n) in gen_healthy.items():
        progress(f"{mode.value}: {bad}/{n} healthy generation runs rolled back ({bad / n:.2%})")
    print(generation_table(scenarios, cfg.mode))
    false_winners, equal_runs = equal
    progress(f"A/B: {false_winners}/{equal_runs} equal runs named a winner (alpha {ALPHA:g})")
    print(outcome_table(outcomes))
    bad, n = healthy[cfg.mode]
    gen_bad, gen_n = gen_healthy[cfg.mode]
    print(
        json.dumps(
            {
                "scenarios": scenarios,
                "false_rollback_rate": bad / n if n else 0.0,
                "generation_false_rollback_rate": gen_bad / gen_n if gen_n else 0.0,
                "outcomes": outcomes,
                "false_winner_rate": false_winners / equal_runs if equal_runs else 0.0,
            }
        )
    )
    return 0
