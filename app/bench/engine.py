"""``graylane bench engine``: what Graylane's path costs an engine server, side by side.

One ``llama-server`` (SmolLM2-135M-Instruct, the shipped Q4_1 GGUF) is driven the same way
twice in one run, with the same calls: streamed chat completions (greedy, the same
questions) from an OpenAI-style client here,

- **engine**: straight to the engine's ``/v1/chat/completions``;
- **graylane**: to the gateway's, so each call goes gateway -> Kafka -> router -> worker
  -> engine, and its stream comes back worker -> Kafka -> gateway (the worker relays every
  token: ``--stream-every-tokens 1``).

At each concurrency (1, the engine's slot count, twice that) ``requests`` calls per
client run on each path, in ``rounds`` rounds whose order of the paths alternates.
Output tokens/s (the engine's own token counts over the wall time of the batches of
calls), time to first token (p50/p99, from the call's start to its first text) and the
gaps between tokens (ITL p50/p99) are printed in a table. The engine gets the same
threads in both runs, and its own core where there are two or more: the engine is
pinned to core 0, this process (and so the broker, router, worker and gateway it
starts) to the others, so the ratio measures the path, not two runs sharing cores.

The last line is JSON, at the engine's slot count: ``tokens_per_s``,
``engine_tokens_per_s``, ``ttft_ms_p50``, ``engine_ttft_ms_p50``, ``ttft_added_ms_p50``,
``ttft_added_ms_p99``, ``itl_ms_p50``, ``engine_itl_ms_p50``, ``concurrency``, and every
concurrency's figures under ``by_concurrency``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

from graylane.app.bench.harness import fresh_topics, stack_env, start_router
from graylane.app.cli.demo import Service, free_port, start_service, stop_services
from graylane.settings import REPO_ROOT, Settings

__all__ = ["EngineBenchConfig", "EngineBenchRun", "main", "run"]

MODEL = "engine-bench"
VERSION = "1.0.0"
_TAG = "bench-engine"
_KEY = f"bench-{uuid.uuid4().hex}"
QUESTIONS = (
    "Write a short paragraph about the ocean.",
    "Explain how a bicycle works.",
    "Describe a walk in a forest in autumn.",
    "What makes a good breakfast? Answer in a few sentences.",
    "Tell me about the planets of the solar system.",
    "How do bees make honey?",
    "Describe the city of Paris for a visitor.",
    "Why is the sky blue? Explain simply.",
)


@dataclass(frozen=True, kw_only=True)
class EngineBenchConfig:
    threads: int = 1
    """The engine's threads (the same in both runs)."""
    slots: int = 4
    """The engine's parallel sequences (``-np``)."""
    max_tokens: int = 64
    requests: int = 3
    """Calls per client at each concurrency, path and round."""
    rounds: int = 3
    """Rounds per concurrency, the paths' order alternating."""
    concurrencies: tuple[int, ...] = ()
    """Default: 1, the slot count, twice the slot count."""


@dataclass
class _Call:
    ttft_ms: float = 0.0
    gaps_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    ok: bool = False


@dataclass(frozen=True)
class EngineBenchRun:
    """One path at one concurrency."""

    path: str
    concurrency: int
    tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_p50: float
    itl_ms_p99: float
    calls: int
    errors: int


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 2) if values else 0.0


async def _stream(http: httpx.AsyncClient, url: str, body: dict[str, object]) -> _Call:
    """One streamed chat completion: when its text came, and how many tokens."""
    call = _Call()
    started = time.perf_counter()
    last = 0.0
    try:
        async with http.stream("POST", url, json=body) as answer:
            if answer.status_code != 200:
                await answer.aread()
                return call
            async for line in answer.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    call.ok = True
                    break
                event = json.loads(data)
                usage = event.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens"):
                    call.tokens = int(usage["completion_tokens"])
                choices = event.get("choices") or []
                text = choices[0].get("delta", {}).get("content") if choices else None
                if not text:
                    continue
                now = time.perf_counter()
                if not call.ttft_ms:
                    call.ttft_ms = (now - started) * 1000.0
                else:
                    call.gaps_ms.append((now - last) * 1000.0)
                last = now
    except httpx.HTTPError:
        call.ok = False
    return call


async def _batch(
    http: httpx.AsyncClient, url: str, model: str, cfg: EngineBenchConfig, concurrency: int
) -> tuple[list[_Call], float]:
    """``concurrency`` closed-loop clients, ``cfg.requests`` calls each; the wall time."""
    calls: list[_Call] = []

    async def client(k: int) -> None:
        for i in range(cfg.requests):
            question = QUESTIONS[(k * cfg.requests + i) % len(QUESTIONS)]
            body = {
                "model": model,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": cfg.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            calls.append(await _stream(http, url, body))

    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return calls, time.perf_counter() - started


def _figures(path: str, concurrency: int, calls: list[_Call], wall_s: float) -> EngineBenchRun:
    ok = [c for c in calls if c.ok]
    tokens = sum(c.tokens for c in ok)
    return EngineBenchRun(
        path=path,
        concurrency=concurrency,
        tokens_per_s=round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        ttft_ms_p50=_pct([c.ttft_ms for c in ok], 50),
        ttft_ms_p99=_pct([c.ttft_ms for c in ok], 99),
        itl_ms_p50=_pct([g for c in ok for g in c.gaps_ms], 50),
        itl_ms_p99=_pct([g for c in ok for g in c.gaps_ms], 99),
        calls=len(calls),
        errors=len(calls) - len(ok),
    )


@contextlib.contextmanager
def _cores(progress: Callable[[str], None]) -> Iterator[tuple[set[int], set[int]]]:
    """(the engine's cores, everything else's): core 0 apart where there are two or more.
    This process keeps the others while it runs (its children inherit them)."""
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        progress("one core only: the engine and the path share it")
        yield mine, mine
        return
    engine = {min(mine)}
    rest = mine - engine
    os.sched_setaffinity(0, rest)
    try:
        yield engine, rest
    finally:
        os.sched_setaffinity(0, mine)


def _services(
    settings: Settings, engine_url: str, cfg: EngineBenchConfig, port: int
) -> list[Service]:
    env = stack_env(settings)
    logs = REPO_ROOT / ".local" / "logs"
    worker = start_service(
        f"{_TAG}-worker",
        [
            "worker",
            "--model",
            MODEL,
            "--version",
            VERSION,
            "--endpoint",
            f"q4_1={engine_url}",
            "--engine",
            "llamacpp",
            "--engine-slots",
            str(cfg.slots),
            "--stream-every-tokens",
            "1",
        ],
        logs,
        env,
    )
    gateway = start_service(
        f"{_TAG}-gateway",
        [
            "gateway",
            "--port",
            str(port),
            "--replica",
            "bench-engine",
            "--rate",
            "1000000",
            "--burst",
            "1000000",
            "--max-in-flight",
            "4096",
        ],
        logs,
        {**env, "GRAYLANE_GATEWAY_KEYS": f"{_KEY}:infer:bench"},
    )
    return [start_router(MODEL, VERSION, env, _TAG), worker, gateway]


async def _wait_gateway(http: httpx.AsyncClient, model: str, within_s: float = 180.0) -> None:
    """Until the gateway answers a one-token call (every hop up to the engine is ready)."""
    deadline = time.monotonic() + within_s
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    while True:
        try:
            answer = await http.post("/v1/chat/completions", json=body, timeout=10)
            if answer.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the path to the engine did not answer")
        await asyncio.sleep(0.5)


async def _measure(
    settings: Settings,
    engine_url: str,
    served: str,
    cfg: EngineBenchConfig,
    progress: Callable[[str], None],
) -> list[EngineBenchRun]:
    settings, _ = await fresh_topics(settings, "beng", MODEL, [VERSION])
    port = free_port()
    services = _services(settings, engine_url, cfg, port)
    levels = cfg.concurrencies or (1, cfg.slots, 2 * cfg.slots)
    runs: list[EngineBenchRun] = []
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    try:
        async with (
            httpx.AsyncClient(base_url=engine_url, timeout=300, limits=limits) as engine,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}",
                timeout=300,
                limits=limits,
                headers={"Authorization": f"Bearer {_KEY}"},
            ) as gateway,
        ):
            progress("waiting for the router, the worker and the gateway")
            await _wait_gateway(gateway, MODEL)
            paths = {"engine": (engine, served), "graylane": (gateway, MODEL)}
            # Warm both, every slot of the engine and every connection: a slot's first
            # call is slower (its cache is made), and a path must not pay for it alone.
            warm = EngineBenchConfig(requests=2, max_tokens=8)
            for http, model in paths.values():
                await _batch(http, "/v1/chat/completions", model, warm, max(levels))
            for level in levels:
                gathered: dict[str, tuple[list[_Call], float]] = {p: ([], 0.0) for p in paths}
                for r in range(cfg.rounds):  # the order alternates: drift evens out
                    order = ("engine", "graylane") if (level + r) % 2 else ("graylane", "engine")
                    for name in order:
                        http, model = paths[name]
                        calls, wall = await _batch(http, "/v1/chat/completions", model, cfg, level)
                        kept, spent = gathered[name]
                        gathered[name] = (kept + calls, spent + wall)
                for name in ("engine", "graylane"):
                    calls, wall = gathered[name]
                    run = _figures(name, level, calls, wall)
                    runs.append(run)
                    progress(
                        f"concurrency {level}, {name}: {run.tokens_per_s:.1f} tokens/s, TTFT p50 "
                        f"{run.ttft_ms_p50:.0f} ms, ITL p50 {run.itl_ms_p50:.1f} ms, "
                        f"{run.errors} errors"
                    )
    finally:
        stop_services(services)
    return runs


def _table(runs: list[EngineBenchRun]) -> None:
    print(
        f"{'conc':>5} {'path':>9} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'err':>4}",
        flush=True,
    )
    for r in runs:
        print(
            f"{r.concurrency:>5} {r.path:>9} {r.tokens_per_s:>8.1f} {r.ttft_ms_p50:>7.0f}ms "
            f"{r.ttft_ms_p99:>7.0f}ms {r.itl_ms_p50:>6.1f}ms {r.itl_ms_p99:>6.1f}ms {r.errors:>4}",
            flush=True,
        )


def _summary(runs: list[EngineBenchRun], cfg: EngineBenchConfig) -> dict[str, object]:
    def at(path: str, level: int) -> EngineBenchRun:
        return next(r for r in runs if r.path == path and r.concurrency == level)

    g, e = at("graylane", cfg.slots), at("engine", cfg.slots)
    levels = sorted({r.concurrency for r in runs})
    return {
        "model": "SmolLM2-135M-Instruct Q4_1 (llama.cpp)",
        "engine_threads": cfg.threads,
        "slots": cfg.slots,
        "max_tokens": cfg.max_tokens,
        "concurrency": cfg.slots,
        "tokens_per_s": g.tokens_per_s,
        "engine_tokens_per_s": e.tokens_per_s,
        "tokens_ratio": round(g.tokens_per_s / e.tokens_per_s, 3) if e.tokens_per_s else 0.0,
        "ttft_ms_p50": g.ttft_ms_p50,
        "engine_ttft_ms_p50": e.ttft_ms_p50,
        "ttft_added_ms_p50": round(g.ttft_ms_p50 - e.ttft_ms_p50, 2),
        "ttft_added_ms_p99": round(g.ttft_ms_p99 - e.ttft_ms_p99, 2),
        "itl_ms_p50": g.itl_ms_p50,
        "engine_itl_ms_p50": e.itl_ms_p50,
        "errors": sum(r.errors for r in runs),
        "by_concurrency": {
            str(level): {r.path: asdict(r) for r in runs if r.concurrency == level}
            for level in levels
        },
    }


def run(cfg: EngineBenchConfig, progress: Callable[[str], None]) -> dict[str, object]:
    from graylane.deploy.engines import llamacpp
    from graylane.deploy.engines.server import LlamaServer
    from graylane.deploy.kafka import broker as kafka_broker

    with _cores(progress) as (engine_cores, path_cores):
        progress("the engine (llama.cpp) and the model: built and fetched once, cached")
        gguf = llamacpp.model()
        progress("starting the broker")
        kafka_broker.start()
        server = LlamaServer(
            gguf,
            threads=cfg.threads,
            slots=cfg.slots,
            log_path=REPO_ROOT / ".local" / "logs" / f"{_TAG}-llama-server.log",
        )
        server.start()
        try:
            if server.pid is not None and engine_cores != path_cores:
                os.sched_setaffinity(server.pid, engine_cores)
            progress(
                f"llama-server on {server.url}: {cfg.threads} thread(s), {cfg.slots} slots, "
                f"cores {sorted(engine_cores)}; the path on cores {sorted(path_cores)}"
            )
            runs = asyncio.run(
                _measure(Settings.from_env(), server.url, server.alias, cfg, progress)
            )
        finally:
            server.stop()
    _table(runs)
    return _summary(runs, cfg)


def main(cfg: EngineBenchConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    summary = run(cfg, progress)
    print(
        f"at {summary['concurrency']} concurrent calls: graylane "
        f"{summary['tokens_per_s']} tokens/s vs engine {summary['engine_tokens_per_s']} "
        f"({summary['tokens_ratio']}x); TTFT added p50 {summary['ttft_added_ms_p50']} ms, "
        f"p99 {summary['ttft_added_ms_p99']} ms",
        flush=True,
    )
    print(json.dumps(summary), flush=True)
    return 0
