"""``graylane check consistency``: does a candidate version answer like the baseline?

Both versions' served variants (from the registry, verified against their
manifests) run on the same inputs through Polygraphy: by default a held-out
sample of recorded requests (the split ``calib capture`` never takes), or a
given ``.npz``. Exit status: 0 within tolerance, 1 outside, 2 when the check
cannot run, 3 when the output schemas are incompatible (reported, not compared).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from graylane.app.cli.views import parse_time

if TYPE_CHECKING:
    from graylane.builder.samples import SampleSet
    from graylane.engine.signature import IOSignature

__all__ = ["register"]

RECORDED = "recorded"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser("check", help="quality checks between model versions")
    csub = check.add_subparsers(dest="check_command", metavar="CHECK", required=True)
    con = csub.add_parser(
        "consistency", help="run two versions on the same inputs and compare (Polygraphy)"
    )
    con.add_argument("--model", required=True, help="the model")
    con.add_argument("--baseline", required=True, help="the version to compare against")
    con.add_argument(
        "--candidate", required=True, help="the candidate version to check against the stable one"
    )
    con.add_argument("--precision", default="fp32", help="which served variant of each version")
    con.add_argument(
        "--data", default=RECORDED, help="'recorded' (held-out recorded requests) or FILE.npz"
    )
    con.add_argument("--from", dest="from_", default="24h", help="recorded data: start time")
    con.add_argument("--samples", type=int, default=200, help="samples compared")
    con.add_argument("--batch-size", type=int, default=16, help="samples per engine call")
    con.add_argument("--prompts", type=int, default=8, help="greedy-generation prompts (decoders)")
    con.add_argument(
        "--new-tokens",
        type=int,
        default=16,
        help="tokens generated per sample for generation checks",
    )
    con.add_argument("--min-top1", type=float, default=None, help="default 0.99")
    con.add_argument("--min-cosine", type=float, default=None, help="default 0.995")
    con.add_argument("--min-tokens", type=float, default=None, help="default 0.9")
    con.add_argument("--timeout-s", type=float, default=60.0, help="give up after this long")
    con.set_defaults(handler=_consistency)


def _recorded_npz(args: argparse.Namespace, pad_id: int, max_len: int | None, out: Path) -> Path:
    from graylane.capture.recorded import CaptureOptions, capture, write_capture
    from graylane.capture.sampling import Split
    from graylane.kafka.seam import KafkaFactory
    from graylane.settings import Settings

    factory = KafkaFactory(Settings.from_env())
    options = CaptureOptions(
        model=args.model,
        from_ms=parse_time(args.from_),
        samples=args.samples,
        split=Split.HELD_OUT,
        pad_id=pad_id,
        max_len=max_len,
        timeout_s=args.timeout_s,
    )
    columns, manifest = asyncio.run(capture(factory, factory.layout, options))
    write_capture(out, columns, manifest)
    print(f"data: {manifest.samples} held-out recorded requests from {', '.join(manifest.topics)}")
    return out


def _consistency(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from graylane.artifacts.model_info import load_header, metadata_int
    from graylane.artifacts.naming import Precision
    from graylane.builder.consistency import (
        DEFAULT_CONSISTENCY_TOLERANCE,
        ConsistencyError,
        check_consistency,
        describe,
        served_variant,
    )
    from graylane.builder.samples import SampleError
    from graylane.capture.sampling import CaptureError
    from graylane.registry.records import RegistryError
    from graylane.registry.repository import open_registry
    from graylane.settings import Settings

    settings = Settings.from_env()
    registry = open_registry(settings.db_url)
    precision = Precision(args.precision)
    try:
        store = settings.artifact_dir
        base = served_variant(registry, args.model, args.baseline, precision, store=store)
        cand = served_variant(registry, args.model, args.candidate, precision, store=store)
    except (ConsistencyError, RegistryError) as exc:
        print(f"check consistency: {exc}")
        return 2
    header = load_header(base.path)
    max_len = metadata_int(header, "max_seq_len")
    pad_id = metadata_int(header, "pad_id") or 0
    tolerance = replace(
        DEFAULT_CONSISTENCY_TOLERANCE,
        **{
            k: v
            for k, v in {
                "min_top1_agreement": args.min_top1,
                "min_cosine": args.min_cosine,
                "min_token_agreement": args.min_tokens,
            }.items()
            if v is not None
        },
    )
    with tempfile.TemporaryDirectory(prefix="graylane-check-") as tmp:
        try:
            if args.data == RECORDED:
                path = _recorded_npz(args, pad_id, max_len, Path(tmp) / "held-out.npz")
            else:
                path = Path(args.data)
            samples = _load(path, args.samples, args.batch_size, base.io, max_len)
        except (CaptureError, SampleError) as exc:
            print(f"check consistency: {exc}")
            return 2
    report = check_consistency(
        args.model,
        base,
        cand,
        samples,
        tolerance,
        prompts=args.prompts,
        new_tokens=args.new_tokens,
        pad_id=pad_id,
        max_seq_len=max_len,
    )
    for line in describe(report):
        print(line)
    return report.verdict.exit_code


def _load(
    path: Path, samples: int, batch_size: int, io: IOSignature, max_len: int | None
) -> SampleSet:
    import numpy as np

    from graylane.builder.samples import SampleError, load_samples
    from graylane.builder.spec import DataSpec, NpzData

    if not path.is_file():
        raise SampleError(f"{path} does not exist")
    with np.load(path, allow_pickle=False) as archive:
        available = min(int(archive[n].shape[0]) for n in archive.files) if archive.files else 0
    if available == 0:
        raise SampleError(f"{path} holds no samples")
    spec = DataSpec(NpzData(path), samples=min(samples, available), batch_size=batch_size)
    return load_samples(spec, io, max_len)
