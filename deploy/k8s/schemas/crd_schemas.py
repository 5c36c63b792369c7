#!/usr/bin/env python3
"""Extract the CRD schemas kept in this folder from the Go modules that ship the CRDs.

Usage::

    python deploy/k8s/schemas/crd_schemas.py   # go mod download each module, rewrite the JSON

Each ``<group>_<plural>.<version>.json`` holds ``group``, ``version``, ``kind`` and the
``openAPIV3Schema`` of one served CRD version, taken from the module's CRD YAML (the Go
module proxy serves the modules; no other network access is needed). Bump a version below
when the cluster's KEDA, Prometheus Operator or cert-manager is upgraded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CRD_SOURCES", "CrdSource", "extract", "main"]

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, kw_only=True)
class CrdSource:
    """CRD YAML files inside one Go module version."""

    module: str
    version: str
    files: tuple[str, ...]
    only: tuple[str, ...] = ()
    """CRD names to keep from files that hold several (empty: every CRD)."""


CRD_SOURCES = (
    CrdSource(
        module="github.com/kedacore/keda/v2",
        version="v2.20.2",
        files=(
            "config/crd/bases/keda.sh_scaledobjects.yaml",
            "config/crd/bases/keda.sh_triggerauthentications.yaml",
        ),
    ),
    CrdSource(
        module="github.com/prometheus-operator/prometheus-operator",
        version="v0.85.0",
        files=(
            "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        ),
    ),
    CrdSource(
        module="github.com/cert-manager/cert-manager",
        version="v1.16.2",
        files=("deploy/crds/crd-certificates.yaml",),
    ),
    CrdSource(
        module="github.com/argoproj/argo-rollouts",
        version="v1.8.3",
        files=("manifests/crds/analysis-template-crd.yaml",),
    ),
    CrdSource(
        module="github.com/fluxcd/flagger",
        version="v1.41.0",
        files=("artifacts/flagger/crd.yaml",),
        only=("canaries.flagger.app",),
    ),
)


def _module_dir(source: CrdSource) -> Path:
    go = os.environ.get("GO", "go")
    res = subprocess.run(
        [go, "mod", "download", "-json", f"{source.module}@{source.version}"],
        capture_output=True,
        text=True,
        check=False,
    )
    info = json.loads(res.stdout or "{}")
    if res.returncode != 0 or "Dir" not in info:
        raise SystemExit(f"go mod download {source.module}@{source.version}: {info or res.stderr}")
    return Path(info["Dir"])


def extract(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``file name -> schema document`` for each served version of one CRD."""
    spec = crd["spec"]
    out: dict[str, dict[str, Any]] = {}
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        name = f"{spec['group']}_{spec['names']['plural']}.{version['name']}.json"
        out[name] = {
            "group": spec["group"],
            "version": version["name"],
            "kind": spec["names"]["kind"],
            "openAPIV3Schema": version["schema"]["openAPIV3Schema"],
        }
    return out


def main() -> int:
    for source in CRD_SOURCES:
        root = _module_dir(source)
        for rel in source.files:
            for crd in yaml.safe_load_all((root / rel).read_text()):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                if source.only and crd["metadata"]["name"] not in source.only:
                    continue
                for name, doc in extract(crd).items():
                    (HERE / name).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
                    print(f"[crd] {source.module}@{source.version} {rel} -> {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
