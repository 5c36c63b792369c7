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

**The generative run** (``--generative``, :func:`main_generative`) does the same
with generations: the small demo GPT's KV-cache export (``bench-chat``, fp32 and
int8-dynamic, built by the builder) served by continuous batching, its SLO
stated as TTFT and TPOT p99 (:class:`~graylane.app.bench.qos_score.GenerationSlo`:
a generation is good when both are met, however long its answer). Capacity is
measured in generations/s: each rung's engine alone in a
:class:`~graylane.engine_worker.kv_decode.KvDecodeLoop` at the worker's decode rows
(the policy's ``rung_capacity_rps``), and one fp32 worker's whole path here; the
steady load is ``base_fraction`` of the lower, the spike 3x it. TTFT SLO:
``ttft_factor`` x (one prefill + one full decode step) on the engine, at least
``min_ttft_ms``; TPOT SLO: ``tpot_factor`` x the fp32 TPOT p99 the path probe
saw with every decode row busy. Admission control is each request's TTFT
deadline (the worker sheds a generation that gets no decode row in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from graylane.app.bench.harness import BenchStack, GenerationLoad, WorkerSpec, bench_stack
from graylane.app.bench.path import path_capacity
from graylane.app.bench.qos_score import (
    GenerationSlo,
    RunScore,
    Slice,
    score,
    seconds_to_top,
    timeline,
)
from graylane.rollouts.pb import qos_policy_from_pb
from graylane.settings import Settings
from graylane.v1 import rollout_pb2

__all__ = [
    "CHAT_MODEL",
    "LADDER",
    "MODEL",
    "SCALE_POLICY_ARGS",
    "VERSION",
    "GenerativeConfig",
    "QosConfig",
    "QosRunResult",
    "RunSpec",
    "Workload",
    "generative_qos_policy",
    "local_supervisor",
    "main",
    "main_generative",
    "measure_path",
    "qos_policy",
    "run_once",
]

MODEL = "bench-gpt"
CHAT_MODEL = "bench-chat"
"""The generative run's model: the small demo GPT with a KV cache."""
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
class GenerativeConfig:
    """The generative run's model, load and SLO derivation (see the module docstring)."""

    prompt_len: int = 32
    new_tokens: int = 32
    """Mean output length; each request's is uniform in [n/2, 3n/2] (seeded)."""
    max_sequences: int = 4
    """The worker's decode rows (``--max-sequences``)."""
    ttft_factor: float = 5.0
    min_ttft_ms: float = 250.0
    tpot_factor: float = 1.5
    runs: tuple[str, ...] = ()
    """Names of the runs to do (empty: fp32_only, qos_admission, qos_admission_scale)."""


@dataclass(frozen=True)
class Workload:
    """What a run serves and how a request is judged."""

    model: str
    policy: rollout_pb2.QosPolicy
    slo_ms: float
    """Whole-request objective (0 = not judged: a generation's)."""
    worker_args: tuple[str, ...] = ()
    admission_args: tuple[str, ...] = ()
    """Worker arguments of the admission runs."""
    generation: GenerationLoad | None = None
    generation_slo: GenerationSlo | None = None
    ttft_deadline_ms: int = 0
    """Admission of generations: each request's TTFT deadline in the admission runs."""


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
    spike: RunScore | None = None
    """The requests submitted during the spike alone."""

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
        figures: dict[str, object] = {}
        if s.ttft_p99_ms or s.tpot_p99_ms:
            figures = {
                "ttft_p99_ms": round(s.ttft_p99_ms, 1),
                "tpot_p99_ms": round(s.tpot_p99_ms, 2),
            }
        if self.spike is not None:
            figures["goodput_spike"] = round(self.spike.goodput, 4)
            figures["requests_spike"] = self.spike.requests
        return {
            "goodput": round(s.goodput, 4),
            **figures,
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


def generative_qos_policy(
    ttft_ms: float, tpot_ms: float, capacities: dict[str, float]
) -> rollout_pb2.QosPolicy:
    """The generative run's policy: TTFT and TPOT p99 objectives, whole-request latency
    not judged; the waiting-sequences limit follows from ``capacities`` (generations/s)."""
    policy = qos_policy(0.0, capacities)
    policy.model = CHAT_MODEL
    policy.slo_ttft_p99_ms = ttft_ms
    policy.slo_tpot_p99_ms = tpot_ms
    return policy


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
    workload: Workload,
    run: RunSpec,
    progress: Callable[[str], None],
) -> QosRunResult:
    extra = workload.worker_args + (workload.admission_args if run.admission else ())
    worker = WorkerSpec(VERSION, variants, extra_args=extra)
    generation = workload.generation
    if generation is not None and run.admission:
        generation = replace(generation, ttft_deadline_ms=workload.ttft_deadline_ms)
    scaled = run.scale_out is not None
    slo_ms, slo_gen = workload.slo_ms, workload.generation_slo
    async with bench_stack(
        settings,
        model=workload.model,
        stable=VERSION,
        workers=[] if scaled else [worker],  # the supervisor starts them
        later_versions=[VERSION] if scaled else [],
        policy_args=SCALE_POLICY_ARGS if scaled else (),
        wait_served=not scaled,
        window_ms=4000,
        step_ms=1000,
        tag=f"qos-{run.name.replace('_', '-')}",
        generation=generation,
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
                        kind=rollout_pb2.COMMAND_SET_QOS_POLICY, qos_policy=workload.policy
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
            objectives = qos_policy_from_pb(workload.policy).objectives
            progress(
                f"    {run.name}: SLO {objectives}; spike x{cfg.spike_factor:g} "
                f"for {cfg.spike_s:.0f} s"
            )
            spike_start_at, spike_from = m.now(), time.monotonic()
            await phase(base_rate * cfg.spike_factor, cfg.spike_s)
            spike_end_at, spike_to = m.now(), time.monotonic()
            await phase(base_rate, cfg.recovery_s)
            stop.set()
            await load
            end = time.monotonic()
            await stack.wait_for(lambda: _answered(stack, start, end), timeout_s=15)
        back = seconds_to_top(m.precision_changes.get(VERSION, []), LADDER[0], spike_end_at)
        result = QosRunResult(
            name=run.name,
            score=score(
                stack.sent_at,
                stack.answers,
                start=start,
                end=end,
                slo_ms=slo_ms,
                generation=slo_gen,
            ),
            max_workers=max((w for _, w, _ in samples), default=1),
            seconds_to_fp32_after_spike=back,
            variants=tuple(
                sorted({s.variant for s in m.history if s.variant and s.at >= spike_start_at})
            ),
            slices=timeline(
                stack.sent_at,
                stack.answers,
                start=start,
                end=end,
                slo_ms=slo_ms,
                generation=slo_gen,
            ),
            samples=tuple(samples),
            spike=score(
                stack.sent_at,
                stack.answers,
                start=spike_from,
                end=spike_to,
                slo_ms=slo_ms,
                generation=slo_gen,
            ),
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


async def measure_generative_path(
    settings: Settings,
    variants: dict[str, str],
    gen: GenerativeConfig,
    load: GenerationLoad,
    *,
    offered: float,
) -> tuple[float, float]:
    """Generations/s one fp32 worker's whole path delivers here, offered ``offered``
    (more than it takes: every decode row busy), and the TPOT p99 it served them at."""
    worker = WorkerSpec(VERSION, variants, extra_args=_decode_args(gen))
    async with bench_stack(
        settings,
        model=CHAT_MODEL,
        stable=VERSION,
        workers=[worker],
        tag="qos-gen-path",
        generation=load,
    ) as stack:
        stack.prompt_len = gen.prompt_len
        stack.monitor.window_s = 30.0
        t0 = time.monotonic()
        rps = await path_capacity(stack, offered, (VERSION,))
        busy = [
            a.tpot_ms
            for rid, a in stack.answers.items()
            if a.ok and a.tpot_ms > 0 and stack.sent_at.get(rid, 0.0) >= t0
        ]
        tpot = float(np.percentile(busy, 99)) if busy else 0.0
        return rps, tpot


def _decode_args(gen: GenerativeConfig) -> tuple[str, ...]:
    rows = str(gen.max_sequences)
    return ("--max-batch", rows, "--max-sequences", rows)


def _output_lengths(mean: int, n: int = 997) -> tuple[int, ...]:
    """Seeded output lengths, uniform in [mean/2, 3 mean/2] (the load cycles them)."""
    rng = np.random.default_rng(2026)
    return tuple(int(x) for x in rng.integers(max(1, mean // 2), mean + mean // 2 + 1, size=n))


def _engine_generations(
    files: dict[str, Path], gen: GenerativeConfig, lengths: tuple[int, ...]
) -> tuple[dict[str, float], float, float]:
    """Per rung, generations/s of its engine alone at the worker's decode rows; and
    fp32's prefill of one prompt and its decode step with every row busy (ms)."""
    from graylane.app.bench.llm import engine_tokens_per_s, prefill_ms
    from graylane.engine.onnxruntime import OnnxRuntimeEngine

    rows, max_seq_len = gen.max_sequences, gen.prompt_len + max(lengths) + 8
    prompts = [[(7 * k + i) % 250 + 3 for k in range(gen.prompt_len)] for i in range(6 * rows)]
    news = list(lengths[: len(prompts)])
    mean = sum(news) / len(news)
    capacities: dict[str, float] = {}
    prefill = step = 0.0
    for name in LADDER:
        engine = OnnxRuntimeEngine.load(files[name], name, intra_op_threads=1)
        tokens_per_s = engine_tokens_per_s(engine, prompts, news, rows, max_seq_len)
        capacities[name] = tokens_per_s / mean
        if name == LADDER[0]:
            prefill = prefill_ms(engine, prompts[0], max_seq_len)
            step = 1000.0 * rows / tokens_per_s
    return capacities, prefill, step


def main_generative(
    cfg: QosConfig, gen: GenerativeConfig, scale_out: ScaleOut | None = None
) -> int:
    """The generative run: TTFT/TPOT SLO, goodput against it (see the module docstring)."""
    from graylane.app.cli.capacity import registered_variants
    from graylane.app.demo.build_versions import build_versions
    from graylane.deploy.kafka import broker as kafka_broker

    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    progress("starting the broker")
    kafka_broker.start()
    settings = Settings.from_env()
    progress("building fp32 and int8-dynamic variants of the small demo GPT with a KV cache")
    build_versions(
        settings, CHAT_MODEL, {"9.0.0": 5}, size="small", progress=progress, kv_cache=True
    )
    files = registered_variants(settings, CHAT_MODEL, "9.0.0")
    variants = {name: str(path) for name, path in files.items() if name in LADDER}
    lengths = _output_lengths(gen.new_tokens)
    progress(f"measuring each rung's engine at {gen.max_sequences} decode rows")
    capacities, prefill, step = _engine_generations(files, gen, lengths)
    progress(
        "engine capacity of one worker: "
        + ", ".join(f"{v} {rps:.1f} generations/s" for v, rps in capacities.items())
        + f"; fp32 prefill {prefill:.1f} ms, decode step at {gen.max_sequences} rows "
        f"{step:.1f} ms"
    )
    load = GenerationLoad(new_tokens=lengths)
    path, busy_tpot = asyncio.run(
        measure_generative_path(settings, variants, gen, load, offered=capacities[LADDER[0]] * 1.3)
    )
    base_rate = cfg.base_fraction * min(path, capacities[LADDER[0]])
    ttft_slo = max(gen.ttft_factor * (prefill + step), gen.min_ttft_ms)
    tpot_slo = gen.tpot_factor * (busy_tpot or step)
    progress(
        f"path capacity (one fp32 worker in the running stack) {path:.1f} generations/s, "
        f"TPOT p99 {busy_tpot:.1f} ms with every row busy; steady load {base_rate:.1f}/s, "
        f"spike {base_rate * cfg.spike_factor:.1f}/s; SLO TTFT p99 {ttft_slo:.0f} ms, "
        f"TPOT p99 {tpot_slo:.1f} ms"
    )
    workload = Workload(
        model=CHAT_MODEL,
        policy=generative_qos_policy(ttft_slo, tpot_slo, capacities),
        slo_ms=0.0,
        worker_args=_decode_args(gen),
        generation=load,
        generation_slo=GenerationSlo(ttft_ms=ttft_slo, tpot_ms=tpot_slo),
        ttft_deadline_ms=round(ttft_slo),
    )
    gen_cfg = replace(cfg, prompt_len=gen.prompt_len)
    scale_out = scale_out or local_supervisor()
    runs = [
        RunSpec("fp32_only", qos=False, admission=False),
        RunSpec("qos", qos=True, admission=False),
        RunSpec("qos_admission", qos=True, admission=True),
        RunSpec("qos_admission_scale", qos=True, admission=True, scale_out=scale_out),
    ]
    chosen = gen.runs or ("fp32_only", "qos_admission", "qos_admission_scale")
    results: dict[str, dict[str, object]] = {}
    finished: list[QosRunResult] = []
    for i, run in enumerate([r for r in runs if r.name in chosen], 1):
        progress(f"run {i}: generative {run.name}")
        result = asyncio.run(
            run_once(
                settings,
                variants,
                gen_cfg,
                base_rate=base_rate,
                workload=workload,
                run=run,
                progress=progress,
            )
        )
        results[run.name] = result.to_json()
        finished.append(result)
        for line in result.table((cfg.steady_s, cfg.steady_s + cfg.spike_s)):
            progress(line)
        progress(f"    {json.dumps(results[run.name])}")
    print(_generative_table(finished), flush=True)
    summary: dict[str, object] = {
        "generative": True,
        "model": CHAT_MODEL,
        "slo_ttft_p99_ms": round(ttft_slo, 1),
        "slo_tpot_p99_ms": round(tpot_slo, 2),
        "capacity_generations_per_s_by_variant": {v: round(r, 1) for v, r in capacities.items()},
        "prefill_ms": round(prefill, 1),
        "decode_step_ms": round(step, 1),
        "path_capacity_generations_per_s": round(path, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "base_rate_per_s": round(base_rate, 1),
        "spike_factor": cfg.spike_factor,
        "config": {**asdict(gen_cfg), "generative": asdict(gen)},
        "runs": results,
    }
    print(json.dumps(summary))
    return 0


def _generative_table(results: list[QosRunResult]) -> str:
    head = (
        f"{'run':<22} {'goodput':>8} {'spike':>8} {'TTFT p99':>10} {'TPOT p99':>10} "
        f"{'shed':>5} {'err':>4} {'workers':>7}  variants"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        s, spike = r.score, r.spike
        rows.append(
            f"{r.name:<22} {s.goodput:>8.3f} "
            + (f"{spike.goodput:>8.3f}" if spike is not None else f"{'-':>8}")
            + f" {s.ttft_p99_ms:>8.1f}ms {s.tpot_p99_ms:>8.2f}ms {s.shed:>5} "
            f"{s.errors + s.unanswered:>4} {r.max_workers:>7}  {','.join(r.variants)}"
        )
    return "\n".join(rows)


def _answered(stack: BenchStack, start: float, end: float) -> bool:
    return all(rid in stack.answers for rid, at in stack.sent_at.items() if start <= at < end)


def main(cfg: QosConfig, scale_out: ScaleOut | None = None) -> int:
    """``scale_out``: the supervisor of run 4 (default: :func:`local_supervisor`)."""
    from graylane.app.cli.capacity import ensure_calibrated, registered_variants
    from graylane.app.demo.build_versions import build_versions
    from graylane.capacity import rung_capacities
    from graylane.deploy.kafka import broker as kafka_broker

    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    progress("starting the broker")
    kafka_broker.start()
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
    workload = Workload(
        model=MODEL,
        policy=qos_policy(slo, capacities),
        slo_ms=slo,
        admission_args=("--default-deadline-ms", f"{slo:.0f}"),
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
                workload=workload,
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
