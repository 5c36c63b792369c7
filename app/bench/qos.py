"""``graylane bench qos``: one calibrated 3x overload spike, four runs.

One model version serves fp32 and int8-dynamic variants of the small demo GPT.
The steady load is a fraction (``base_fraction``) of the fp32 capacity of one
worker as it holds here: the lower of the engine's (``graylane calibrate``,
the engine alone with the whole machine) and the whole path's (client, router,
worker and back in the running stack, :mod:`.path`); on a small machine the
router, policy engine and client share the CPU and the path serves far less.
The spike triples the steady load. The SLO stays ``slo_factor`` x fp32's
calibrated batch-1 service time: it is what one request costs the model, the
figure a user's SLO is set against. The runs:

1. ``fp32_only``: no QoS controller, no admission control;
2. ``qos``: the QoS controller (steps down on p99 or shedding, back up once the
   offered load is below 0.7 x fp32's capacity in the running stack: the
   calibrated figure x the contention the policy engine observes);
3. ``qos_admission``: and workers shed what cannot meet the SLO deadline;
4. ``qos_admission_scale``: and a supervisor starts/stops workers as the policy
   engine's scale requests say (a :data:`ScaleOut` hook; by default the local
   stack supervisor of ``graylane supervise``, run in this process).

Each run is scored over every request submitted from the steady part before
the spike to the end of the recovery (see :mod:`.qos_score`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass

from graylane.app.bench.harness import BenchStack, WorkerSpec, bench_stack
from graylane.app.bench.path import path_capacity
from graylane.app.bench.qos_score import RunScore, Slice, score, seconds_to_top, timeline
from graylane.settings import Settings
from graylane.v1 import rollout_pb2

__all__ = [
    "LADDER",
    "MODEL",
    "SCALE_POLICY_ARGS",
    "VERSION",
    "QosConfig",
    "QosRunResult",
    "RunSpec",
    "local_supervisor",
    "main",
    "measure_path",
    "qos_policy",
    "run_once",
]

MODEL = "bench-gpt"
VERSION = "v1"
LADDER = ("fp32", "int8-dynamic")

ScaleOut = Callable[[BenchStack, WorkerSpec], AbstractAsyncContextManager[Callable[[], int]]]
"""Given the run's stack and its worker spec, runs the supervisor that obeys the
policy engine's scale requests for the run's duration; yields the number of
workers running now."""


@dataclass(frozen=True)
class QosConfig:
    base_fraction: float = 0.5
    spike_factor: float = 3.0
    steady_s: float = 10.0
    spike_s: float = 40.0
    recovery_s: float = 60.0
    prompt_len: int = 96
    slo_factor: float = 5.0
    """SLO = slo_factor x fp32's calibrated batch-1 service time (at least 100 ms)."""
    warmup_s: float = 10.0
    """Steady load before the scored span (the batch learner settles)."""
    runs: tuple[str, ...] = ()
    """Names of the runs to do (empty: all four)."""


@dataclass(frozen=True)
class RunSpec:
    name: str
    qos: bool
    admission: bool
    scale_out: ScaleOut | None = None


@dataclass(frozen=True)
class QosRunResult:
    """One QoS bench run: its score, the workers it used and its timeline."""

    name: str
    score: RunScore
    max_workers: int
    seconds_to_fp32_after_spike: float | None
    variants: tuple[str, ...]
    slices: tuple[Slice, ...] = ()
    """The scored span in 5 s slices."""
    samples: tuple[tuple[float, int, str], ...] = ()
    """(seconds into the scored span, workers running, precision commanded) every 0.5 s."""

    def table(self, spike: tuple[float, float]) -> list[str]:
        """The run's timeline, one line per slice: where goodput was lost, and why."""
        lines = ["      t(s) phase     sent  good  late  shed  err  workers  precision"]
        for sl in self.slices:
            s, end = sl.score, sl.start_s + 5.0
            seen = [(w, v) for at, w, v in self.samples if sl.start_s <= at < end]
            workers = max((w for w, _ in seen), default=0)
            precision = seen[-1][1] if seen else "-"
            name = (
                "spike"
                if spike[0] <= sl.start_s < spike[1]
                else ("steady" if sl.start_s < spike[0] else "after")
            )
            lines.append(
                f"    {sl.start_s:6.0f} {name:8} {s.requests:5} {s.good:5} {s.late:5} "
                f"{s.shed:5} {s.errors + s.unanswered:4} {workers:8}  {precision}"
            )
        changes, last = [], (1, LADDER[0])
        for at, w, v in self.samples:
            if w != last[0]:
                changes.append(f"t={at:.1f}s {w} worker{'s' if w > 1 else ''}")
            if v != last[1]:
                changes.append(f"t={at:.1f}s {v}")
            last = (w, v)
        lines.append("      changes: " + (", ".join(changes) or "none"))
        return lines

    def to_json(self) -> dict[str, object]:
        s = self.score
        return {
            "goodput": round(s.goodput, 4),
            "p99_admitted_ms": round(s.p99_admitted_ms, 1),
            "shed": s.shed,
            "errors": s.errors,
            "unanswered": s.unanswered,
            "requests": s.requests,
            "max_workers": self.max_workers,
            "seconds_to_fp32_after_spike": (
                None
                if self.seconds_to_fp32_after_spike is None
                else round(self.seconds_to_fp32_after_spike, 1)
            ),
            "variants": list(self.variants),
        }


def qos_policy(slo_ms: float, capacities: dict[str, float]) -> rollout_pb2.QosPolicy:
    return rollout_pb2.QosPolicy(
        model=MODEL,
        version=VERSION,
        slo_p99_ms=slo_ms,
        ladder=list(LADDER),
        quality_floor=LADDER[-1],
        step_down_margin=0.2,
        step_up_ratio=0.6,
        sustain_s=2.0,
        min_dwell_s=10.0,
        enabled=True,
        rung_capacity_rps=capacities,
        up_capacity_fraction=0.7,
    )


SCALE_POLICY_ARGS = ("--max-replicas", "2", "--scale-cooldown-s", "20", "--scale-in-load", "0.6")
"""The policy engine's scale settings in the scale-out run: up to 2 workers (the
version topic has 6 partitions: 3 each); scale in after 20 s with the load under 0.6 x
one worker's calibrated capacity (the steady load is 0.5 x)."""


@contextlib.asynccontextmanager
async def _one_worker(stack: BenchStack, spec: WorkerSpec) -> AsyncIterator[Callable[[], int]]:
    yield lambda: 1


def local_supervisor(max_workers: int = 2, warm_standby: int = 1) -> ScaleOut:
    """The local stack supervisor (``graylane supervise``) in this process: it follows
    the run's scale topic and starts/stops worker processes of ``spec``, with
    ``warm_standby`` warmed workers waiting to join (``--warm-standby``)."""

    @contextlib.asynccontextmanager
    async def supervise(stack: BenchStack, spec: WorkerSpec) -> AsyncIterator[Callable[[], int]]:
        from graylane.app.cli.scaler import ScaleSupervisor, WorkerTemplate
        from graylane.settings import REPO_ROOT

        variants = [
            a for name, path in spec.variants.items() for a in ("--variant", f"{name}={path}")
        ]
        template = WorkerTemplate(
            model=stack.model,
            version=spec.version,
            args=("--threads", "1", *variants, *spec.extra_args),
        )
        supervisor = ScaleSupervisor(
            stack.factory,
            [template],
            max_workers=max_workers,
            warm_standby=warm_standby,
            first_standby_delay_s=0.0,  # warmed before the scored span starts
            log_dir=REPO_ROOT / ".local" / "logs",
            grace_s=10.0,
        )
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(supervisor.run(stop, ready))
        try:
            await ready.wait()
            await stack.wait_served()
            yield lambda: len(supervisor.running(stack.model, spec.version))
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await task

    return supervise


async def run_once(
    settings: Settings,
    variants: dict[str, str],
    cfg: QosConfig,
    *,
    base_rate: float,
    slo_ms: float,
    capacities: dict[str, float],
    run: RunSpec,
    progress: Callable[[str], None],
) -> QosRunResult:
    extra = ("--default-deadline-ms", f"{slo_ms:.0f}") if run.admission else ()
    worker = WorkerSpec(VERSION, variants, extra_args=extra)
    scaled = run.scale_out is not None
    async with bench_stack(
        settings,
        model=MODEL,
        stable=VERSION,
        workers=[] if scaled else [worker],  # the supervisor starts them
        later_versions=[VERSION] if scaled else [],
        policy_args=SCALE_POLICY_ARGS if scaled else (),
        wait_served=not scaled,
        window_ms=4000,
        step_ms=1000,
        tag=f"qos-{run.name.replace('_', '-')}",
    ) as stack:
        supervise = run.scale_out or _one_worker
        async with supervise(stack, worker) as workers_now:
            stack.rate, stack.prompt_len = base_rate, cfg.prompt_len
            stop = asyncio.Event()
            load = asyncio.create_task(stack.load(stop))
            m = stack.monitor
            await asyncio.sleep(cfg.warmup_s)
            if run.qos:
                await stack.command(
                    rollout_pb2.RolloutCommand(
                        kind=rollout_pb2.COMMAND_SET_QOS_POLICY,
                        qos_policy=qos_policy(slo_ms, capacities),
                    )
                )
            start = time.monotonic()
            samples: list[tuple[float, int, str]] = []

            async def phase(rate: float, seconds: float) -> None:
                stack.rate = rate
                until = time.monotonic() + seconds
                while time.monotonic() < until:
                    await asyncio.sleep(0.5)
                    changes = m.precision_changes.get(VERSION, [])
                    variant = changes[-1][1] if changes else LADDER[0]
                    samples.append((time.monotonic() - start, workers_now(), variant))

            await phase(base_rate, cfg.steady_s)
            progress(
                f"    {run.name}: SLO {slo_ms:.0f} ms; spike x{cfg.spike_factor:g} "
                f"for {cfg.spike_s:.0f} s"
            )
            spike_start_at = m.now()
            await phase(base_rate * cfg.spike_factor, cfg.spike_s)
            spike_end_at = m.now()
            await phase(base_rate, cfg.recovery_s)
            stop.set()
            await load
            end = time.monotonic()
            await stack.wait_for(lambda: _answered(stack, start, end), timeout_s=15)
        back = seconds_to_top(m.precision_changes.get(VERSION, []), LADDER[0], spike_end_at)
        result = QosRunResult(
            name=run.name,
            score=score(stack.sent_at, stack.answers, start=start, end=end, slo_ms=slo_ms),
            max_workers=max((w for _, w, _ in samples), default=1),
            seconds_to_fp32_after_spike=back,
            variants=tuple(
                sorted({s.variant for s in m.history if s.variant and s.at >= spike_start_at})
            ),
            slices=timeline(stack.sent_at, stack.answers, start=start, end=end, slo_ms=slo_ms),
            samples=tuple(samples),
        )
        return result


async def measure_path(
    settings: Settings, variants: dict[str, str], cfg: QosConfig, *, offered: float
) -> float:
    """Results/s one fp32 worker's whole path delivers here (no QoS, no admission),
    offered ``offered`` req/s (the engine's calibrated capacity: more than the path)."""
    worker = WorkerSpec(VERSION, variants)
    async with bench_stack(
        settings, model=MODEL, stable=VERSION, workers=[worker], tag="qos-path"
    ) as stack:
        stack.prompt_len = cfg.prompt_len
        stack.monitor.window_s = 30.0
        return await path_capacity(stack, offered, (VERSION,))


def _answered(stack: BenchStack, start: float, end: float) -> bool:
    return all(rid in stack.answers for rid, at in stack.sent_at.items() if start <= at < end)


def main(cfg: QosConfig, scale_out: ScaleOut | None = None) -> int:
    """``scale_out``: the supervisor of run 4 (default: :func:`local_supervisor`)."""
    from graylane.app.cli.capacity import ensure_calibrated, registered_variants
    from graylane.app.demo.build_versions import build_versions
    from graylane.capacity import rung_capacities
    from graylane.deploy.kafka import kafka

    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    progress("starting the broker")
    kafka.start()
    settings = Settings.from_env()
    progress("building fp32 and int8-dynamic variants of the small demo GPT")
    build_versions(settings, MODEL, {"9.0.0": 5}, size="small", progress=progress)
    files = registered_variants(settings, MODEL, "9.0.0")
    variants = {name: str(path) for name, path in files.items() if name in LADDER}
    profile = ensure_calibrated(
        settings, MODEL, "9.0.0", files, seq_len=cfg.prompt_len, batches=(1, 8), progress=progress
    )
    capacities = dict(rung_capacities(profile, LADDER))
    capacity = capacities[LADDER[0]]
    b1_ms = next(p.service_ms for p in profile.variant(LADDER[0]).points if p.batch == 1)
    slo = max(cfg.slo_factor * b1_ms, 100.0)
    progress(
        f"engine capacity of one worker on {profile.host}: "
        + ", ".join(f"{v} {rps:.0f} req/s" for v, rps in capacities.items())
    )
    path = asyncio.run(measure_path(settings, variants, cfg, offered=capacity))
    base_rate = cfg.base_fraction * min(path, capacity)
    progress(
        f"path capacity (one fp32 worker in the running stack) {path:.1f} req/s"
        + f"; steady load {base_rate:.1f} req/s, spike {base_rate * cfg.spike_factor:.1f} req/s"
        + f"; SLO {slo:.0f} ms ({cfg.slo_factor:g} x fp32's batch-1 service time)"
    )
    scale_out = scale_out or local_supervisor()
    runs = [
        RunSpec("fp32_only", qos=False, admission=False),
        RunSpec("qos", qos=True, admission=False),
        RunSpec("qos_admission", qos=True, admission=True),
        RunSpec("qos_admission_scale", qos=True, admission=True, scale_out=scale_out),
    ]
    runs = [r for r in runs if not cfg.runs or r.name in cfg.runs]
    results: dict[str, dict[str, object]] = {}
    for i, run in enumerate(runs, 1):
        progress(f"run {i}: {run.name}")
        result = asyncio.run(
            run_once(
                settings,
                variants,
                cfg,
                base_rate=base_rate,
                slo_ms=slo,
                capacities=capacities,
                run=run,
                progress=progress,
            )
        )
        results[run.name] = result.to_json()
        for line in result.table((cfg.steady_s, cfg.steady_s + cfg.spike_s)):
            progress(line)
        progress(f"    {json.dumps(results[run.name])}")
    summary: dict[str, object] = {
        "slo_ms": round(slo, 1),
        "capacity_rps_by_variant": {v: round(r, 1) for v, r in capacities.items()},
        "capacity_host": profile.host,
        "path_capacity_rps": round(path, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "base_rate_rps": round(base_rate, 1),
        "spike_factor": cfg.spike_factor,
        "config": asdict(cfg),
        "runs": results,
    }
    print(json.dumps(summary))
    return 0
