"""``graylane bench-variants``: speed and accuracy of each precision variant of the demo GPT.

For every variant: throughput (sequences per second) at batch 1 and batch 8,
median batch-1 latency, and top-1 agreement / cosine similarity with fp32 on
held-out demo text. Runs on ONNX Runtime's CPU provider. The last line printed
is one JSON object: ``{"variants": {"<precision>": {...}, ...}}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "LatencyStats",
    "VariantBench",
    "add_bench_variants_parser",
    "cmd_bench_variants",
    "measure",
]

Subparsers = argparse._SubParsersAction
_WARMUP = 3
_DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "builder" / "examples" / "prompts-en.txt"


@dataclass(frozen=True)
class LatencyStats:
    batch: int
    runs: int
    seconds: float
    p50_ms: float
    p90_ms: float

    @property
    def rps(self) -> float:
        """Sequences per second."""
        return self.batch * self.runs / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class VariantBench:
    name: str
    b1: LatencyStats
    b8: LatencyStats
    top1_agreement: float
    cosine: float

    def as_json(self) -> dict[str, float]:
        return {
            "rps_b1": round(self.b1.rps, 2),
            "rps_b8": round(self.b8.rps, 2),
            "p50_ms_b1": round(self.b1.p50_ms, 3),
            "p50_ms_b8": round(self.b8.p50_ms, 3),
            "top1_agreement": round(self.top1_agreement, 4),
            "cosine": round(self.cosine, 6),
        }


def measure(
    run: Callable[[Mapping[str, np.ndarray]], object],
    feeds: Mapping[str, np.ndarray],
    seconds: float,
    min_runs: int = 5,
) -> LatencyStats:
    """Run ``feeds`` repeatedly for about ``seconds`` after a short warm-up."""
    for _ in range(_WARMUP):
        run(feeds)
    latencies: list[float] = []
    start = time.perf_counter()
    while len(latencies) < min_runs or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        run(feeds)
        latencies.append(time.perf_counter() - t0)
    total = time.perf_counter() - start
    ordered = sorted(latencies)
    batch = int(next(iter(feeds.values())).shape[0])
    return LatencyStats(
        batch=batch,
        runs=len(latencies),
        seconds=total,
        p50_ms=statistics.median(ordered) * 1000,
        p90_ms=ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1000,
    )


def add_bench_variants_parser(
    sub: Subparsers[argparse.ArgumentParser], name: str = "variants"
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        name,
        help="throughput, latency and accuracy of each precision variant of the demo GPT",
    )
    parser.add_argument("--size", choices=["tiny", "small"], default="small", help="demo GPT size")
    parser.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="timed seconds per variant (split b1/b8)"
    )
    parser.add_argument(
        "--precisions",
        default="fp32,fp16,int8,int8-dynamic",
        help="comma-separated precisions to bench",
    )
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads")
    parser.add_argument(
        "--store", type=Path, help="artifact store for caches (default GRAYLANE_ARTIFACT_DIR)"
    )
    decoder = parser.add_argument_group(
        "a decoder's rungs (instead of the demo GPT): tokens/s at batch 1 and --batch, TTFT, "
        "agreement with the first variant (fp32) on real text"
    )
    decoder.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a variant's model.onnx or artifact folder, fp32 first (repeatable)",
    )
    decoder.add_argument("--tokenizer", type=Path, help="default: tokenizer.json beside the first")
    decoder.add_argument(
        "--prompts", type=Path, default=_DEFAULT_PROMPTS, help="prompts file, one per line"
    )
    decoder.add_argument("--count", type=int, default=16, help="prompts used")
    decoder.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per prompt")
    decoder.add_argument("--batch", type=int, default=8, help="the worker's batch size")
    decoder.add_argument(
        "--min-top1", type=float, default=0.97, help="the quality floor of 'fastest rung'"
    )
    parser.set_defaults(handler=cmd_bench_variants)
    return parser


def cmd_bench_variants(args: argparse.Namespace) -> int:
    if getattr(args, "variant", None):
        from graylane.app.bench.decoder_variants import cmd_bench_decoder_variants

        if args.threads is None:
            args.threads = 1
        return cmd_bench_decoder_variants(args)
    from rich.console import Console
    from rich.table import Table

    from graylane.artifacts.model_info import io_signature, load_header, metadata_int
    from graylane.artifacts.naming import Precision, parse_semver
    from graylane.artifacts.verify import sha256_file
    from graylane.builder.build import resolve_source
    from graylane.builder.progress import RichProgress
    from graylane.builder.samples import load_samples
    from graylane.builder.spec import (
        BuildSpec,
        DataSpec,
        DemoSource,
        Generator,
        GeneratorData,
    )
    from graylane.builder.store import ArtifactStore, CacheKind
    from graylane.builder.validation import compare_outputs
    from graylane.builder.variants import VariantInputs, VariantStatus, produce_variant
    from graylane.engine.onnxruntime import OnnxRuntimeEngine
    from graylane.settings import Settings

    console = Console(stderr=True)
    precisions = [Precision(p.strip()) for p in args.precisions.split(",") if p.strip()]
    if Precision.FP32 not in precisions:
        precisions.insert(0, Precision.FP32)
    store = ArtifactStore(args.store or Settings.from_env().artifact_dir)
    spec = BuildSpec(
        model="demo-gpt",
        version=parse_semver("0.0.0"),
        source=DemoSource(size=args.size),
    )
    progress = RichProgress(console, title="bench-variants")
    progress.begin(2 + 2 * len(precisions))
    results: list[VariantBench] = []
    try:
        progress.step("demo model and samples")
        source = resolve_source(spec, store)
        header = load_header(source)
        signature = io_signature(header)
        max_seq = metadata_int(header, "max_seq_len")
        text = GeneratorData(Generator.DEMO_TEXT, seq_len=args.seq)
        calib = load_samples(DataSpec(text, samples=64, seed=0, batch_size=8), signature, max_seq)
        held_out = load_samples(
            DataSpec(text, samples=32, seed=1, batch_size=8), signature, max_seq
        )
        progress.done(f"demo {args.size}: {source.stat().st_size / 1e6:.1f} MB, seq {args.seq}")

        with tempfile.TemporaryDirectory(prefix="bench-variants-") as tmp:
            inputs = VariantInputs(
                source=source,
                source_sha256=sha256_file(source),
                work_dir=Path(tmp),
                cache_dir=store.cache_dir(CacheKind.CALIBRATION),
                calibration=calib,
            )
            paths: dict[Precision, Path] = {}
            for precision in precisions:
                progress.step(f"producing {precision.value}")
                outcome = produce_variant(precision, inputs)
                ok = outcome.status is VariantStatus.PRODUCED and outcome.path is not None
                if ok and outcome.path is not None:
                    paths[precision] = outcome.path
                progress.done(
                    f"{precision.value}: {outcome.status.value} in {outcome.duration_s:.1f}s"
                    + (f" — {outcome.reason}" if outcome.reason else ""),
                    ok=ok,
                )

            progress.step("fp32 reference outputs")
            # The worker's adapter and session options: what is timed here is what is served.
            reference_engine = OnnxRuntimeEngine.load(
                paths[Precision.FP32], Precision.FP32.value, intra_op_threads=args.threads
            )
            reference = [reference_engine.run(b) for b in held_out]
            masks = [b.get("attention_mask") for b in held_out]
            progress.done("fp32 reference ready")

            rng = np.random.default_rng(7)
            ids = rng.integers(0, 256, size=(8, args.seq), dtype=np.int64)
            feeds8 = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            feeds1 = {k: v[:1] for k, v in feeds8.items()}
            for precision, path in paths.items():
                progress.step(f"timing {precision.value}")
                engine = OnnxRuntimeEngine.load(
                    path, precision.value, intra_op_threads=args.threads
                )
                metrics = compare_outputs(reference, [engine.run(b) for b in held_out], masks)
                bench = VariantBench(
                    name=precision.value,
                    b1=measure(engine.run, feeds1, args.seconds / 2),
                    b8=measure(engine.run, feeds8, args.seconds / 2),
                    top1_agreement=metrics.top1_agreement,
                    cosine=metrics.cosine,
                )
                results.append(bench)
                progress.done(
                    f"{precision.value}: b1 {bench.b1.rps:.1f} seq/s "
                    f"(p50 {bench.b1.p50_ms:.2f} ms), "
                    f"b8 {bench.b8.rps:.1f} seq/s, top1 {bench.top1_agreement:.3f}, "
                    f"cos {bench.cosine:.5f}"
                )
    finally:
        progress.end()

    table = Table(title=f"demo-gpt {args.size}, seq {args.seq}, ONNX Runtime CPU")
    for column in ("variant", "seq/s b1", "p50 ms b1", "seq/s b8", "p50 ms b8", "top1", "cosine"):
        table.add_column(column, justify="right", no_wrap=True)
    base = next((r for r in results if r.name == "fp32"), None)
    for r in results:
        speedup = f" ({r.b8.rps / base.b8.rps:.1f}x)" if base and base.b8.rps else ""
        table.add_row(
            r.name,
            f"{r.b1.rps:.1f}",
            f"{r.b1.p50_ms:.2f}",
            f"{r.b8.rps:.1f}{speedup}",
            f"{r.b8.p50_ms:.2f}",
            f"{r.top1_agreement:.3f}",
            f"{r.cosine:.5f}",
        )
    console.print(table)
    report: dict[str, dict[str, float]] = {r.name: r.as_json() for r in results}
    if base is not None:
        for r in results:
            # each rung's speed-up over fp32: what a QoS step down buys in capacity
            if base.b1.rps:
                report[r.name]["speedup_b1"] = round(r.b1.rps / base.b1.rps, 3)
            if base.b8.rps:
                report[r.name]["speedup_b8"] = round(r.b8.rps / base.b8.rps, 3)
    print(json.dumps({"variants": report}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-variants")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_variants_parser(sub)
    args = parser.parse_args(["bench-variants", *(argv if argv is not None else [])])
    return int(args.handler(args))


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
