"""Render a kustomization without the kustomize binary (the subset deploy/k8s uses).

Supported: ``resources`` (files and folders with a kustomization), ``components``
(folders whose kustomization is a ``Component`` of ``resources`` and ``patches``, applied
after the resources and before the kustomization's own patches, as kustomize does),
``namespace``, ``images`` (name -> newName/newTag) and ``patches`` given by ``path``: a
strategic-merge patch that names its target by kind and metadata.name. Maps merge key by
key, lists of maps with a ``name`` merge by name, any other list is replaced. Anything
else in a kustomization is refused, so a new feature cannot pass the tests unrendered.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]
SUPPORTED_KEYS = frozenset(
    {"apiVersion", "kind", "resources", "components", "namespace", "images", "patches"}
)
COMPONENT_KEYS = frozenset({"apiVersion", "kind", "resources", "patches"})
CLUSTER_SCOPED = frozenset({"Namespace"})


class RenderError(ValueError):
    """The kustomization uses something this renderer does not do, or a patch misses."""


def load_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out_list = [copy.deepcopy(item) for item in base]
        index = {item["name"]: i for i, item in enumerate(out_list)}
        for item in patch:
            if item["name"] in index:
                out_list[index[item["name"]]] = merge(out_list[index[item["name"]]], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def _containers(doc: Doc) -> list[Doc]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _resources(folder: Path, kust: Doc) -> list[Doc]:
    docs: list[Doc] = []
    for entry in kust.get("resources", []):
        path = (folder / entry).resolve()
        docs += render(path) if path.is_dir() else load_docs(path)
    return docs


def _patch(folder: Path, kust: Doc, docs: list[Doc]) -> None:
    for patch_entry in kust.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise RenderError(f"{folder}: only path patches are supported: {patch_entry}")
        (patch,) = load_docs(folder / patch_entry["path"])
        key = (patch["kind"], patch["metadata"]["name"])
        hits = [i for i, d in enumerate(docs) if (d["kind"], d["metadata"]["name"]) == key]
        if len(hits) != 1:
            raise RenderError(f"{folder}: patch {patch_entry['path']} matches {len(hits)} objects")
        docs[hits[0]] = merge(docs[hits[0]], patch)


def render(folder: Path) -> list[Doc]:
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kust) - SUPPORTED_KEYS
    if unknown:
        raise RenderError(f"{folder}: unsupported kustomization keys {sorted(unknown)}")
    if kust.get("kind", "Kustomization") != "Kustomization":
        raise RenderError(f"{folder}: a {kust['kind']} is rendered only as a component")
    docs = _resources(folder, kust)
    for entry in kust.get("components", []):
        component = (folder / entry).resolve()
        comp = yaml.safe_load((component / "kustomization.yaml").read_text())
        if comp.get("kind") != "Component" or set(comp) - COMPONENT_KEYS:
            raise RenderError(f"{component}: a Component of resources and patches only")
        docs += _resources(component, comp)
        _patch(component, comp, docs)
    _patch(folder, kust, docs)
    for image in kust.get("images", []):
        for doc in docs:
            for container in _containers(doc):
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    if "namespace" in kust:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = kust["namespace"]
    return docs
