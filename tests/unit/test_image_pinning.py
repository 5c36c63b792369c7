"""Pinning the built image by digest in a kustomization: the entry replaced or added, the
rest of the file (comments, other images) as written, and the real kustomize renders it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from graylane.deploy.containers.pinning import LOCAL_KUSTOMIZATION, ImagePin, pin_image, write_pin
from graylane.deploy.containers.tools import KUSTOMIZE

DIGEST = "sha256:" + "ab" * 32
PIN = ImagePin(name="graylane", new_name="localhost/graylane", digest=DIGEST)


def test_the_local_overlays_entry_is_replaced_and_the_rest_kept() -> None:
    text = LOCAL_KUSTOMIZATION.read_text()
    pinned = pin_image(text, PIN)
    doc = yaml.safe_load(pinned)
    assert doc["images"] == [
        {"name": "graylane", "newName": "localhost/graylane", "digest": DIGEST}
    ]
    before = yaml.safe_load(text)
    assert {k: v for k, v in doc.items() if k != "images"} == {
        k: v for k, v in before.items() if k != "images"
    }
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert comments and comments == [line for line in pinned.splitlines() if line.startswith("#")]
    assert pin_image(pinned, PIN) == pinned  # pinning again changes nothing


def test_other_images_stay_and_a_missing_entry_or_list_is_added() -> None:
    text = "resources:\n  - a.yaml\nimages:\n  - name: other\n    newTag: '1'\npatches: []\n"
    doc = yaml.safe_load(pin_image(text, PIN))
    assert doc["images"] == [
        {"name": "other", "newTag": "1"},
        {"name": "graylane", "newName": "localhost/graylane", "digest": DIGEST},
    ]
    assert doc["patches"] == [] and doc["resources"] == ["a.yaml"]
    doc = yaml.safe_load(pin_image("resources:\n  - a.yaml\n", PIN))
    assert doc["images"] == [
        {"name": "graylane", "newName": "localhost/graylane", "digest": DIGEST}
    ]


def test_a_digest_that_is_not_sha256_is_refused() -> None:
    with pytest.raises(ValueError):
        ImagePin(name="graylane", new_name="localhost/graylane", digest="latest")


def test_kustomize_renders_every_pod_by_digest(tmp_path: Path) -> None:
    overlay = tmp_path / "local"
    overlay.mkdir()
    for path in LOCAL_KUSTOMIZATION.parent.iterdir():
        (overlay / path.name).write_text(path.read_text())
    kustomization = overlay / "kustomization.yaml"
    text = kustomization.read_text().replace(
        "../../base", os.path.relpath(LOCAL_KUSTOMIZATION.parents[2] / "base", overlay)
    )
    kustomization.write_text(text)
    write_pin(PIN, kustomization)
    out = KUSTOMIZE.run("build", "--load-restrictor", "LoadRestrictionsNone", str(overlay))
    images = {
        c["image"]
        for d in yaml.safe_load_all(out)
        if d and d["kind"] in ("Deployment", "Job")
        for c in [
            *d["spec"]["template"]["spec"].get("initContainers", []),
            *d["spec"]["template"]["spec"]["containers"],
        ]
    }
    assert images == {f"localhost/graylane@{DIGEST}"}
