"""``graylane model``: register models and versions, list them, show their variants."""

from __future__ import annotations

import argparse
from typing import Any

from graylane.app.cli.controlplane_calls import Sub, call, client_args
from graylane.app.cli.views import OutputFormat, add_output, emit_list, output_format, table, when

__all__ = ["register"]


def register(sub: Sub) -> None:
    """``model register|list|set-stable|show``."""
    _model_commands(sub)


def _model_commands(sub: Sub) -> None:
    model = sub.add_parser("model", help="the model registry")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    reg = client_args(
        msub.add_parser("register", help="register a model (and optionally a version)")
    )
    reg.add_argument("name", help="the model's name")
    reg.add_argument("--description", default="", help="one line about the model")
    reg.add_argument("--version", help="also register this semantic version")
    reg.add_argument("--sha256", default="", help="sha256 of the version's source model")
    reg.add_argument("--stable", action="store_true", help="make --version the stable version")
    reg.set_defaults(handler=model_register)
    listing = add_output(client_args(msub.add_parser("list", help="registered models")))
    listing.set_defaults(handler=model_list)
    stable = client_args(
        msub.add_parser("set-stable", help="make a registered version the stable one")
    )
    stable.add_argument("name", help="the model's name")
    stable.add_argument("--version", required=True, help="a registered semantic version")
    stable.set_defaults(handler=model_set_stable)
    show = add_output(
        client_args(
            msub.add_parser(
                "show", help="versions, variants (backend, endpoint) and their validation"
            )
        )
    )
    show.add_argument("name", help="the model's name")
    show.set_defaults(handler=model_show)


def model_register(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    m = call(
        args,
        "ModelRegistry",
        "RegisterModel",
        pb.RegisterModelRequest(name=args.name, description=args.description),
    )
    print(f"model {m.name} registered")
    if args.stable and not args.version:
        raise SystemExit("--stable needs --version")
    if args.version:
        # A version the builder registered already is fine when it is made stable.
        v = call(
            args,
            "ModelRegistry",
            "RegisterVersion",
            pb.RegisterVersionRequest(
                model=args.name, version=args.version, source_sha256=args.sha256
            ),
            tolerate=("ALREADY_EXISTS",) if args.stable else (),
        )
        print(f"version {args.version} " + ("registered" if v else "was registered already"))
    if args.stable:
        _set_stable(args, args.name, args.version)
    return 0


def model_set_stable(args: argparse.Namespace) -> int:
    _set_stable(args, args.name, args.version)
    return 0


def _set_stable(args: argparse.Namespace, model: str, version: str) -> None:
    from graylane.v1 import controlplane_pb2 as pb

    call(args, "ModelRegistry", "SetStable", pb.SetStableRequest(model=model, version=version))
    print(f"{version} is now the stable version of {model}")


def model_list(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(args, "ModelRegistry", "ListModels", pb.ListModelsRequest())
    emit_list(
        args,
        "ModelList",
        res.models,
        lambda m: m.name,
        lambda: table(
            "models",
            ("model", "stable", "description", "created"),
            [
                (m.name, m.stable_version or "-", m.description, when(m.created_at_unix_ms))
                for m in res.models
            ],
        ),
    )
    return 0


def model_show(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(args, "ModelRegistry", "ListVersions", pb.ListVersionsRequest(model=args.name))
    if output_format(args) is not OutputFormat.TABLE:
        emit_list(args, "ModelVersionList", res.versions, lambda v: v.version, lambda: None)
        return 0
    rows: list[tuple[str, ...]] = []
    for v in res.versions:
        version = (v.version, "*" if v.stable else "", v.status)
        if not v.variants:
            rows.append((*version, "-", "-", "-", "-", "-", "-", "-"))
        rows.extend((*version, *_variant_columns(a)) for a in v.variants)
    table(
        f"{res.model.name} (stable {res.model.stable_version or '-'})",
        (
            *("version", "stable", "status", "variant", "backend", "servable", "validation"),
            *("endpoint", "model sha256", "quality (95 % interval), cost vs reference"),
        ),
        rows,
    )
    return 0


def rung_quality_text(a: Any) -> str:
    """``0.475 (0.330..0.620), cost +0.144 vs f16 0.619 on smollm2-basic`` or ``unmeasured``."""
    if not a.HasField("quality"):
        return "unmeasured"
    q = a.quality
    cost = q.reference_score - q.score
    return (
        f"{q.score:.3f} ({q.ci_low:.3f}..{q.ci_high:.3f}), cost {cost:+.3f} vs "
        f"{q.reference_precision} {q.reference_score:.3f} on {q.set_name}"
    )


def _variant_columns(a: Any) -> tuple[str, ...]:
    """A ``VariantInfo``'s columns after the version's: variant to model digest."""
    val = a.validation
    check = (
        ("passed" if val.passed else "FAILED: " + "; ".join(val.failures))
        if val.validated
        else "not validated"
    )
    backend = f"{a.backend} {a.backend_version}".strip()
    endpoint, digest = "-", "-"
    if a.HasField("endpoint"):
        endpoint = a.endpoint.url
        digest = a.endpoint.model_sha256[:12] + "…" if a.endpoint.model_sha256 else "unknown"
    return (
        a.artifact,
        backend,
        "yes" if a.servable else "no",
        check,
        endpoint,
        digest,
        rung_quality_text(a),
    )
