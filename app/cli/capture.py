"""``graylane calib capture``: a calibration set (for int8 builds) from recorded traffic.

Reads the model's ingress topic (or, with ``--version``, that version's request
topic) from ``--from`` on, de-duplicates, keeps the calibration split (the
held-out split is left for ``check consistency --data recorded``), stratifies by
sequence length and writes the builder's ``.npz`` plus ``<name>.manifest.json``.
A build spec names it with ``calibration: {npz: calib.npz, samples: N}``.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from graylane.app.cli.views import parse_time

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    calib = sub.add_parser("calib", help="calibration data from recorded traffic")
    csub = calib.add_subparsers(dest="calib_command", metavar="ACTION", required=True)
    cap = csub.add_parser(
        "capture", help="recorded requests → stratified, de-duplicated .npz + manifest"
    )
    cap.add_argument("--model", required=True, help="the model whose recorded requests to read")
    cap.add_argument("--version", default=None, help="read this version's topic, not ingress")
    cap.add_argument("--from", dest="from_", default="1h", help="ISO time, unix ms or age (1h)")
    cap.add_argument("--to", default="", help="ISO time, unix ms, or ago like 15m (default: now)")
    cap.add_argument("--samples", type=int, default=1000, help="samples to keep")
    cap.add_argument("--seed", type=int, default=0, help="random seed of the sampling")
    cap.add_argument(
        "--buckets",
        default="",
        help="comma-separated upper bounds of the length buckets (default 8,16,...,1024)",
    )
    cap.add_argument("--pad-id", type=int, default=None, help="default: the demo GPT's pad id")
    cap.add_argument("--max-len", type=int, default=None, help="cut longer inputs")
    cap.add_argument(
        "--split",
        choices=("calibration", "held-out"),
        default="calibration",
        help="held-out: the rows calibration never takes, for a spec's validation section",
    )
    cap.add_argument(
        "--timeout-s", type=float, default=60.0, help="give up reading after this long"
    )
    cap.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    cap.set_defaults(handler=_capture)


def _capture(args: argparse.Namespace) -> int:
    from graylane.capture.recorded import CaptureOptions, capture, manifest_path, write_capture
    from graylane.capture.sampling import DEFAULT_BUCKET_EDGES, CaptureError, Split
    from graylane.kafka.seam import KafkaFactory
    from graylane.models.byte_vocab import PAD_ID
    from graylane.settings import Settings

    edges = (
        tuple(int(x) for x in args.buckets.split(",") if x.strip())
        if args.buckets
        else DEFAULT_BUCKET_EDGES
    )
    options = CaptureOptions(
        model=args.model,
        version=args.version,
        from_ms=parse_time(args.from_),
        to_ms=parse_time(args.to),
        samples=args.samples,
        split=Split(args.split),
        seed=args.seed,
        edges=tuple(sorted(edges)),
        pad_id=PAD_ID if args.pad_id is None else args.pad_id,
        max_len=args.max_len,
        timeout_s=args.timeout_s,
    )
    factory = KafkaFactory(Settings.from_env())
    try:
        columns, manifest = asyncio.run(capture(factory, factory.layout, options))
    except CaptureError as exc:
        print(f"calib capture: {exc}")
        return 1
    manifest = write_capture(args.out, columns, manifest)
    print(
        f"wrote {args.out} ({manifest.samples} samples, seq {manifest.seq_len}) and "
        f"{manifest_path(args.out).name}; from {', '.join(manifest.topics)}: "
        f"{manifest.records} records, {manifest.duplicates} duplicates, "
        f"{manifest.other_split} in the other split"
    )
    for b in manifest.buckets:
        high = "" if b.high is None else str(b.high)
        print(f"  length ({b.low}, {high}]: {b.selected} of {b.available}")
    if manifest.samples < args.samples:
        print(f"note: asked for {args.samples}, the range held only {manifest.samples}")
    return 0
