"""``graylane bench generate``: KV-cache generation vs full recompute, one run.

The small demo GPT is exported twice from the same seed: without a cache (the
worker's recompute path, ``compute.run_batch`` per worker batch of
``max_batch`` requests) and with past/present tensors (one prefill and one
incremental step per token, requests joining and leaving the running batch
between steps). Both run on the worker's ONNX Runtime engine adapter with its
session options, at saturation: every request is queued at the start, more of
them than one batch holds. Greedy outputs are compared token for token.
Progress lines first; the last line is one JSON object.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.compute import GenerateOutcome, run_batch
from graylane.engine_worker.kv_decode import GenerationResult, KvDecodeLoop
from graylane.engine_worker.logic.batching import DEFAULT_BUCKETS, BucketPolicy
from graylane.engine_worker.requests import TaskKind, WorkItem
from graylane.models.byte_vocab import BOS_ID, EOS_ID, PAD_ID
from graylane.models.demo_gpt import write_demo_gpt

__all__ = [
    "PROMPT_LENGTHS",
    "GenerateBenchConfig",
    "PathRun",
    "main",
    "prompts",
    "run_kv",
    "run_recompute",
]

PROMPT_LENGTHS = (8, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class GenerateBenchConfig:
    size: str = "small"
    requests: int = 24
    max_batch: int = 8
    new_tokens: int = 64
    max_seq_len: int = 256
    seed: int = 7


@dataclass(frozen=True)
class PathRun:
    results: list[GenerationResult]
    seconds: float

    @property
    def tokens(self) -> int:
        return sum(len(r.tokens) for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def prompts(count: int) -> list[list[int]]:
    """Printable-byte prompts after BOS, lengths cycling through :data:`PROMPT_LENGTHS`."""
    rng = np.random.default_rng(0)
    return [
        [BOS_ID, *(int(t) for t in rng.integers(32, 127, PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)]))]
        for i in range(count)
    ]


def run_recompute(
    engine: OnnxRuntimeEngine,
    batch: Sequence[list[int]],
    cfg: GenerateBenchConfig,
    say: Callable[[str], None],
) -> PathRun:
    """The worker's path: ``run_batch`` per worker batch, each running until its longest ends."""
    policy = BucketPolicy(buckets=DEFAULT_BUCKETS, max_batch_size=cfg.max_batch)
    results: list[GenerationResult] = []
    started = time.perf_counter()
    for start in range(0, len(batch), cfg.max_batch):
        chunk = batch[start : start + cfg.max_batch]
        items = [
            WorkItem(
                index=i,
                task=TaskKind.GENERATE,
                seq_len=len(p),
                prompt_tokens=tuple(p),
                max_new_tokens=cfg.new_tokens,
                eos_id=EOS_ID,
            )
            for i, p in enumerate(chunk)
        ]
        run = run_batch(engine, items, policy, cfg.max_seq_len, pad_id=PAD_ID)
        for i in range(len(chunk)):
            outcome = run.outcomes[i]
            assert isinstance(outcome, GenerateOutcome)
            results.append(outcome.result)
        say(f"recompute: {len(results)}/{len(batch)} requests")
    return PathRun(results, time.perf_counter() - started)


def run_kv(
    engine: OnnxRuntimeEngine,
    batch: Sequence[list[int]],
    cfg: GenerateBenchConfig,
    say: Callable[[str], None],
) -> tuple[PathRun, KvDecodeLoop]:
    """Every request queued at once; rows join and leave the running batch between steps."""
    loop = KvDecodeLoop(
        engine, max_batch_size=cfg.max_batch, max_seq_len=cfg.max_seq_len, pad_id=PAD_ID
    )
    started = time.perf_counter()
    ids = [loop.submit(p, cfg.new_tokens, EOS_ID) for p in batch]
    done: dict[int, GenerationResult] = {}
    while not loop.idle:
        finished = loop.step()
        done.update(finished)
        if finished:
            say(f"kv: {len(done)}/{len(batch)} requests")
    return PathRun([done[i] for i in ids], time.perf_counter() - started), loop


def main(cfg: GenerateBenchConfig) -> int:
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    batch = prompts(cfg.requests)
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        plain = write_demo_gpt(Path(tmp) / "plain.onnx", cfg.size, seed=cfg.seed)
        cached = write_demo_gpt(Path(tmp) / "kv.onnx", cfg.size, seed=cfg.seed, kv_cache=True)
        recompute_engine = OnnxRuntimeEngine.load(plain, "fp32", name="bench-gpt")
        kv_engine = OnnxRuntimeEngine.load(cached, "fp32", name="bench-gpt-kv")
    say(
        f"demo {cfg.size}: {cfg.requests} requests, prompts {min(map(len, batch))}-"
        f"{max(map(len, batch))} tokens, {cfg.new_tokens} new tokens each, batch {cfg.max_batch}"
    )
    # Warm both sessions (first runs allocate) on a request outside the measured set.
    warm = [[BOS_ID, 65, 66]]
    run_kv(kv_engine, warm, GenerateBenchConfig(new_tokens=4, max_batch=cfg.max_batch), say)
    run_recompute(recompute_engine, warm, GenerateBenchConfig(new_tokens=4), lambda _: None)

    kv, loop = run_kv(kv_engine, batch, cfg, say)
    mean_rows = loop.stats.decode_rows / max(loop.stats.decode_calls, 1)
    say(
        f"kv: {kv.tokens} tokens in {kv.seconds:.1f}s = {kv.tokens_per_s:.1f} tokens/s "
        f"({loop.stats.prefill_calls} prefills, {loop.stats.decode_calls} decode steps, "
        f"mean batch {mean_rows:.1f}, {loop.stats.compactions} compactions)"
    )
    recompute = run_recompute(recompute_engine, batch, cfg, say)
    say(
        f"recompute: {recompute.tokens} tokens in {recompute.seconds:.1f}s "
        f"= {recompute.tokens_per_s:.1f} tokens/s"
    )
    identical = kv.results == recompute.results
    if not identical:
        pairs = zip(kv.results, recompute.results, strict=True)
        differ = [i for i, (a, b) in enumerate(pairs) if a != b]
        say(f"outputs differ for requests {differ}")
    speedup = kv.tokens_per_s / recompute.tokens_per_s if recompute.tokens_per_s else 0.0
    print(
        json.dumps(
            {
                "size": cfg.size,
                "requests": cfg.requests,
                "max_batch": cfg.max_batch,
                "new_tokens": cfg.new_tokens,
                "kv_tokens_per_s": round(kv.tokens_per_s, 2),
                "recompute_tokens_per_s": round(recompute.tokens_per_s, 2),
                "speedup": round(speedup, 2),
                "identical_outputs": identical,
            }
        ),
        flush=True,
    )
    return 0 if identical else 1
