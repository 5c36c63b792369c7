"""``graylane bench rollback``: how fast a bad canary is rolled back, and how often
a healthy one is rolled back by mistake.

A bad candidate under steady load regresses from the moment it gets traffic
(the onset: the routing update that gives it its first step's share): once with
p99 about 3x the baseline's, once with +5 percentage points of errors (each
request fails on its own with 5 %: that worker runs batches of one, as injected
faults fail a whole engine call). Detection time is from onset to the routing
update that sets it back to 0 %. Then a healthy candidate with noisy latency
goes through the whole ramp, ``runs`` times.

The first step's weight gives the bad candidate ``BAD_CANDIDATE_RPS`` (5 % at
the least, 30 % at the most): an error regression is detected on counts, not
on a share. At ``alpha / 2`` = 0.005 the error test needs about 6-8 candidate
errors at a 25-30 % share (fewer at a smaller share, but they come slower), so
+5 pp is rolled back within 10 s only where the candidate gets about 30
requests/s; the JSON reports ``candidate_rps``, and a machine whose stack cannot
carry that load reports a longer detection, as it should.

The load is a fraction (``load_fraction``) of the capacity measured on this
machine first, so a slower machine tells the same story: the engine's
(``graylane calibrate``, :mod:`graylane.capacity`) and the whole path's
(client, router, worker and back, offered the engine's capacity for a few
seconds), whichever is lower; a tiny model's engine is rarely the bottleneck.
Each healthy run starts only once both versions' worker groups have consumed
their topics (lag 0, read from the committed offsets): a run never judges
the previous run's queue.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graylane.app.bench.harness import BenchStack, WorkerSpec, bench_stack, demo_model
from graylane.app.bench.path import DRAIN_TIMEOUT_S, drained, path_capacity
from graylane.rollouts.pb import phase_from_pb
from graylane.rollouts.vocabulary import Phase
from graylane.settings import Settings
from graylane.v1 import rollout_pb2

__all__ = [
    "BAD_CANDIDATE_RPS",
    "CAPACITY_VERSION",
    "DETECT_BUDGET_S",
    "HEALTHY_STEPS",
    "MAX_FIRST_WEIGHT",
    "MODEL",
    "STEPS",
    "RollbackConfig",
    "bad_steps",
    "detect",
    "engine_capacity",
    "first_weight",
    "main",
    "phase",
    "scenario_bad",
    "scenario_healthy",
    "spec",
    "start",
    "summary",
]

MODEL = "bench-gpt"
CAPACITY_VERSION = "0.0.0-bench"
"""Version name the bench model's capacity profile is stored under."""
STEPS = ((5.0, 30, 20.0), (25.0, 60, 3.0), (50.0, 60, 3.0), (100.0, 60, 2.0))
BAD_CANDIDATE_RPS = 30.0
"""Requests/s a bad canary's first step should get: detection needs counts, not a share."""
MAX_FIRST_WEIGHT = 30.0
HEALTHY_STEPS = ((5.0, 30, 3.0), (25.0, 40, 3.0), (50.0, 40, 3.0), (100.0, 40, 2.0))
DETECT_BUDGET_S = 10.0
"""Onset to rollback, for both regressions (issue target)."""


@dataclass(frozen=True)
class RollbackConfig:
    load_fraction: float = 0.5
    """Steady load as a fraction of the capacity measured here (the lower of the fp32
    engine's and the whole path's)."""
    rate: float | None = None
    """An explicit load in req/s instead (for comparisons across runs only)."""
    runs: int = 10
    bad_runs: int = 3
    """Runs of each bad canary (the figures are their median; the slowest is reported too)."""
    jitter_ms: float = 15.0
    window_ms: int = 4000
    step_ms: int = 1000
    timeout_s: float = 120.0


def spec(
    rollout_id: str, baseline: str, candidate: str, steps: tuple[tuple[float, int, float], ...]
) -> rollout_pb2.RolloutSpec:
    return rollout_pb2.RolloutSpec(
        rollout_id=rollout_id,
        model=MODEL,
        baseline_version=baseline,
        candidate_version=candidate,
        strategy=rollout_pb2.CANARY,
        steps=[
            rollout_pb2.RolloutStep(weight_percent=w, min_samples=n, min_dwell_s=d)
            for w, n, d in steps
        ],
        failures_to_rollback=2,
    )


async def start(
    stack: BenchStack,
    rollout_id: str,
    baseline: str,
    candidate: str,
    steps: tuple[tuple[float, int, float], ...],
) -> None:
    await stack.command(
        rollout_pb2.RolloutCommand(
            rollout_id=rollout_id,
            kind=rollout_pb2.COMMAND_START,
            spec=spec(rollout_id, baseline, candidate, steps),
        )
    )


def phase(stack: BenchStack, rollout_id: str) -> Phase | None:
    """The rollout's last seen phase; None before the first state arrives."""
    state = stack.monitor.rollouts.get(rollout_id)
    return phase_from_pb(state.phase) if state else None


def first_weight(rate: float) -> float:
    """The bad canary's first-step weight: what gives it BAD_CANDIDATE_RPS, within 5-30 %."""
    return round(min(MAX_FIRST_WEIGHT, max(5.0, 100.0 * BAD_CANDIDATE_RPS / rate)), 1)


def bad_steps(rate: float) -> tuple[tuple[float, int, float], ...]:
    """The ramp with the bad canary's first weight (the later steps rise above it)."""
    first = first_weight(rate)
    return ((first, *STEPS[0][1:]), *(s for s in STEPS[1:] if s[0] > first))


async def detect(
    stack: BenchStack, candidate: str, cfg: RollbackConfig, tag: str
) -> dict[str, float]:
    """Run one bad canary; seconds from onset to the 0 % routing update."""
    m = stack.monitor
    rollout_id = f"ro-{tag}-{int(time.time())}"
    await start(stack, rollout_id, "base", candidate, bad_steps(stack.rate))
    got_traffic = await stack.wait_for(lambda: m.weights.get(candidate, 0.0) > 0, cfg.timeout_s)
    if not got_traffic:
        raise RuntimeError(f"{candidate} never got traffic")
    onset = m.now()
    rolled_back = await stack.wait_for(lambda: m.weights.get(candidate, 0.0) == 0.0, cfg.timeout_s)
    detected = m.now()
    await asyncio.sleep(2.0)  # results of requests already in flight
    served = sum(1 for s in m.history if s.version == candidate and s.at >= onset)
    return {
        "detect_s": round(detected - onset, 2) if rolled_back else float("nan"),
        "rolled_back": float(rolled_back),
        "bad_served": float(served),
        "phase_rolled_back": float(phase(stack, rollout_id) is Phase.ROLLED_BACK),
    }


async def scenario_bad(
    settings: Settings,
    model: Path,
    cfg: RollbackConfig,
    engine_rps: float,
    progress: Callable[[str], None],
) -> tuple[float, dict[str, object]]:
    """(the load it ran at, its figures)."""
    base = WorkerSpec("base", {"fp32": str(model)})
    async with bench_stack(
        settings,
        model=MODEL,
        stable="base",
        workers=[base],
        window_ms=cfg.window_ms,
        step_ms=cfg.step_ms,
        tag="rb",
        later_versions=("slow", "errors"),
    ) as stack:
        stack.monitor.window_s = 30.0
        path: float | None = None
        if cfg.rate is not None:
            rate = cfg.rate
        else:
            path = await path_capacity(stack, engine_rps, ("base",))
            rate = cfg.load_fraction * min(path, engine_rps)
            progress(
                f"    path capacity {path:.0f} req/s, engine {engine_rps:.0f} req/s "
                f"-> load {rate:.0f} req/s ({cfg.load_fraction:.0%})"
            )
        stack.rate = rate
        stop = asyncio.Event()
        load = asyncio.create_task(stack.load(stop))
        progress(f"baseline latency at {rate:.0f} req/s")
        await asyncio.sleep(12)
        base_lat = [s.latency_ms for s in stack.monitor.window().get("base", []) if s.ok]
        p99 = float(np.percentile(base_lat, 99))
        extra = max(2.0 * p99, 20.0)
        progress(f"    baseline p99 {p99:.1f} ms -> slow candidate adds {extra:.0f} ms per batch")
        stack.add_worker(
            WorkerSpec("slow", {"fp32": str(model)}, ("--inject-latency-ms", f"{extra:.1f}"))
        )
        stack.add_worker(
            WorkerSpec(
                "errors",
                {"fp32": str(model)},
                ("--inject-error-rate", "0.05", "--max-batch", "1", "--max-wait-ms", "0"),
            )
        )
        await asyncio.sleep(10)  # both warm up and join their groups
        stack.monitor.window_s = 5.0
        weight = first_weight(rate)
        runs: dict[str, list[dict[str, float]]] = {"slow": [], "errors": []}
        what = {"slow": "p99 x3", "errors": "+5 pp errors"}
        for i in range(cfg.bad_runs):
            for candidate in ("slow", "errors"):
                # the previous bad canary's queue drains first: each run starts clean
                await drained(stack, {candidate: 0, "base": max(1, round(rate))})
                progress(
                    f"candidate with {what[candidate]} at {weight:g} % (run {i + 1}/{cfg.bad_runs})"
                )
                runs[candidate].append(await detect(stack, candidate, cfg, f"{candidate}{i}"))
                progress(f"    {runs[candidate][-1]}")
                await asyncio.sleep(5)
        stop.set()
        await load
    slow, errors = summary(runs["slow"]), summary(runs["errors"])
    for name, got in (("latency", slow), ("error", errors)):
        met = got["median"] <= DETECT_BUDGET_S
        progress(
            f"    {name} rollback within {DETECT_BUDGET_S:.0f} s: {'yes' if met else 'NO'} "
            f"(median {got['median']:.2f} s, slowest {got['max']:.2f} s "
            f"of {cfg.bad_runs} runs)"
        )
    return rate, {
        "candidate_weight_percent": weight,
        "candidate_rps": round(rate * weight / 100.0, 1),
        "path_capacity_rps": round(path, 1) if path is not None else None,
        "baseline_p99_ms": round(p99, 1),
        "detect_latency_s": _finite(slow["median"]),
        "detect_errors_s": _finite(errors["median"]),
        "detect_latency_s_max": _finite(slow["max"]),
        "detect_errors_s_max": _finite(errors["max"]),
        "detect_latency_s_runs": [_finite(r["detect_s"]) for r in runs["slow"]],
        "detect_errors_s_runs": [_finite(r["detect_s"]) for r in runs["errors"]],
        "bad_served_after_onset": int(slow["served"] + errors["served"]),
        "bad_served_latency": int(slow["served"]),
        "bad_served_errors": int(errors["served"]),
    }


def _finite(seconds: float) -> float | None:
    """JSON has no infinity: a detection that never happened is null."""
    return seconds if math.isfinite(seconds) else None


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median and slowest detection over ``runs`` (a run never rolled back counts as
    infinitely slow), and the mean requests the bad candidate served per run."""
    times = [r["detect_s"] if r["rolled_back"] else math.inf for r in runs]
    return {
        "median": round(float(np.median(times)), 2),
        "max": max(times),
        "served": float(np.mean([r["bad_served"] for r in runs])),
    }


async def scenario_healthy(
    settings: Settings,
    model: Path,
    cfg: RollbackConfig,
    rate: float,
    progress: Callable[[str], None],
) -> dict[str, float]:
    jitter = ("--inject-latency-jitter-ms", str(cfg.jitter_ms))
    workers = [
        WorkerSpec("base", {"fp32": str(model)}, jitter),
        WorkerSpec("next", {"fp32": str(model)}, jitter),
    ]
    false_rollbacks = promoted = 0
    durations: list[float] = []
    async with bench_stack(
        settings,
        model=MODEL,
        stable="base",
        workers=workers,
        window_ms=cfg.window_ms,
        step_ms=cfg.step_ms,
        tag="rh",
    ) as stack:
        stack.rate = rate
        stop = asyncio.Event()
        load = asyncio.create_task(stack.load(stop))
        await asyncio.sleep(8)
        baseline, candidate = "base", "next"
        for run in range(cfg.runs):
            # The candidate was idle (or just promoted from): its topic must be empty
            # before the next rollout judges it, or it would judge the queue.
            in_flight = max(1, round(rate))  # a second of traffic on the loaded version
            if not await drained(stack, {candidate: 0, baseline: in_flight}):
                progress(
                    f"    still a backlog after {DRAIN_TIMEOUT_S:.0f} s; the run starts anyway"
                )
            rollout_id = f"ro-healthy-{run}-{int(time.time())}"
            t0 = time.monotonic()
            await start(stack, rollout_id, baseline, candidate, HEALTHY_STEPS)
            finished = await stack.wait_for(
                lambda rid=rollout_id: (  # type: ignore[misc]
                    (p := phase(stack, rid)) is not None and p.finished
                ),
                cfg.timeout_s,
            )
            outcome = phase(stack, rollout_id)
            durations.append(time.monotonic() - t0)
            if outcome is Phase.ROLLED_BACK:
                false_rollbacks += 1
            elif outcome is Phase.PROMOTED:
                promoted += 1
                baseline, candidate = candidate, baseline
            progress(
                f"    healthy run {run + 1}/{cfg.runs}: "
                f"{outcome.name if finished and outcome else 'TIMEOUT'} "
                f"in {durations[-1]:.0f} s"
            )
            await asyncio.sleep(2)
        stop.set()
        await load
    return {
        "false_rollbacks": false_rollbacks,
        "healthy_runs": cfg.runs,
        "healthy_promoted": promoted,
        "healthy_ramp_s_median": round(float(np.median(durations)), 1),
    }


def engine_capacity(settings: Settings, model: Path, progress: Callable[[str], None]) -> float:
    """The fp32 engine's requests/s as calibrated on this machine (measured if not yet)."""
    from graylane.app.cli.capacity import ensure_calibrated
    from graylane.capacity import measured_capacity

    profile = ensure_calibrated(
        settings,
        MODEL,
        CAPACITY_VERSION,
        {"fp32": model},
        seq_len=BenchStack.prompt_len,
        batches=(1, 8),
        progress=progress,
    )
    capacity = measured_capacity(settings.artifact_dir, MODEL, CAPACITY_VERSION, "fp32")
    if capacity is None:
        raise RuntimeError(f"no capacity for {MODEL} on {profile.host}")
    progress(f"fp32 engine capacity {capacity:.0f} req/s on {profile.host}")
    return capacity


def main(cfg: RollbackConfig) -> int:
    from graylane.deploy.kafka import broker as kafka_broker

    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    progress("starting the broker")
    kafka_broker.start()
    model = demo_model("tiny", progress=progress)
    settings = Settings.from_env()
    capacity = engine_capacity(settings, model, progress)
    result: dict[str, object] = {
        "engine_capacity_rps": round(capacity, 1),
        "load_fraction": cfg.load_fraction if cfg.rate is None else None,
        "window_ms": cfg.window_ms,
        "step_ms": cfg.step_ms,
    }
    progress("regressions at the first canary step")
    rate, bad = asyncio.run(scenario_bad(settings, model, cfg, capacity, progress))
    result["rate_rps"] = round(rate, 1)
    result.update(bad)
    if cfg.runs > 0:
        progress(f"healthy candidate with noisy latency through the whole ramp, {cfg.runs} times")
        result.update(asyncio.run(scenario_healthy(settings, model, cfg, rate, progress)))
    print(json.dumps(result))
    return 0
