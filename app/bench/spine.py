"""``graylane bench spine``: engine vs end-to-end vs unbatched throughput, one run.

(a) raw: the engine called in-process with the worker's batching policy;
(b) e2e: producer -> router -> worker -> results through the real broker, at
    saturation, then latency percentiles at about half that load;
(c) unbatched: the same path with a worker that runs one request per call.
The router and the worker run as separate processes, as in production.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graylane.app.cli.calibrate import calibrate_files
from graylane.app.cli.demo import Service, start_service, stop_services
from graylane.capacity import measured_capacity, save_profile
from graylane.client import GraylaneClient, InferenceTimeout, PostProcess
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.batching import BucketPolicy
from graylane.engine_worker.compute import run_batch
from graylane.engine_worker.postprocess import PostProcess as EnginePost
from graylane.engine_worker.requests import TaskKind, WorkItem
from graylane.kafka.admin import ensure_topics
from graylane.kafka.factory import KafkaFactory
from graylane.settings import REPO_ROOT, Settings

MODEL = "bench-gpt"
PROMPT_LEN = 48


@dataclass(frozen=True)
class SpineConfig:
    size: str = "small"
    max_batch: int = 8
    max_wait_ms: int = 5
    requests: int = 600
    half_load_s: float = 12.0


def prompt_tokens(i: int) -> list[int]:
    rng = np.random.default_rng(i)
    return [int(t) for t in rng.integers(32, 127, PROMPT_LEN)]


def raw_engine(model: Path, cfg: SpineConfig, seconds: float = 8.0) -> tuple[float, float]:
    """Requests per second and p50 ms per batch, engine called in-process."""
    engine = OnnxRuntimeEngine.load(model, "fp32")
    policy = BucketPolicy.powers_of_two(512, cfg.max_batch)
    ids = [np.asarray([prompt_tokens(i)], np.int64) for i in range(cfg.max_batch)]
    items = [
        WorkItem(
            index=i,
            task=TaskKind.FORWARD,
            seq_len=PROMPT_LEN,
            feeds={"input_ids": x, "attention_mask": np.ones_like(x)},
            post=EnginePost.ARGMAX_LAST,
        )
        for i, x in enumerate(ids)
    ]
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
    engine.close()
    return served / elapsed, float(np.percentile(times, 50))


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


async def _wait_ready(client: GraylaneClient) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            await client.infer(MODEL, token_ids=[1, 2, 3], timeout=5)
            return
        except InferenceTimeout:
            if time.monotonic() > deadline:
                raise


def _stack(
    model: Path, max_batch: int, cfg: SpineConfig, tag: str, log_dir: Path, env: dict[str, str]
) -> list[Service]:
    return [
        start_service(f"bench-router-{tag}", ["router", "--model", f"{MODEL}=v1"], log_dir, env),
        start_service(
            f"bench-worker-{tag}",
            [
                "worker",
                "--model",
                MODEL,
                "--version",
                "v1",
                "--variant",
                f"fp32={model}",
                "--max-batch",
                str(max_batch),
                "--max-wait-ms",
                str(cfg.max_wait_ms),
            ],
            log_dir,
            env,
        ),
    ]


async def _e2e(
    settings: Settings,
    model: Path,
    max_batch: int,
    cfg: SpineConfig,
    tag: str,
    progress: Callable[[str], None],
    half_load: bool,
) -> tuple[float, list[float]]:
    # A fresh prefix per phase: no backlog or consumer group carries over.
    settings = settings.with_overrides(topic_prefix=f"bench{uuid.uuid4().hex[:6]}")
    factory = KafkaFactory(settings)
    await ensure_topics(
        factory, factory.layout.shared_specs() + factory.layout.model_specs(MODEL, ["v1"])
    )
    services = _stack(
        model,
        max_batch,
        cfg,
        tag,
        REPO_ROOT / ".local" / "logs",
        {"GRAYLANE_TOPIC_PREFIX": settings.topic_prefix},
    )
    try:
        async with GraylaneClient(factory) as client:
            progress(f"{tag}: waiting for router and worker")
            await _wait_ready(client)
            await _saturate(client, 50)  # warm the path
            progress(f"{tag}: {cfg.requests} requests at saturation")
            rps = await _saturate(client, cfg.requests)
            latencies: list[float] = []
            if half_load:
                progress(
                    f"{tag}: latency at half load ({rps / 2:.0f} req/s for {cfg.half_load_s:.0f} s)"
                )
                latencies = await _paced(client, rps / 2, cfg.half_load_s)
            return rps, latencies
    finally:
        stop_services(services)


def run_spine(cfg: SpineConfig, progress: Callable[[str], None]) -> dict[str, object]:
    from graylane.deploy.kafka import kafka
    from graylane.models.demo_gpt import write_demo_gpt

    progress("starting the broker")
    kafka.start()
    models = REPO_ROOT / ".local" / "models"
    models.mkdir(parents=True, exist_ok=True)
    model = models / f"bench-gpt-{cfg.size}.onnx"
    if not model.exists():
        progress(f"writing the demo GPT ({cfg.size})")
        write_demo_gpt(model, cfg.size, seed=7)
    settings = Settings.from_env()
    progress("(a) raw engine throughput, in-process")
    raw_rps, engine_p50 = raw_engine(model, cfg)
    progress(
        f"    raw {raw_rps:.1f} req/s, engine p50 {engine_p50:.1f} ms per batch of {cfg.max_batch}"
    )
    progress("    calibrating the engine's own scaling (batch 1 vs max batch)")
    profile = calibrate_files(
        MODEL,
        "v1",
        {"fp32": model},
        seq_len=BucketPolicy.powers_of_two(512, 1).bucket_for(PROMPT_LEN),
        batches=(1, cfg.max_batch),
        threads=0,
        progress=progress,
    )
    save_profile(settings.artifact_dir, profile)
    b1_rps = measured_capacity(settings.artifact_dir, MODEL, "v1", batch=1) or 0.0
    bmax_rps = measured_capacity(settings.artifact_dir, MODEL, "v1", batch=cfg.max_batch) or 0.0
    progress("(b) end to end through the broker, router and worker")
    e2e_rps, lat = asyncio.run(_e2e(settings, model, cfg.max_batch, cfg, "batched", progress, True))
    progress(f"    e2e {e2e_rps:.1f} req/s")
    progress("(c) unbatched baseline: one request per engine call")
    unbatched_rps, _ = asyncio.run(_e2e(settings, model, 1, cfg, "unbatched", progress, False))
    progress(f"    unbatched {unbatched_rps:.1f} req/s")
    return {
        "model": f"demo-gpt-{cfg.size}",
        "prompt_tokens": PROMPT_LEN,
        "max_batch": cfg.max_batch,
        "raw_rps": round(raw_rps, 1),
        "e2e_rps": round(e2e_rps, 1),
        "e2e_over_raw": round(e2e_rps / raw_rps, 3),
        "unbatched_rps": round(unbatched_rps, 1),
        "batched_over_unbatched": round(e2e_rps / unbatched_rps, 3),
        "e2e_p50_ms": round(float(np.percentile(lat, 50)), 1),
        "e2e_p99_ms": round(float(np.percentile(lat, 99)), 1),
        "engine_p50_ms": round(engine_p50, 2),
        "engine_rps_b1": round(b1_rps, 1),
        "engine_rps_bmax": round(bmax_rps, 1),
        "engine_scaling": round(bmax_rps / b1_rps, 3) if b1_rps else None,
        "capacity_host": profile.host,
    }


def main(cfg: SpineConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    result = run_spine(cfg, progress)
    print(json.dumps(result))
    return 0
