"""``graylane bench spine``: engine vs end-to-end vs unbatched throughput, one run.

(a) raw: the engine called in-process with the worker's batching policy;
(b) e2e: producer -> router -> worker -> results through the real broker, at
    saturation, then latency percentiles at about half that load;
(c) unbatched: the same path with a worker that runs one request per call.
The router and the worker run as separate processes, as in production.

Built for a shared, noisy machine: both stacks start first and are warmed up
(the batch learner converges; none of it is measured), then ``rounds`` rounds
each run a raw trial, the engine's batch-1 and max-batch timings, a batched
and an unbatched trial back to back (the order alternates between rounds).
Every ratio is the median of the per-round ratios, so a load that comes and
goes slows both sides of a ratio alike.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graylane.app.bench.harness import (
    WorkerSpec,
    demo_model,
    fresh_topics,
    stack_env,
    start_router,
    start_worker,
    wait_answered,
)
from graylane.app.cli.demo import Service, stop_services
from graylane.capacity import (
    BatchPoint,
    VariantCapacity,
    measure_variant,
    measured_capacity,
    profile_of,
    save_profile,
)
from graylane.client import GraylaneClient
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.compute import run_batch
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.requests import TaskKind, WorkItem
from graylane.serde import PostProcess
from graylane.serde import PostProcess as EnginePost
from graylane.settings import Settings

__all__ = [
    "MODEL",
    "PROMPT_LEN",
    "SpineConfig",
    "engine_trial",
    "main",
    "prompt_tokens",
    "raw_trial",
    "run_spine",
]

MODEL = "bench-gpt"
PROMPT_LEN = 48


@dataclass(frozen=True)
class SpineConfig:
    size: str = "small"
    max_batch: int = 8
    max_wait_ms: int = 5
    requests: int = 300
    """Requests per saturation trial (one batched and one unbatched per round)."""
    rounds: int = 5
    warm_requests: int = 600
    """To the batched stack before the rounds (not measured): the batch learner converges."""
    raw_seconds: float = 3.0
    engine_seconds: float = 1.5
    """Per batch size and round, for engine_rps_b1 / engine_rps_bmax."""
    half_load_s: float = 12.0


def prompt_tokens(i: int) -> list[int]:
    rng = np.random.default_rng(i)
    return [int(t) for t in rng.integers(32, 127, PROMPT_LEN)]


def _raw_items(cfg: SpineConfig) -> list[WorkItem]:
    ids = [np.asarray([prompt_tokens(i)], np.int64) for i in range(cfg.max_batch)]
    return [
        WorkItem(
            index=i,
            task=TaskKind.FORWARD,
            seq_len=PROMPT_LEN,
            feeds={"input_ids": x, "attention_mask": np.ones_like(x)},
            post=EnginePost.ARGMAX_LAST,
        )
        for i, x in enumerate(ids)
    ]


def raw_trial(engine: OnnxRuntimeEngine, cfg: SpineConfig, seconds: float) -> tuple[float, float]:
    """Requests per second and p50 ms per batch, engine called in-process with the
    worker's batching policy (full batches of max_batch)."""
    policy = BucketPolicy.powers_of_two(512, cfg.max_batch)
    items = _raw_items(cfg)
    run_batch(engine, items, policy, 512)  # warm
    times: list[float] = []
    served = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        run_batch(engine, items, policy, 512)
        times.append((time.perf_counter() - t0) * 1000)
        served += len(items)
    elapsed = time.perf_counter() - start
    return served / elapsed, float(np.percentile(times, 50))


def engine_trial(engine: OnnxRuntimeEngine, cfg: SpineConfig) -> tuple[float, float]:
    """The engine's own median ms per batch at batch 1 and at max batch (one round)."""
    seq = BucketPolicy.powers_of_two(512, 1).bucket_for(PROMPT_LEN)
    cap = measure_variant(
        engine,
        "fp32",
        seq_len=seq,
        batches=(1, cfg.max_batch),
        seconds_per_point=cfg.engine_seconds,
    )
    return cap.points[0].service_ms, cap.points[1].service_ms


async def _saturate(client: GraylaneClient, n: int) -> float:
    """Submit n requests at once; throughput from first submit to last result."""
    start = time.perf_counter()
    for i in range(n):
        await client.submit(
            MODEL,
            token_ids=prompt_tokens(i),
            routing_key=f"u{i}",
            post_process=PostProcess.ARGMAX_LAST,
        )
    got = 0
    async for r in client.results():
        if not r.ok:
            raise RuntimeError(f"request failed during the benchmark: {r.error_message}")
        got += 1
        if got == n:
            break
    return n / (time.perf_counter() - start)


async def _paced(client: GraylaneClient, rate: float, seconds: float) -> list[float]:
    """Send at ``rate`` req/s for ``seconds``; client-side latencies in ms."""
    n = max(1, int(rate * seconds))
    interval = 1.0 / rate
    latencies: list[float] = []
    start = time.perf_counter()

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        await client.infer(
            MODEL,
            token_ids=prompt_tokens(i),
            routing_key=f"p{i}",
            post_process=PostProcess.ARGMAX_LAST,
            timeout=60,
        )
        latencies.append((time.perf_counter() - t0) * 1000)

    tasks = []
    for i in range(n):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return latencies


def _stack(
    model: Path, max_batch: int, cfg: SpineConfig, tag: str, env: dict[str, str]
) -> list[Service]:
    worker = WorkerSpec(
        "v1",
        {"fp32": str(model)},
        extra_args=("--max-batch", str(max_batch), "--max-wait-ms", str(cfg.max_wait_ms)),
        threads=0,
    )
    return [
        start_router(MODEL, "v1", env, f"bench-{tag}"),
        start_worker(worker, MODEL, env, f"bench-{tag}"),
    ]


@dataclass
class _Stack:
    """One router + worker pair on its own topic prefix, and a client of it."""

    tag: str
    settings: Settings
    services: list[Service]
    client: GraylaneClient


async def _start_stack(
    settings: Settings, model: Path, max_batch: int, cfg: SpineConfig, tag: str
) -> _Stack:
    settings, factory = await fresh_topics(settings, "bench", MODEL, ["v1"])
    services = _stack(model, max_batch, cfg, tag, stack_env(settings))
    client = GraylaneClient(factory)
    try:
        await client.start()
    except BaseException:
        stop_services(services)
        raise
    return _Stack(tag, settings, services, client)


async def _stop_stack(stack: _Stack) -> None:
    try:
        await stack.client.close()
    finally:
        stop_services(stack.services)


@dataclass
class _Trials:
    raw: list[float]
    batched: list[float]
    unbatched: list[float]
    engine_b1_ms: list[float]
    engine_bmax_ms: list[float]
    raw_p50_ms: list[float]


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else 0.0


def _paired(num: list[float], den: list[float]) -> float:
    """Median of the per-round ratios."""
    return _median([a / b for a, b in zip(num, den, strict=True) if b > 0])


async def _rounds(
    engine: OnnxRuntimeEngine,
    batched: _Stack,
    unbatched: _Stack,
    cfg: SpineConfig,
    progress: Callable[[str], None],
) -> _Trials:
    trials = _Trials([], [], [], [], [], [])

    async def raw() -> None:
        rps, p50 = await asyncio.to_thread(raw_trial, engine, cfg, cfg.raw_seconds)
        b1_ms, bmax_ms = await asyncio.to_thread(engine_trial, engine, cfg)
        trials.raw.append(rps)
        trials.raw_p50_ms.append(p50)
        trials.engine_b1_ms.append(b1_ms)
        trials.engine_bmax_ms.append(bmax_ms)

    async def e2e(stack: _Stack, into: list[float]) -> None:
        into.append(await _saturate(stack.client, cfg.requests))

    for r in range(cfg.rounds):
        steps = [raw(), e2e(batched, trials.batched), e2e(unbatched, trials.unbatched)]
        if r % 2:
            steps.reverse()  # batched stays next to both of the figures it is divided by
        for step in steps:
            await step
        progress(
            f"round {r + 1}/{cfg.rounds}: raw {trials.raw[-1]:.1f}, batched "
            f"{trials.batched[-1]:.1f}, unbatched {trials.unbatched[-1]:.1f} req/s; engine "
            f"b1 {trials.engine_b1_ms[-1]:.1f} ms, b{cfg.max_batch} "
            f"{trials.engine_bmax_ms[-1]:.1f} ms"
        )
    return trials


async def _measure(
    settings: Settings, model: Path, cfg: SpineConfig, progress: Callable[[str], None]
) -> tuple[_Trials, list[float]]:
    engine = OnnxRuntimeEngine.load(model, "fp32")
    stacks: list[_Stack] = []
    try:
        for tag, max_batch in (("batched", cfg.max_batch), ("unbatched", 1)):
            stacks.append(await _start_stack(settings, model, max_batch, cfg, tag))
        batched, unbatched = stacks
        progress("waiting for both routers and workers")
        for stack in stacks:
            await wait_answered(
                functools.partial(stack.client.infer, MODEL, token_ids=[1, 2, 3], timeout=5)
            )
        progress(f"warm-up: {cfg.warm_requests} requests batched, 100 unbatched (not measured)")
        await _saturate(batched.client, cfg.warm_requests)
        await _saturate(unbatched.client, 100)  # nothing to learn: batch 1
        await asyncio.to_thread(raw_trial, engine, cfg, 1.0)
        progress(
            f"{cfg.rounds} rounds: raw {cfg.raw_seconds:.0f} s, engine b1/b{cfg.max_batch}, "
            f"batched and unbatched {cfg.requests} requests each"
        )
        trials = await _rounds(engine, batched, unbatched, cfg, progress)
        rate = _median(trials.batched) / 2
        progress(f"latency at half load ({rate:.0f} req/s for {cfg.half_load_s:.0f} s)")
        latencies = await _paced(batched.client, rate, cfg.half_load_s)
        return trials, latencies
    finally:
        engine.close()
        for stack in stacks:
            await _stop_stack(stack)


def run_spine(cfg: SpineConfig, progress: Callable[[str], None]) -> dict[str, object]:
    from graylane.deploy.kafka import broker as kafka_broker

    progress("starting the broker")
    kafka_broker.start()
    model = demo_model(cfg.size, progress=progress)
    settings = Settings.from_env()
    trials, lat = asyncio.run(_measure(settings, model, cfg, progress))
    b1_ms, bmax_ms = _median(trials.engine_b1_ms), _median(trials.engine_bmax_ms)
    seq = BucketPolicy.powers_of_two(512, 1).bucket_for(PROMPT_LEN)
    profile = profile_of(
        MODEL,
        "v1",
        [VariantCapacity("fp32", seq, (BatchPoint(1, b1_ms), BatchPoint(cfg.max_batch, bmax_ms)))],
    )
    save_profile(settings.artifact_dir, profile)  # the engine's own scaling, measured here
    b1_rps = measured_capacity(settings.artifact_dir, MODEL, "v1", batch=1) or 0.0
    bmax_rps = measured_capacity(settings.artifact_dir, MODEL, "v1", batch=cfg.max_batch) or 0.0
    scaling = _paired(
        [cfg.max_batch / ms for ms in trials.engine_bmax_ms],
        [1 / ms for ms in trials.engine_b1_ms],
    )
    e2e_rps = _median(trials.batched)
    return {
        "model": f"demo-gpt-{cfg.size}",
        "prompt_tokens": PROMPT_LEN,
        "max_batch": cfg.max_batch,
        "rounds": cfg.rounds,
        "requests_per_trial": cfg.requests,
        "raw_rps": round(_median(trials.raw), 1),
        "e2e_rps": round(e2e_rps, 1),
        "e2e_over_raw": round(_paired(trials.batched, trials.raw), 3),
        "unbatched_rps": round(_median(trials.unbatched), 1),
        "batched_over_unbatched": round(_paired(trials.batched, trials.unbatched), 3),
        "e2e_p50_ms": round(float(np.percentile(lat, 50)), 1),
        "e2e_p99_ms": round(float(np.percentile(lat, 99)), 1),
        "engine_p50_ms": round(_median(trials.raw_p50_ms), 2),
        "engine_rps_b1": round(b1_rps, 1),
        "engine_rps_bmax": round(bmax_rps, 1),
        "engine_scaling": round(scaling, 3),
        "capacity_host": profile.host,
        "trials": {
            "raw": [round(x, 1) for x in trials.raw],
            "batched": [round(x, 1) for x in trials.batched],
            "unbatched": [round(x, 1) for x in trials.unbatched],
        },
    }


def main(cfg: SpineConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    result = run_spine(cfg, progress)
    print(json.dumps(result))
    return 0
