"""``graylane model ...``: register models and versions, list them, show their variants."""

from __future__ import annotations

import argparse

from graylane.app.cli.ops_client import call
from graylane.app.cli.ops_views import table, when

__all__ = ["model_list", "model_register", "model_show"]


def model_register(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    m = call(
        args,
        "ModelRegistry",
        "RegisterModel",
        pb.RegisterModelRequest(name=args.name, description=args.description),
    )
    print(f"model {m.name} registered")
    if args.version:
        v = call(
            args,
            "ModelRegistry",
            "RegisterVersion",
            pb.RegisterVersionRequest(
                model=args.name, version=args.version, source_sha256=args.sha256
            ),
        )
        print(f"version {v.version} registered")
    if args.stable:
        if not args.version:
            raise SystemExit("--stable needs --version")
        call(
            args,
            "ModelRegistry",
            "SetStable",
            pb.SetStableRequest(model=args.name, version=args.version),
        )
        print(f"{args.version} is now the stable version of {args.name}")
    return 0


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
