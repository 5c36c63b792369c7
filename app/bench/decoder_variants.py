"""``graylane bench variants --variant NAME=PATH ...``: a decoder's rungs, as a worker runs them.

For each precision variant of a decoder with a KV cache (an Optimum export or a GGUF
import, e.g. ``builder/examples/smollm2-gguf.yaml``'s artifacts), through the worker's own
decode loop (:class:`~graylane.engine_worker.kv_decode.KvDecodeLoop`):

- output tokens/s of greedy decoding at batch 1 and at the worker's batch size
  (``--batch``: that many prompts decoding together);
- TTFT: the prefill of one prompt to its first token (median, batch 1);
- agreement with fp32 on real text (``--prompts``, default the builder's English set):
  top-1 agreement of every position of prompt + fp32's greedy continuation, fp32's tokens
  forced (so a variant is judged on the text fp32 writes, not on its own drift), and the
  greedy prefix agreement (share of generated tokens before the first divergence).

Variants take turns prompt by prompt, so the load of other processes on a shared machine
hits them alike; the speed-up is each variant's tokens/s over fp32's from the same run.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DecoderBench", "cmd_bench_decoder_variants", "measure_decoder_variants"]

_DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "builder" / "examples" / "prompts-en.txt"


@dataclass(frozen=True)
class DecoderBench:
    name: str
    tokens_per_s_b1: float
    tokens_per_s_batch: float
    ttft_ms: float
    top1_agreement: float
    prefix_agreement: float
    positions: int

    def as_json(self) -> dict[str, float]:
        return {
            "tokens_per_s_b1": round(self.tokens_per_s_b1, 2),
            "tokens_per_s_batch": round(self.tokens_per_s_batch, 2),
            "ttft_ms": round(self.ttft_ms, 1),
            "top1_agreement": round(self.top1_agreement, 4),
            "prefix_agreement": round(self.prefix_agreement, 3),
            "positions": self.positions,
        }


def _generate(
    engine: Any, prompts: Sequence[Sequence[int]], new_tokens: int, rows: int
) -> tuple[list[tuple[int, ...]], float, float]:
    """Greedy tokens per prompt (no EOS stop: fixed length), seconds of the prefill step
    of the first joiners, seconds in all."""
    from graylane.engine_worker.kv_decode import KvDecodeLoop

    loop = KvDecodeLoop(engine, max_batch_size=rows, max_seq_len=4096)
    ids = [loop.submit(p, new_tokens, None) for p in prompts]
    started = time.perf_counter()
    results: dict[int, Any] = dict(loop.prefill_step())
    prefill = time.perf_counter() - started
    results.update(loop.decode_step())
    results.update(loop.run())
    return [tuple(results[i].tokens) for i in ids], prefill, time.perf_counter() - started


def _forced_argmax(engine: Any, tokens: Sequence[int]) -> np.ndarray:
    from graylane.engine_worker.forward import run_forward
    from graylane.engine_worker.layouts import INPUT_IDS

    out = run_forward(engine, [{INPUT_IDS: np.asarray([list(tokens)], dtype=np.int64)}])[0]
    argmax: np.ndarray = np.asarray(out["logits"][0]).argmax(axis=-1)
    return argmax


def measure_decoder_variants(
    paths: Mapping[str, Path],
    prompts: Sequence[Sequence[int]],
    *,
    new_tokens: int = 16,
    batch: int = 8,
    threads: int | None = 1,
    say: Any = print,
) -> list[DecoderBench]:
    """Bench every variant against the first (fp32), prompt by prompt in turns."""
    from graylane.engine.onnxruntime import OnnxRuntimeEngine

    engines = {
        name: OnnxRuntimeEngine.load(path, name, name="bench", intra_op_threads=threads)
        for name, path in paths.items()
    }
    names = list(engines)
    reference = names[0]
    b1_tokens = dict.fromkeys(names, 0)
    b1_seconds = dict.fromkeys(names, 0.0)
    ttft: dict[str, list[float]] = {n: [] for n in names}
    agree = dict.fromkeys(names, 0)
    positions = 0
    prefix: dict[str, list[float]] = {n: [] for n in names}
    for engine in engines.values():  # first calls allocate: not timed
        _generate(engine, prompts[:1], 2, 1)
    for k, prompt in enumerate(prompts):
        outputs: dict[str, tuple[int, ...]] = {}
        for name in names if k % 2 == 0 else reversed(names):
            (tokens,), prefill, seconds = _generate(engines[name], [prompt], new_tokens, 1)
            outputs[name] = tokens
            ttft[name].append(prefill)
            b1_tokens[name] += len(tokens) - 1  # the first token is the prefill's
            b1_seconds[name] += seconds - prefill
        forced = [*prompt, *outputs[reference]]
        ref_top1 = _forced_argmax(engines[reference], forced)[len(prompt) - 1 :]
        positions += len(ref_top1)
        for name in names:
            top1 = _forced_argmax(engines[name], forced)[len(prompt) - 1 :]
            agree[name] += int(np.sum(top1 == ref_top1))
            same = [a == b for a, b in zip(outputs[name], outputs[reference], strict=True)]
            first = same.index(False) if False in same else len(same)
            prefix[name].append(first / max(1, len(same)))
        say(f"prompt {k + 1}/{len(prompts)}")
    batched: dict[str, float] = {}
    group = [prompts[i % len(prompts)] for i in range(batch)]
    for name in names:
        tokens_out, _, seconds = _generate(engines[name], group, new_tokens, batch)
        batched[name] = sum(len(t) for t in tokens_out) / seconds
    return [
        DecoderBench(
            name=name,
            tokens_per_s_b1=b1_tokens[name] / b1_seconds[name] if b1_seconds[name] else 0.0,
            tokens_per_s_batch=batched[name],
            ttft_ms=statistics.median(ttft[name]) * 1000.0,
            top1_agreement=agree[name] / positions if positions else 0.0,
            prefix_agreement=float(np.mean(prefix[name])) if prefix[name] else 0.0,
            positions=positions,
        )
        for name in names
    ]


def cmd_bench_decoder_variants(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from graylane.builder.spec import read_prompts
    from graylane.models.hf_tokenizer import HfTokenizer

    paths: dict[str, Path] = {}
    for item in args.variant:
        name, _, raw = item.partition("=")
        path = Path(raw)
        if path.is_dir():
            path = path / "model.onnx"
        if not name or not path.is_file():
            raise SystemExit(
                f"--variant {item!r}: expected NAME=PATH of a model.onnx (or its folder)"
            )
        paths[name] = path
    tokenizer_path = args.tokenizer or next(iter(paths.values())).with_name("tokenizer.json")
    if not tokenizer_path.is_file():
        raise SystemExit(f"no tokenizer at {tokenizer_path}: give --tokenizer PATH")
    tokenizer = HfTokenizer(tokenizer_path)
    texts = read_prompts(args.prompts)[: args.count]
    prompts = [tokenizer.encode(t) for t in texts]
    console = Console(stderr=True)
    benches = measure_decoder_variants(
        paths,
        prompts,
        new_tokens=args.new_tokens,
        batch=args.batch,
        threads=args.threads,
        say=lambda line: console.print(line, highlight=False),
    )
    reference = benches[0]
    table = Table(
        title=f"decoder variants: {len(prompts)} prompts x {args.new_tokens} greedy tokens, "
        f"batch 1 and {args.batch}, {args.threads or 'default'} thread(s)"
    )
    for column in ("variant", "tok/s b1", "x fp32", f"tok/s b{args.batch}", "TTFT ms", "top-1",
                   "prefix"):  # fmt: skip
        table.add_column(column)
    for b in benches:
        table.add_row(
            b.name,
            f"{b.tokens_per_s_b1:.1f}",
            f"{b.tokens_per_s_b1 / reference.tokens_per_s_b1:.2f}",
            f"{b.tokens_per_s_batch:.1f}",
            f"{b.ttft_ms:.0f}",
            f"{b.top1_agreement:.4f}",
            f"{b.prefix_agreement:.3f}",
        )
    Console().print(table)
    keeping = [b for b in benches[1:] if b.top1_agreement >= args.min_top1]
    best = max(keeping, key=lambda b: b.tokens_per_s_b1, default=None)
    if best is not None:
        print(
            f"fastest rung with top-1 >= {args.min_top1}: {best.name}, "
            f"{best.tokens_per_s_b1 / reference.tokens_per_s_b1:.2f}x fp32 at batch 1"
        )
    print(json.dumps({"variants": {b.name: b.as_json() for b in benches}}))
    return 0
