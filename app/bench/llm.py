"""``graylane bench llm``: streamed generation through Kafka against the engine driven directly.

For a decoder with a KV cache (the demo GPT, or an ONNX decoder of one's own), at
several client concurrencies against the worker's decode capacity (its
``--max-sequences``: 1, half of it, all of it, twice it):

- **engine direct** (the ceiling): the same engine in a
  :class:`~graylane.engine_worker.kv_decode.KvDecodeLoop` holding that many sequences (at most
  the worker's rows), a new prompt joining as one finishes; output tokens/s; and the
  prefill time of one prompt;
- **through Kafka**: a router and a worker (processes) on the local broker, that many
  clients each streaming one generation after another (``stream=True``; output lengths
  spread around ``new_tokens``, clients starting spread over one request's time): time to first
  token (first chunk received - request sent), time per output token ((last chunk -
  first chunk) / (tokens - 1)), output tokens/s over the level.

Both run in the same process tree on the same cores, side by side. The last line is JSON:
``tokens_per_s`` and ``engine_tokens_per_s`` at the highest concurrency, ``ttft_ms_p99``
at half capacity against ``prefill_ms`` (the bound: 2 x prefill), ``tpot_ms_p99``,
``streamed``, ``concurrency``, and every level.
"""

from __future__ import annotations

import asyncio
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
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
from graylane.client import GraylaneClient, Task
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.kv_decode import KvDecodeLoop
from graylane.settings import Settings

__all__ = [
    "LevelFigures",
    "LlmBenchConfig",
    "engine_tokens_per_s",
    "main",
    "model_label",
    "prefill_ms",
    "run",
]

MODEL = "llm-bench"
_TAG = "bench-llm"


@dataclass(frozen=True, kw_only=True)
class LlmBenchConfig:
    size: str = "small"
    """Demo GPT size (when no ``onnx`` is given)."""
    onnx: Path | None = None
    """A decoder-with-past ONNX file of one's own instead of the demo GPT."""
    prompt_len: int = 64
    new_tokens: int = 48
    max_sequences: int = 8
    requests_per_client: int = 4
    stream_every_tokens: int = 4


@dataclass(frozen=True)
class LevelFigures:
    concurrency: int
    requests: int
    tokens_per_s: float
    engine_tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    tpot_ms_p50: float
    tpot_ms_p99: float


def _prompt(i: int, length: int, vocab: int) -> list[int]:
    rng = np.random.default_rng(1000 + i)
    return [int(t) for t in rng.integers(3, max(4, vocab), size=length)]


def _new_tokens(i: int, mean: int) -> int:
    """Request ``i``'s output length: uniform in [mean/2, 3 mean/2], seeded (real answers
    differ in length; equal ones would finish, and rejoin, in lockstep)."""
    rng = np.random.default_rng(2000 + i)
    return int(rng.integers(max(1, mean // 2), mean + mean // 2 + 1))


def prefill_ms(engine: OnnxRuntimeEngine, prompt: Sequence[int], max_seq_len: int) -> float:
    """Median time of one prefill (one sequence, its first token) on ``engine``."""
    times = []
    for _ in range(15):
        loop = KvDecodeLoop(engine, max_batch_size=1, max_seq_len=max_seq_len)
        loop.submit(prompt, 1)
        started = time.perf_counter()
        loop.run()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


def engine_tokens_per_s(
    engine: OnnxRuntimeEngine,
    prompts: Sequence[Sequence[int]],
    new_tokens: Sequence[int],
    concurrency: int,
    max_seq_len: int,
) -> float:
    """Output tokens/s of the engine decoding ``concurrency`` sequences at a time, the
    next prompt joining as one finishes."""
    loop = KvDecodeLoop(engine, max_batch_size=concurrency, max_seq_len=max_seq_len)
    for prompt, new in zip(prompts, new_tokens, strict=True):
        loop.submit(prompt, new)
    started = time.perf_counter()
    results = loop.run()
    spent = time.perf_counter() - started
    return sum(len(r.tokens) for r in results.values()) / spent


@dataclass
class _Samples:
    ttft_ms: list[float]
    tpot_ms: list[float]
    tokens: int = 0


async def _client_loop(
    client: GraylaneClient,
    work: Sequence[tuple[Sequence[int], int]],
    cfg: LlmBenchConfig,
    samples: _Samples,
    delay_s: float,
) -> None:
    await asyncio.sleep(delay_s)  # clients start spread out, not in one burst
    for prompt, new_tokens in work:
        sent = time.perf_counter()
        first = last = 0.0
        tokens = 0
        async for chunk in client.stream(
            MODEL,
            token_ids=list(prompt),
            max_new_tokens=new_tokens,
            stream_every_tokens=cfg.stream_every_tokens,
            timeout=60,
        ):
            now = time.perf_counter()
            if chunk.tokens and not first:
                first = now
            if chunk.tokens:
                last = now
            tokens += len(chunk.tokens)
        samples.tokens += tokens
        if first:
            samples.ttft_ms.append((first - sent) * 1000.0)
        if tokens > 1 and last > first:
            samples.tpot_ms.append((last - first) * 1000.0 / (tokens - 1))


def _work(n: int, cfg: LlmBenchConfig, vocab: int) -> list[tuple[list[int], int]]:
    return [(_prompt(i, cfg.prompt_len, vocab), _new_tokens(i, cfg.new_tokens)) for i in range(n)]


async def _kafka_level(
    client: GraylaneClient, concurrency: int, cfg: LlmBenchConfig, vocab: int, spread_s: float
) -> tuple[_Samples, float, int]:
    """``concurrency`` clients, each streaming its requests one after another; client ``c``
    starts ``c / concurrency`` of ``spread_s`` (about one request's time) late."""
    samples = _Samples([], [])
    per = cfg.requests_per_client
    work = _work(concurrency * per, cfg, vocab)
    started = time.perf_counter()
    await asyncio.gather(
        *(
            _client_loop(
                client, work[c * per : (c + 1) * per], cfg, samples, spread_s * c / concurrency
            )
            for c in range(concurrency)
        )
    )
    return samples, time.perf_counter() - started, concurrency * per


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _levels(capacity: int) -> list[int]:
    """Client concurrencies: 1, half the decode rows, all of them, and twice as many (the
    worker's rows stay full: a request waits there, not in a round trip, for a free row)."""
    return sorted({1, max(1, capacity // 2), capacity, 2 * capacity})


def _stack(model: Path, cfg: LlmBenchConfig, env: dict[str, str]) -> list[Service]:
    worker = WorkerSpec(
        "v1",
        {"fp32": str(model)},
        extra_args=(
            "--max-batch",
            str(cfg.max_sequences),
            "--max-sequences",
            str(cfg.max_sequences),
            "--stream-every-tokens",
            str(cfg.stream_every_tokens),
        ),
    )
    return [start_router(MODEL, "v1", env, _TAG), start_worker(worker, MODEL, env, _TAG)]


async def _through_kafka(
    settings: Settings,
    model: Path,
    cfg: LlmBenchConfig,
    vocab: int,
    engine: OnnxRuntimeEngine,
    max_seq_len: int,
    progress: Callable[[str], None],
) -> list[LevelFigures]:
    settings, factory = await fresh_topics(settings, "bllm", MODEL, ["v1"])
    services = _stack(model, cfg, stack_env(settings))
    figures: list[LevelFigures] = []
    try:
        async with GraylaneClient(factory) as client:
            progress("waiting for the router and the worker")
            await wait_answered(
                functools.partial(
                    client.infer,
                    MODEL,
                    token_ids=[1, 2, 3][: max(1, vocab - 1)],
                    task=Task.GENERATE,
                    max_new_tokens=1,
                    timeout=5,
                )
            )
            await _kafka_level(client, 2, cfg, vocab, 0.0)  # warm-up
            for concurrency in _levels(cfg.max_sequences):
                work = _work(concurrency * cfg.requests_per_client, cfg, vocab)
                started = time.perf_counter()
                rows = min(concurrency, cfg.max_sequences)  # the engine at the worker's rows
                ceiling = engine_tokens_per_s(
                    engine, [p for p, _ in work], [n for _, n in work], rows, max_seq_len
                )
                one_request_s = (time.perf_counter() - started) / cfg.requests_per_client
                samples, spent, n = await _kafka_level(
                    client, concurrency, cfg, vocab, one_request_s
                )
                level = LevelFigures(
                    concurrency=concurrency,
                    requests=n,
                    tokens_per_s=round(samples.tokens / spent, 1),
                    engine_tokens_per_s=round(ceiling, 1),
                    ttft_ms_p50=round(_pct(samples.ttft_ms, 50), 1),
                    ttft_ms_p99=round(_pct(samples.ttft_ms, 99), 1),
                    tpot_ms_p50=round(_pct(samples.tpot_ms, 50), 2),
                    tpot_ms_p99=round(_pct(samples.tpot_ms, 99), 2),
                )
                progress(
                    f"concurrency {concurrency}: {level.tokens_per_s:.0f} tok/s through Kafka, "
                    f"{level.engine_tokens_per_s:.0f} engine direct; TTFT p99 "
                    f"{level.ttft_ms_p99:.1f} ms, TPOT p99 {level.tpot_ms_p99:.2f} ms"
                )
                figures.append(level)
    finally:
        stop_services(services)
    return figures


def _table(levels: Sequence[LevelFigures], prefill: float) -> str:
    head = (
        f"{'conc':>4} {'tok/s':>8} {'engine':>8} {'ratio':>6} "
        f"{'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9}"
    )
    rows = [head, "-" * len(head)]
    for lv in levels:
        ratio = lv.tokens_per_s / lv.engine_tokens_per_s if lv.engine_tokens_per_s else 0.0
        rows.append(
            f"{lv.concurrency:>4} {lv.tokens_per_s:>8.0f} {lv.engine_tokens_per_s:>8.0f} "
            f"{ratio:>6.2f} {lv.ttft_ms_p50:>7.1f}ms {lv.ttft_ms_p99:>7.1f}ms "
            f"{lv.tpot_ms_p50:>7.2f}ms {lv.tpot_ms_p99:>7.2f}ms"
        )
    rows.append(f"prefill of one {prefill:.1f} ms prompt on the engine alone")
    return "\n".join(rows)


def model_label(onnx: Path) -> str:
    """What a run on ``onnx`` is called: the folder its file sits in (an export is a
    folder of ``model.onnx`` and its tokenizer, so the file name tells nothing)."""
    return onnx.resolve().parent.name or onnx.stem


def run(cfg: LlmBenchConfig, progress: Callable[[str], None]) -> dict[str, object]:
    from graylane.deploy.kafka import broker as kafka_broker

    progress("starting the broker")
    kafka_broker.start()
    if cfg.onnx is not None:
        model, name = cfg.onnx, model_label(cfg.onnx)
    else:
        model = demo_model(cfg.size, kv_cache=True, progress=progress)
        name = f"demo-gpt-{cfg.size}"
    engine = OnnxRuntimeEngine.load(model, "fp32", intra_op_threads=1)
    from graylane.engine_worker.loading import onnx_model_info

    vocab = onnx_model_info(model).vocab_size or 256
    max_seq_len = 256
    prefill = prefill_ms(engine, _prompt(0, cfg.prompt_len, vocab), max_seq_len)
    progress(f"engine prefill of a {cfg.prompt_len}-token prompt: {prefill:.1f} ms")
    levels = asyncio.run(
        _through_kafka(Settings.from_env(), model, cfg, vocab, engine, max_seq_len, progress)
    )
    print(_table(levels, prefill), flush=True)
    top = levels[-1]
    half = next(lv for lv in levels if lv.concurrency == max(1, cfg.max_sequences // 2))
    return {
        "model": name,
        "prompt_tokens": cfg.prompt_len,
        "new_tokens": cfg.new_tokens,
        "streamed": True,
        "concurrency": top.concurrency,
        "tokens_per_s": top.tokens_per_s,
        "engine_tokens_per_s": top.engine_tokens_per_s,
        "tokens_over_engine": round(top.tokens_per_s / top.engine_tokens_per_s, 3)
        if top.engine_tokens_per_s
        else 0.0,
        "ttft_ms_p99": half.ttft_ms_p99,
        "ttft_concurrency": half.concurrency,
        "prefill_ms": round(prefill, 2),
        "ttft_over_prefill": round(half.ttft_ms_p99 / prefill, 2) if prefill else 0.0,
        "tpot_ms_p99": top.tpot_ms_p99,
        "levels": [asdict(lv) for lv in levels],
    }


def main(cfg: LlmBenchConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    print(json.dumps(run(cfg, progress)))
    return 0
