"""Offline validation of rendered manifests, shared by the kustomize and Helm tests.

Kubernetes kinds against the Kubernetes JSON schemas (kubernetes-validate, strict: unknown
fields fail); CRD kinds (KEDA, Prometheus Operator) against the schemas kept in
deploy/k8s/schemas, with unknown fields refused as the API server would prune them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "deploy" / "k8s" / "schemas"
KUBERNETES_VERSION = "1.31"


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for path in SCHEMAS.glob("*.json"):
        crd = json.loads(path.read_text())
        schemas[(f"{crd['group']}/{crd['version']}", crd["kind"])] = crd["openAPIV3Schema"]
    return schemas


CRDS = _crd_schemas()


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields a structural schema does not declare (the API server would drop them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                found += unknown_fields(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += unknown_fields(item, extra, f"{path}.{key}")
            elif props is not None and path != ".metadata":
                found.append(f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def validate_crd(doc: dict[str, Any], schema: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``doc`` breaks its CRD schema.

    The schema itself is not checked against the JSON Schema metaschema: CRD patterns are Go
    regular expressions (``^(?i)...``), which Python's ``re`` refuses to compile up front.
    """
    jsonschema.validators.validator_for(schema)(schema).validate(doc)


def validate(doc: dict[str, Any]) -> None:
    """Validate one rendered object; raises on an invalid or undeclared field."""
    key = (doc["apiVersion"], doc["kind"])
    if key in CRDS:
        validate_crd(doc, CRDS[key])
        unknown = unknown_fields(doc, CRDS[key])
        if unknown:
            raise jsonschema.ValidationError(f"fields the CRD does not declare: {unknown}")
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
