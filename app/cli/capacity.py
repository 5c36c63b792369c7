"""``graylane calibrate``: measure a model version's capacity on this machine.

Every registered variant of ``--model``/``--version`` is loaded as the worker
loads it (verified artifact, ONNX Runtime) and timed per batch size; the
profile is stored under the artifact directory with this host's name (see
:mod:`graylane.capacity`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from graylane.capacity import (
    DEFAULT_BATCHES,
    CapacityProfile,
    measure_variant,
    profile_of,
    save_profile,
)
from graylane.settings import Settings

__all__ = ["calibrate_files", "ensure_calibrated", "register", "registered_variants"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cal = sub.add_parser("calibrate", help="measure a version's service time per variant and batch")
    cal.add_argument("--model", required=True, help="the model")
    cal.add_argument("--version", required=True, help="the model version")
    cal.add_argument("--seq-len", type=int, default=64, help="tokens per request measured")
    cal.add_argument(
        "--batches",
        default=",".join(map(str, DEFAULT_BATCHES)),
        help="batch sizes measured, comma-separated",
    )
    cal.add_argument("--seconds", type=float, default=2.0, help="timed seconds per point")
    cal.add_argument("--threads", type=int, default=1, help="engine intra-op threads")
    cal.set_defaults(handler=_calibrate)


def registered_variants(settings: Settings, model: str, version: str) -> dict[str, Path]:
    """Model file per precision of a registered version (verified as the worker does)."""
    from graylane.artifacts.verify import verify_artifact
    from graylane.engine_worker.loading import model_file
    from graylane.registry.repository import open_registry

    files: dict[str, Path] = {}
    for art in open_registry(settings.db_url).list_artifacts(model, version):
        folder = settings.artifact_dir / art.path  # store-relative (an absolute one as is)
        files[art.precision.value] = model_file(folder, verify_artifact(folder))
    return files


def calibrate_files(
    model: str,
    version: str,
    files: dict[str, Path],
    *,
    seq_len: int = 64,
    batches: Sequence[int] = DEFAULT_BATCHES,
    seconds: float = 2.0,
    threads: int = 1,
    progress: Callable[[str], None] = print,
) -> CapacityProfile:
    """Time every variant file with the worker's engine adapter."""
    from graylane.engine.onnxruntime import OnnxRuntimeEngine

    measured = []
    for variant, path in sorted(files.items()):
        engine = OnnxRuntimeEngine.load(path, variant, intra_op_threads=threads or None)
        try:
            cap = measure_variant(
                engine, variant, seq_len=seq_len, batches=batches, seconds_per_point=seconds
            )
        finally:
            engine.close()
        points = ", ".join(f"b{p.batch} {p.service_ms:.1f} ms ({p.rps:.0f}/s)" for p in cap.points)
        progress(f"{variant}: {points}")
        measured.append(cap)
    return profile_of(model, version, measured, threads=threads)


def _calibrate(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    files = registered_variants(settings, args.model, args.version)
    if not files:
        print(f"no registered artifacts for {args.model}/{args.version}")
        return 1
    batches = tuple(int(b) for b in args.batches.split(","))
    profile = calibrate_files(
        args.model,
        args.version,
        files,
        seq_len=args.seq_len,
        batches=batches,
        seconds=args.seconds,
        threads=args.threads,
    )
    path = save_profile(settings.artifact_dir, profile)
    print(f"stored {path} (host {profile.host})")
    print(profile.to_json())
    return 0


def ensure_calibrated(
    settings: Settings,
    model: str,
    version: str,
    files: dict[str, Path],
    *,
    seq_len: int,
    batches: Sequence[int] = DEFAULT_BATCHES,
    threads: int = 1,
    progress: Callable[[str], None] = print,
) -> CapacityProfile:
    """The stored profile when it was measured here at ``seq_len`` for every variant,
    else a fresh calibration (stored)."""
    from graylane.capacity import load_profile, this_host

    profile = load_profile(settings.artifact_dir, model, version)
    if (
        profile is not None
        and profile.host == this_host()
        and {v.variant for v in profile.variants} >= set(files)
        and all(v.seq_len == seq_len for v in profile.variants)
        and profile.threads == threads
        and all({p.batch for p in v.points} >= set(batches) for v in profile.variants)
    ):
        progress(f"capacity of {model}/{version} as calibrated on {profile.host}")
        return profile
    progress(f"calibrating {model}/{version} on this machine")
    profile = calibrate_files(
        model,
        version,
        files,
        seq_len=seq_len,
        batches=batches,
        threads=threads,
        progress=progress,
    )
    save_profile(settings.artifact_dir, profile)
    return profile
