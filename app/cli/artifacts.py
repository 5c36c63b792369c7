"""``graylane artifacts fetch``: a version's artifacts from the artifact store, verified.

Run by a worker pod's init container to fill the worker's artifact folder (an
``emptyDir``); exits non-zero with the reason when a version is unknown, the store
cannot be read, or an artifact's sha256 or signature does not verify.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from graylane.artifacts.naming import Backend

if TYPE_CHECKING:
    from graylane.artifacts.fetch import FetchGpu

__all__ = ["ARTIFACT_STORE_ENV", "EXIT_ERROR", "EXIT_OK", "register"]

EXIT_OK = 0
EXIT_ERROR = 1

ARTIFACT_STORE_ENV = "GRAYLANE_ARTIFACT_STORE"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    artifacts = sub.add_parser("artifacts", help="model artifacts in the artifact store")
    asub = artifacts.add_subparsers(dest="artifacts_command", metavar="ACTION", required=True)
    fetch = asub.add_parser(
        "fetch",
        help="copy a version's servable artifacts from the store into a folder and verify them",
    )
    fetch.add_argument("--model", required=True, help="the model")
    fetch.add_argument("--version", required=True, help="the model version")
    fetch.add_argument(
        "--store",
        default=os.environ.get(ARTIFACT_STORE_ENV),
        help="artifact store URL (fsspec: file://, a path, s3://...; "
        f"default: {ARTIFACT_STORE_ENV})",
    )
    fetch.add_argument(
        "--into", type=Path, required=True, help="folder to fetch into (the worker's artifact dir)"
    )
    fetch.add_argument("--db", help="registry database URL (default: GRAYLANE_DB_URL)")
    fetch.add_argument(
        "--trust-key",
        type=Path,
        action="append",
        default=[],
        help="verify signatures against this public key (repeatable; "
        "default: GRAYLANE_TRUSTED_KEYS; none: signatures not checked)",
    )
    fetch.add_argument(
        "--require-signatures",
        action="store_true",
        default=None,
        help="fail closed: refuse to fetch anything when no trusted key is found, instead "
        "of fetching unchecked (default: GRAYLANE_REQUIRE_SIGNATURES)",
    )
    fetch.add_argument(
        "--backend",
        action="append",
        default=[],
        choices=[b.value for b in Backend],
        help="fetch only this backend's artifacts (repeatable; default: all). A CPU worker "
        "needs no TensorRT engine; what is left out is recorded for the worker's loader. "
        "An engine server's variant (llamacpp, vllm, trtllm, sglang) is its manifest alone",
    )
    fetch.add_argument(
        "--this-gpu",
        action="store_true",
        help="of the TensorRT engines, fetch only the one per precision the worker loads on "
        "the GPU this container sees (give the init container the pod's GPU)",
    )
    fetch.set_defaults(handler=_fetch)


def _fetch(args: argparse.Namespace) -> int:
    from graylane.artifacts.fetch import ArtifactFetchError, fetch_version
    from graylane.settings import Settings

    if not args.store:
        print(f"error: no artifact store: pass --store or set {ARTIFACT_STORE_ENV}")
        return EXIT_ERROR
    gpu = None
    if args.this_gpu:
        gpu = _this_gpu()
        if gpu is None:
            print("error: --this-gpu: no GPU with TensorRT is visible to this container")
            return EXIT_ERROR
    settings = Settings.from_env()
    keys = tuple(args.trust_key) or settings.trusted_keys
    required = settings.require_signatures if args.require_signatures is None else True
    keys_from = " ".join(f"--trust-key {k}" for k in args.trust_key)
    try:
        fetched = fetch_version(
            args.db or settings.db_url,
            args.model,
            args.version,
            store=args.store,
            into=args.into,
            trusted_keys=keys,
            backends=frozenset(Backend(b) for b in args.backend),
            gpu=gpu,
            require_signatures=required,
            keys_from=keys_from or settings.trusted_keys_source,
        )
    except ArtifactFetchError as exc:
        print(f"error: {exc}")
        return EXIT_ERROR
    if not keys:
        print("warning: no trusted keys configured: signatures were not checked")
    for item in fetched:
        signed = f", signed by {item.signer}" if item.signer is not None else ""
        held = f"{item.files} file(s)"
        if item.endpoint is not None:
            held = f"its manifest only: served at {item.endpoint}"
        print(f"fetched {item.name}: {args.into / item.location} ({held}{signed})")
    return EXIT_OK


def _this_gpu() -> FetchGpu | None:
    """The GPU this container sees, as the worker's loader would (None: no GPU/TensorRT)."""
    from graylane.artifacts.fetch import FetchGpu
    from graylane.engine.tensorrt import gpu_compute_capability, tensorrt_version

    cc, trt = gpu_compute_capability(), tensorrt_version()
    if cc is None or trt is None:
        return None
    return FetchGpu(f"{cc[0]}.{cc[1]}", trt)
