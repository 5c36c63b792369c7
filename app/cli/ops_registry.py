"""``graylane model ...``: register models and versions, list them, show their variants."""

from __future__ import annotations

import argparse

from graylane.app.cli.ops_client import call
from graylane.app.cli.ops_views import table, when

__all__ = ["model_list", "model_register", "model_set_stable", "model_show"]


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
    table(
        "models",
        ("model", "stable", "description", "created"),
        [
            (m.name, m.stable_version or "-", m.description, when(m.created_at_unix_ms))
            for m in res.models
        ],
    )
    return 0


def model_show(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(args, "ModelRegistry", "ListVersions", pb.ListVersionsRequest(model=args.name))
    rows = []
    for v in res.versions:
        variants = v.variants or [None]
        for a in variants:
            if a is None:
                rows.append((v.version, "*" if v.stable else "", v.status, "-", "-", "-"))
                continue
            val = a.validation
            check = (
                ("passed" if val.passed else "FAILED: " + "; ".join(val.failures))
                if val.validated
                else "not validated"
            )
            rows.append(
                (
                    v.version,
                    "*" if v.stable else "",
                    v.status,
                    a.artifact,
                    "yes" if a.servable else "no",
                    check,
                )
            )
    table(
        f"{res.model.name} (stable {res.model.stable_version or '-'})",
        ("version", "stable", "status", "variant", "servable", "validation"),
        rows,
    )
    return 0
