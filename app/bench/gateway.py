"""``graylane bench gateway``: what the gateway's HTTP hop costs against producing to Kafka
directly, on the same cores, in one run.

A router, a worker (the tiny demo GPT with a KV cache) and a gateway run as processes on
the local broker; this process drives both paths with the same call (a completion of
``max_tokens`` tokens, greedy, the same prompt):

- **direct**: a :class:`~graylane.client.GraylaneClient` here produces the request and
  reads its reply topic;
- **gateway**: ``POST /v1/completions`` to the gateway over keep-alive HTTP/1.1
  (:mod:`graylane.app.demo.gateway_calls`: raw sockets, so the figures are the
  gateway's, not an HTTP library's).

Capacity: ``concurrency`` closed-loop callers per path for ``probe_s`` seconds, the
completions/s of the second half, the paths alternating over ``rounds`` (medians).
Latency: a paced load at ``load_fraction`` of the direct path's capacity for
``latency_s`` per round, the two paths taking turns call by call (each gets half of it,
under the same load and the same neighbours on a shared host); medians over rounds. The
added latency is gateway minus direct at p50 and p99.

The last line is JSON: ``gateway_rps``, ``direct_rps``, ``gateway_over_direct``,
``added_p50_ms``, ``added_p99_ms`` and the figures behind them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
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
from graylane.app.cli.demo import Service, free_port, start_service, stop_services
from graylane.app.demo.gateway_calls import GatewayConnection, GatewayPool
from graylane.client import GraylaneClient, Task
from graylane.settings import REPO_ROOT, Settings

__all__ = ["GatewayBenchConfig", "PathFigures", "main", "run"]

MODEL = "gateway-bench"
_TAG = "bench-gateway"
_KEY = f"bench-{uuid.uuid4().hex}"


@dataclass(frozen=True, kw_only=True)
class GatewayBenchConfig:
    concurrency: int = 16
    """Closed-loop callers per path in the capacity probes."""
    probe_s: float = 8.0
    latency_s: float = 12.0
    """Paced load per round (both paths, interleaved)."""
    rounds: int = 3
    load_fraction: float = 0.5
    max_tokens: int = 1
    prompt: str = "Hello, gateway"


@dataclass(frozen=True)
class PathFigures:
    path: str
    capacity_rps: float
    p50_ms: float
    p99_ms: float
    errors: int


@dataclass
class _Samples:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0


Call = Callable[[], Awaitable[bool]]


def _direct_call(client: GraylaneClient, cfg: GatewayBenchConfig) -> Call:
    async def call() -> bool:
        try:
            await client.infer(
                MODEL,
                prompt=cfg.prompt,
                task=Task.GENERATE,
                max_new_tokens=cfg.max_tokens,
                temperature=0.0,
                timeout=30,
            )
        except Exception:
            return False
        return True

    return call


def _gateway_call(pool: GatewayPool, cfg: GatewayBenchConfig) -> Call:
    body = json.dumps(
        {"model": MODEL, "prompt": cfg.prompt, "max_tokens": cfg.max_tokens, "temperature": 0}
    ).encode()

    async def call() -> bool:
        return (await pool.request("POST", "/v1/completions", body)).status == 200

    return call


async def _capacity(call: Call, concurrency: int, probe_s: float) -> float:
    """Completions/s of ``concurrency`` closed-loop callers, over the probe's second half."""
    done: list[float] = []
    started = time.monotonic()
    end = started + probe_s

    async def caller() -> None:
        while time.monotonic() < end:
            if await call():
                done.append(time.monotonic())

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    half = started + probe_s / 2
    counted = sum(1 for t in done if half <= t <= end)
    return counted / (end - half)


async def _paced(calls: dict[str, Call], rate: float, seconds: float) -> dict[str, _Samples]:
    """Latencies of calls started ``rate`` times a second for ``seconds`` (open loop), the
    paths taking turns call by call: both see the same load and the same neighbours."""
    samples = {name: _Samples() for name in calls}
    order = list(calls.items())
    tasks: list[asyncio.Task[None]] = []

    async def one(name: str, call: Call) -> None:
        sent = time.perf_counter()
        ok = await call()
        if ok:
            samples[name].latencies_ms.append((time.perf_counter() - sent) * 1000.0)
        else:
            samples[name].errors += 1

    started = time.monotonic()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
        name, call = order[i % len(order)]
        tasks.append(asyncio.create_task(one(name, call)))
    await asyncio.gather(*tasks)
    return samples


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


async def _wait_ready(client: GraylaneClient, port: int, cfg: GatewayBenchConfig) -> None:
    deadline = time.monotonic() + 180
    conn = GatewayConnection(port)
    try:
        while True:
            try:
                status = (await conn.request("GET", "/readyz")).status
            except OSError:
                status = 0
                conn.close()
            if status == 200:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the gateway did not become ready")
            await asyncio.sleep(0.3)
    finally:
        conn.close()
    probe = functools.partial(
        client.infer, MODEL, prompt=cfg.prompt, task=Task.GENERATE, max_new_tokens=1, timeout=5
    )
    await wait_answered(probe, within_s=max(1.0, deadline - time.monotonic()))


def _services(model: Path, env: dict[str, str], port: int) -> list[Service]:
    worker = WorkerSpec("v1", {"fp32": str(model)})
    return [
        start_router(MODEL, "v1", env, _TAG),
        start_worker(worker, MODEL, env, _TAG),
        start_service(
            _TAG,
            [
                "gateway",
                "--port",
                str(port),
                "--replica",
                "bench",
                "--rate",
                "1000000",
                "--burst",
                "1000000",
                "--max-in-flight",
                "4096",
            ],
            REPO_ROOT / ".local" / "logs",
            {**env, "GRAYLANE_GATEWAY_KEYS": f"{_KEY}:infer:bench"},
        ),
    ]


async def _measure(
    settings: Settings, model: Path, cfg: GatewayBenchConfig, progress: Callable[[str], None]
) -> dict[str, object]:
    settings, factory = await fresh_topics(settings, "bgw", MODEL, ["v1"])
    port = free_port()
    services = _services(model, stack_env(settings), port)
    pool = GatewayPool(port, key=_KEY)
    try:
        async with GraylaneClient(factory, client_id="bench-direct") as client:
            progress("waiting for the router, the worker and the gateway")
            await _wait_ready(client, port, cfg)
            direct, gateway = _direct_call(client, cfg), _gateway_call(pool, cfg)
            await _capacity(direct, 4, 2.0)  # warm-up of both paths
            await _capacity(gateway, 4, 2.0)
            paths = {"direct": direct, "gateway": gateway}
            capacities: dict[str, list[float]] = {"direct": [], "gateway": []}
            for r in range(cfg.rounds):  # alternating, so drift on a shared host evens out
                for name in ("direct", "gateway") if r % 2 == 0 else ("gateway", "direct"):
                    capacities[name].append(
                        await _capacity(paths[name], cfg.concurrency, cfg.probe_s)
                    )
                    progress(f"round {r + 1}, {name} capacity: {capacities[name][-1]:.0f} req/s")
            direct_rps = statistics.median(capacities["direct"])
            gateway_rps = statistics.median(capacities["gateway"])
            rate = max(1.0, cfg.load_fraction * direct_rps)
            rounds: dict[str, list[_Samples]] = {"direct": [], "gateway": []}
            for r in range(cfg.rounds):
                got = await _paced(paths, rate, cfg.latency_s)
                for name, samples in got.items():
                    rounds[name].append(samples)
                    progress(
                        f"round {r + 1}, {name} (half of {rate:.0f} req/s, interleaved): p50 "
                        f"{_pct(samples.latencies_ms, 50):.2f} ms, p99 "
                        f"{_pct(samples.latencies_ms, 99):.2f} ms, {samples.errors} errors"
                    )
    finally:
        pool.close()
        stop_services(services)
    figures = {
        name: PathFigures(
            path=name,
            capacity_rps=round(direct_rps if name == "direct" else gateway_rps, 1),
            p50_ms=round(statistics.median(_pct(s.latencies_ms, 50) for s in runs), 2),
            p99_ms=round(statistics.median(_pct(s.latencies_ms, 99) for s in runs), 2),
            errors=sum(s.errors for s in runs),
        )
        for name, runs in rounds.items()
    }
    d, g = figures["direct"], figures["gateway"]
    print(f"{'path':>8} {'req/s':>8} {'p50':>9} {'p99':>9} {'errors':>7}", flush=True)
    for f in (d, g):
        print(
            f"{f.path:>8} {f.capacity_rps:>8.0f} {f.p50_ms:>7.2f}ms {f.p99_ms:>7.2f}ms "
            f"{f.errors:>7}",
            flush=True,
        )
    added_p50 = round(g.p50_ms - d.p50_ms, 2)
    ratio = round(gateway_rps / direct_rps, 3) if direct_rps else 0.0
    return {
        "model": "demo-gpt-tiny",
        "max_tokens": cfg.max_tokens,
        "concurrency": cfg.concurrency,
        "load_rps": round(rate, 1),
        "rounds": cfg.rounds,
        "gateway_rps": g.capacity_rps,
        "direct_rps": d.capacity_rps,
        "gateway_over_direct": ratio,
        "added_p50_ms": added_p50,
        "added_p99_ms": round(g.p99_ms - d.p99_ms, 2),
        "direct_p50_ms": d.p50_ms,
        "direct_p99_ms": d.p99_ms,
        "gateway_p50_ms": g.p50_ms,
        "gateway_p99_ms": g.p99_ms,
        "errors": d.errors + g.errors,
        "added_p50_within_3ms": added_p50 <= 3.0,
        "rate_within_0_8": ratio >= 0.8,
    }


def run(cfg: GatewayBenchConfig, progress: Callable[[str], None]) -> dict[str, object]:
    from graylane.deploy.kafka import broker as kafka_broker

    progress("starting the broker")
    kafka_broker.start()
    model = demo_model("tiny", kv_cache=True, progress=progress)
    return asyncio.run(_measure(Settings.from_env(), model, cfg, progress))


def main(cfg: GatewayBenchConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    print(json.dumps(run(cfg, progress)), flush=True)
    return 0
