"""The ``graylane build``, ``graylane verify-artifact`` and ``graylane keys`` commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from graylane.builder.build import BuildReport

__all__ = [
    "add_build_parser",
    "add_keys_parser",
    "add_verify_parser",
    "cmd_build",
    "cmd_keys_generate",
    "cmd_verify",
    "register",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_NOT_SERVABLE = 2

Subparsers = argparse._SubParsersAction


def register(sub: Subparsers[argparse.ArgumentParser]) -> None:
    """Mount the builder's subcommands on the ``graylane`` CLI."""
    add_build_parser(sub)
    add_verify_parser(sub)
    add_keys_parser(sub)


def add_build_parser(sub: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "build",
        help="build precision variants of a model from a spec, validate and register them",
        description=(
            "Read a YAML/TOML build spec, produce fp32/fp16/int8/int8-dynamic ONNX variants "
            "(and TensorRT engines where TensorRT and a GPU exist), validate each against "
            "fp32, write artifacts with manifests and record them in the registry. A spec "
            "with an 'engine' section instead of 'source' registers a version engine servers "
            "serve: one manifest per endpoint, no model file copied. "
            "Exit status: 0 all variants servable (skipped ones aside), 2 some variant failed "
            "or is not servable (an ONNX build is then not registered; an engine build "
            "registers the endpoints that answered their probe), 1 the build could not run."
        ),
    )
    parser.add_argument("spec", type=Path, help="build spec (.yaml, .yml or .toml)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace existing artifacts and mark variants outside tolerance servable (recorded)",
    )
    parser.add_argument(
        "--store",
        type=Path,
        help="artifact store folder (default: spec, then GRAYLANE_ARTIFACT_DIR)",
    )
    parser.add_argument("--db", help="registry database URL (default: GRAYLANE_DB_URL)")
    parser.add_argument("--no-registry", action="store_true", help="do not touch the registry")
    parser.add_argument("--json", action="store_true", help="print the report as JSON at the end")
    parser.add_argument(
        "--signing-key",
        type=Path,
        help="sign every published artifact with this private key "
        "(default: GRAYLANE_SIGNING_KEY; none: unsigned); see 'graylane keys generate'",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        default=None,
        help="engine specs: check that each endpoint answers /health and /v1/models before "
        "registering it (as 'engine.probe: true'); one that does not is left out, exit 2",
    )
    parser.set_defaults(handler=cmd_build)
    return parser


def add_verify_parser(sub: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "verify-artifact", help="check every file of an artifact against its manifest's sha256"
    )
    parser.add_argument("folder", type=Path, help="artifact folder (holds manifest.json)")
    parser.add_argument(
        "--trust-key",
        type=Path,
        action="append",
        default=[],
        help="also check the artifact's signature against this public key (repeatable)",
    )
    parser.set_defaults(handler=cmd_verify)
    return parser


def add_keys_parser(sub: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = sub.add_parser("keys", help="key pairs that sign model artifacts")
    actions = parser.add_subparsers(dest="keys_command", required=True)
    generate = actions.add_parser(
        "generate",
        help="write a new offline signing key pair (P-256 PEM)",
        description=(
            "Write a private key (mode 0600) for 'graylane build --signing-key' and its "
            "public key for 'graylane serve worker --trust-key'. Existing files are kept."
        ),
    )
    generate.add_argument("private_key", type=Path, help="where to write the private key")
    generate.add_argument(
        "--public-key", type=Path, help="where to write the public key (default: PRIVATE.pub)"
    )
    generate.set_defaults(handler=cmd_keys_generate)
    return parser


def cmd_keys_generate(args: argparse.Namespace) -> int:
    from graylane.artifacts.signing import generate_key_pair

    try:
        pair = generate_key_pair(args.private_key, args.public_key)
    except FileExistsError as exc:
        print(f"error: {exc}")
        return EXIT_ERROR
    print(f"private key: {pair.private_key} (keep it with the builder)")
    print(f"public key:  {pair.public_key} (give it to workers: --trust-key)")
    return EXIT_OK


def cmd_build(args: argparse.Namespace) -> int:
    from rich.console import Console

    from graylane.builder.build import BuildError, run_build
    from graylane.builder.calibration import CalibrationError
    from graylane.builder.progress import RichProgress
    from graylane.builder.samples import SampleError
    from graylane.builder.spec import SpecError, load_spec
    from graylane.builder.store import StoreError
    from graylane.registry.records import RegistryError
    from graylane.registry.repository import open_registry
    from graylane.settings import Settings

    console = Console(stderr=True)
    settings = Settings.from_env()
    try:
        spec = load_spec(args.spec)
        store = args.store or spec.store or settings.artifact_dir
        registry = None if args.no_registry else open_registry(args.db or settings.db_url)
        report = run_build(
            spec,
            RichProgress(console),
            store=store,
            registry=registry,
            force=True if args.force else None,
            signing_key=args.signing_key or settings.signing_key,
            probe=args.probe,
        )
    except (
        SpecError,
        SampleError,
        BuildError,
        StoreError,
        RegistryError,
        CalibrationError,
    ) as exc:
        console.print(f"[red]build failed:[/] {exc}", highlight=False)
        return EXIT_ERROR
    _print_report(console, report)
    if args.json:
        print(json.dumps(_report_dict(report)))
    return EXIT_OK if report.ok else EXIT_NOT_SERVABLE


def cmd_verify(args: argparse.Namespace) -> int:
    from graylane.artifacts.signing import ArtifactSignatureError, TrustedKeyError, verify_signature
    from graylane.artifacts.verify import TamperedArtifactError, verify_artifact

    try:
        manifest = verify_artifact(args.folder)
        signer = verify_signature(args.folder, args.trust_key) if args.trust_key else None
    except (TamperedArtifactError, ArtifactSignatureError, TrustedKeyError) as exc:
        print(f"REFUSED: {exc}")
        return EXIT_ERROR
    signed = f"; signed by {signer}" if signer is not None else ""
    if manifest.endpoint is not None:
        held = f"a manifest naming {manifest.backend.value} at {manifest.endpoint.url}"
    else:
        held = f"{len(manifest.files)} file(s) match their sha256"
    print(f"OK: {manifest.name} ({held}{signed})")
    return EXIT_OK


def _print_report(console: Console, report: BuildReport) -> None:
    from rich.table import Table

    table = Table(title=f"{report.model} {report.version} ({report.duration_s:.1f}s)")
    table.add_column("artifact", overflow="fold")
    for column in ("status", "servable", "cosine", "top1", "tokens"):
        table.add_column(column, no_wrap=True)
    table.add_column("note", overflow="fold")
    for v in report.variants:
        metrics = v.validation.metrics if v.validation else None
        note = v.reason or ""
        if v.validation is not None and v.validation.failures:
            note = "; ".join(v.validation.failures)
        if v.forced:
            note = ("forced: " + note).strip()
        if v.endpoint is not None:
            probed = "answered its probe" if v.endpoint.probe is not None else "not probed"
            note = f"{v.endpoint.url} ({probed})"
            if v.quality is not None:
                note += (
                    f"; score {v.quality.score:.3f}, cost {v.quality.quality_drop:+.3f} vs "
                    f"{v.quality.reference_precision.value}"
                )
            elif v.reason:
                note = v.reason
        table.add_row(
            str(v.artifact) if v.artifact else f"{v.precision.value} ({v.backend.value})",
            v.status.value,
            "yes" if v.servable else "no",
            f"{metrics.cosine:.5f}" if metrics else "-",
            f"{metrics.top1_agreement:.3f}" if metrics else "-",
            f"{metrics.token_agreement:.2f}"
            if metrics and metrics.token_agreement is not None
            else "-",
            note,
        )
    console.print(table)
    for note in report.notes:
        console.print(note, highlight=False)
    if report.tensorrt_note:
        console.print(report.tensorrt_note, highlight=False)
    console.print(f"artifacts: {report.store}", highlight=False)


def _report_dict(report: BuildReport) -> dict[str, object]:
    return {
        "model": report.model,
        "version": report.version,
        "ok": report.ok,
        "tensorrt": report.tensorrt_note,
        "registered": report.registered,
        "model_info": None if report.model_info is None else report.model_info.to_dict(),
        "notes": list(report.notes),
        "variants": [
            {
                "precision": v.precision.value,
                "backend": v.backend.value,
                "status": v.status.value,
                "artifact": str(v.artifact) if v.artifact else None,
                "folder": str(v.folder) if v.folder else None,
                "servable": v.servable,
                "forced": v.forced,
                "reason": v.reason,
                "passed": v.validation.passed if v.validation else None,
                "endpoint": None if v.endpoint is None else v.endpoint.url,
                "quality": None
                if v.quality is None
                else {
                    "score": round(v.quality.score, 4),
                    "ci": [round(v.quality.ci_low, 4), round(v.quality.ci_high, 4)],
                    "drop": round(v.quality.quality_drop, 4),
                    "reference": v.quality.reference_precision.value,
                    "set": v.quality.set_name,
                },
            }
            for v in report.variants
        ],
    }
