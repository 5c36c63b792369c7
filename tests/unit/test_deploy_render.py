"""``graylane deploy render``: a registered version's worker manifests, validated offline
like deploy/k8s (Kubernetes JSON schemas, the KEDA CRD schema) and shaped like the
checked-in workers."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from graylane.app.cli.main import main
from graylane.artifacts.naming import ArtifactName, Backend, Precision, parse_artifact_name
from graylane.artifacts.naming import parse_semver as semver
from graylane.registry.records import ArtifactRecord
from graylane.registry.repository import open_registry
from tests.unit.k8s_render import load_docs, render
from tests.unit.test_k8s_manifests import CRDS, K8S, KUBERNETES_VERSION, unknown_fields

MODEL = "demo-gpt"


def _artifact(
    version: str, backend: Backend, precision: Precision, cc: str | None, servable: bool = True
) -> ArtifactRecord:
    backend_version = "10.7.0" if backend is Backend.TENSORRT else "1.32.0"
    return ArtifactRecord(
        name=ArtifactName(MODEL, backend, backend_version, precision, "ptq", semver(version)),
        path="/models/x",
        manifest_sha256="f" * 64,
        servable=servable,
        gpu_compute_capability=cc,
    )


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = open_registry(url)
    registry.register_model(MODEL)
    for v in ("1.0.0", "1.1.0"):
        registry.register_version(MODEL, v, "a" * 64)
    for record in (
        _artifact("1.0.0", Backend.ONNXRUNTIME, Precision.FP32, None),
        _artifact("1.1.0", Backend.ONNXRUNTIME, Precision.FP32, None),
        _artifact("1.1.0", Backend.ONNXRUNTIME, Precision.INT8_DYNAMIC, None),
        _artifact("1.1.0", Backend.ONNXRUNTIME, Precision.INT8, None, servable=False),
        _artifact("1.1.0", Backend.TENSORRT, Precision.FP16, "8.9"),
        _artifact("1.1.0", Backend.TENSORRT, Precision.INT8, "8.9"),
    ):
        registry.add_artifact(record)
    registry.engine.dispose()
    monkeypatch.setenv("GRAYLANE_DB_URL", url)
    monkeypatch.setenv("GRAYLANE_PARTITIONS", "6")
    return url


def _render(out: Path, version: str, *extra: str) -> list[dict]:  # type: ignore[type-arg]
    assert (
        main(
            ["deploy", "render", "--model", MODEL, "--version", version, "--out", str(out), *extra]
        )
        == 0
    )
    (path,) = out.glob("*.yaml")
    return load_docs(path)


def _valid(doc: dict) -> None:  # type: ignore[type-arg]
    key = (doc["apiVersion"], doc["kind"])
    if key in CRDS:
        jsonschema.validate(doc, CRDS[key])
        assert unknown_fields(doc, CRDS[key]) == []
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_cpu_render_matches_the_checked_in_worker_but_for_its_image(
    db: str, tmp_path: Path
) -> None:
    docs = _render(tmp_path / "cpu", "1.0.0")
    assert [d["kind"] for d in docs] == ["Deployment", "ScaledObject", "PodDisruptionBudget"]
    for doc in docs:
        _valid(doc)
        assert doc["metadata"]["namespace"] == "graylane"
        assert doc["metadata"]["name"] == "worker-demo-gpt-1-0-0"
    checked_in = {d["kind"]: d for d in load_docs(K8S / "base" / "worker-demo-gpt-1-0-0.yaml")}
    deploy = docs[0]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    image = parse_artifact_name(container["image"].rsplit("/", 1)[1])
    assert (image.backend, image.precision, str(image.version)) == (
        Backend.ONNXRUNTIME,
        Precision.FP32,
        "1.0.0",
    )
    (init,) = deploy["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == container["image"]  # the init container runs the worker's image
    container["image"] = init["image"] = "graylane:0.1.0"
    assert deploy["spec"]["template"] == checked_in["Deployment"]["spec"]["template"]
    assert deploy["spec"]["selector"] == checked_in["Deployment"]["spec"]["selector"]
    assert docs[1]["spec"] == checked_in["ScaledObject"]["spec"]
    assert docs[2]["spec"] == checked_in["PodDisruptionBudget"]["spec"]


def test_gpu_render_is_one_deployment_on_every_capability_an_engine_was_built_for(
    db: str, tmp_path: Path
) -> None:
    registry = open_registry(db)
    registry.add_artifact(_artifact("1.1.0", Backend.TENSORRT, Precision.FP16, "9.0"))
    registry.engine.dispose()
    docs = _render(tmp_path / "gpu", "1.1.0", "--gpu", "--max-replicas", "3")
    for doc in docs:
        _valid(doc)
    deploy, scaled, budget = docs
    assert deploy["metadata"]["name"] == "worker-demo-gpt-1-1-0"
    assert (
        deploy["metadata"]["annotations"]["graylane.io/variants"] == "fp16,fp32,int8,int8-dynamic"
    )
    pod = deploy["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [
        [(e["key"], e["operator"], e["values"]) for e in t["matchExpressions"]]
        for t in terms["nodeSelectorTerms"]
    ] == [
        [
            ("nvidia.com/gpu.compute.major", "In", ["9"]),
            ("nvidia.com/gpu.compute.minor", "In", ["0"]),
        ],
        [
            ("nvidia.com/gpu.compute.major", "In", ["8"]),
            ("nvidia.com/gpu.compute.minor", "In", ["9"]),
        ],
    ]
    (container,) = pod["containers"]
    assert container["command"][-1] == "--require-tensorrt"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["image"] == "ghcr.io/graylane/demo-gpt-tensorrt10.7.0-fp16-ptq:1.1.0"
    assert [c["image"] for c in pod["initContainers"]] == [container["image"]]
    (init,) = pod["initContainers"]  # it sees the pod's GPU to fetch the engine for it
    assert init["command"][-1] == "--this-gpu"
    assert init["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert scaled["spec"]["maxReplicaCount"] == 3
    kafka = scaled["spec"]["triggers"][0]["metadata"]
    assert kafka["topic"] == "graylane.requests.demo-gpt.1.1.0"
    assert kafka["consumerGroup"] == "graylane-worker-demo-gpt-1.1.0"
    assert budget["spec"]["selector"] == deploy["spec"]["selector"]


def test_gpu_render_matches_the_checked_in_gpu_worker(db: str, tmp_path: Path) -> None:
    registry = open_registry(db)
    registry.add_artifact(_artifact("1.1.0", Backend.TENSORRT, Precision.FP16, "9.0"))
    registry.engine.dispose()
    deploy = _render(tmp_path / "gpu", "1.1.0", "--gpu")[0]
    checked_in = {(d["kind"], d["metadata"]["name"]): d for d in render(K8S / "overlays" / "gpu")}[
        ("Deployment", "worker-demo-gpt-1-1-0")
    ]
    pod, want = deploy["spec"]["template"]["spec"], checked_in["spec"]["template"]["spec"]
    assert pod["affinity"] == want["affinity"]
    assert pod["tolerations"] == want["tolerations"]
    assert pod["containers"][0]["command"] == want["containers"][0]["command"]
    assert pod["containers"][0]["resources"] == want["containers"][0]["resources"]


def test_render_refuses_what_it_cannot_deploy(db: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no servable TensorRT"):
        main(["deploy", "render", "--model", MODEL, "--version", "1.0.0", "--gpu"])
    with pytest.raises(SystemExit, match="partitions"):
        main(["deploy", "render", "--model", MODEL, "--version", "1.0.0", "--max-replicas", "7"])
    with pytest.raises(SystemExit, match=r"2\.0\.0"):
        main(["deploy", "render", "--model", MODEL, "--version", "2.0.0"])
    assert not list(tmp_path.glob("*.yaml"))
