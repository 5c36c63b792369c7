"""``graylane bench ...``: benchmarks that print their figures (last line: JSON)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="benchmarks; the last output line is one JSON object")
    which = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    spine = which.add_parser("spine", help="engine vs end-to-end vs unbatched throughput")
    spine.add_argument("--size", choices=["tiny", "small"], default="small")
    spine.add_argument("--requests", type=int, default=600)
    spine.add_argument("--max-batch", type=int, default=8)
    spine.set_defaults(handler=_spine)
    try:
        from builder.bench_variants import add_bench_variants_parser
    except ImportError:  # pragma: no cover - builder is part of the project
        return
    add_bench_variants_parser(which)


def _spine(args: argparse.Namespace) -> int:
    from graylane.bench.spine import SpineConfig, main

    return main(SpineConfig(size=args.size, requests=args.requests, max_batch=args.max_batch))
