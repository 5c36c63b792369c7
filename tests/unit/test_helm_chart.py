"""deploy/helm/graylane: the real ``helm lint`` and ``helm template``; with default values
the chart renders the objects ``kustomize build deploy/k8s/base`` renders, and every
rendering validates against the Kubernetes 1.31 schemas and the CRD schemas in the repo.

helm and kustomize are built from the Go module proxy once when missing
(graylane.deploy.containers.tools) and cached under .local/tools.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from graylane.app.cli.main import build_parser
from graylane.deploy.containers.podman import ContainerToolError, secret_payloads
from graylane.deploy.containers.tools import HELM, KUSTOMIZE
from graylane.deploy.prometheus import operator_objects
from graylane.settings import Settings
from tests.unit.k8s_render import render
from tests.unit.k8s_validate import CRDS, KUBERNETES_VERSION, validate

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "graylane"
BASE = ROOT / "deploy" / "k8s" / "base"
MONITORING = ROOT / "deploy" / "k8s" / "monitoring"
NAMESPACE = "graylane"
GPU_IMAGE = "ghcr.io/graylane/demo-gpt-tensorrt10.7.0-fp16-ptq:1.1.0"
GPU_VALUES: dict[str, Any] = {
    "gpuClasses": {
        "tensorrt": {
            "computeCapabilities": ["9.0", "8.9"],
            "image": GPU_IMAGE,
            "resources": {
                "requests": {"cpu": "2", "memory": "8Gi"},
                "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
            },
        }
    },
    "models": [
        {
            "name": "demo-gpt",
            "versions": [{"version": "1.0.0"}, {"version": "1.1.0", "gpuClass": "tensorrt"}],
        }
    ],
}
ALL_ON: dict[str, Any] = {
    **GPU_VALUES,
    "monitoring": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
}
# smollm2 1.0.0 served by vLLM: the values that render deploy/k8s/components/engine-vllm.
VLLM_ENGINE: dict[str, Any] = {
    "kind": "vllm",
    "version": "0.11.0",
    "image": "vllm/vllm-openai:v0.11.0",
    "command": ["vllm", "serve"],
    "args": [
        "/models/SmolLM2-135M-Instruct",
        "--served-model-name",
        "smollm2",
        "--dtype",
        "float16",
        "--max-num-seqs",
        "16",
    ],
    "variant": "fp16",
    "servedModel": "smollm2",
    "slots": 16,
    "env": [{"name": "VLLM_NO_USAGE_STATS", "value": "1"}],
}
ENGINE_MODEL: dict[str, Any] = {
    "name": "smollm2",
    "versions": [{"version": "1.0.0", "maxReplicas": 4, "engine": VLLM_ENGINE}],
}
ENGINE_WORKER = ("Deployment", "worker-smollm2-1-0-0")

Doc = dict[str, Any]


def _docs(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def template(values: dict[str, Any] | None = None, tmp: Path | None = None) -> list[Doc]:
    args = ["template", "graylane", str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", f"{KUBERNETES_VERSION}.0"]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.json"
        path.write_text(json.dumps(values))
        args += ["--values", str(path)]
    return _docs(HELM.run(*args))


def _key(doc: Doc) -> tuple[str, str]:
    return (doc["kind"], doc["metadata"]["name"])


def _by_key(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    out = {_key(d): d for d in docs}
    assert len(out) == len(docs), "two objects share a kind and name"
    return out


def _containers(doc: Doc) -> list[Doc]:
    spec = doc.get("spec", {})
    pod = spec.get("jobTemplate", {}).get("spec", spec).get("template", {}).get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


@pytest.fixture(scope="module")
def chart_defaults() -> list[Doc]:
    return template()


@pytest.fixture(scope="module")
def chart_all_on(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return template(ALL_ON, tmp_path_factory.mktemp("values"))


def test_helm_lint_passes() -> None:
    out = HELM.run("lint", "--strict", str(CHART), "--kube-version", f"{KUBERNETES_VERSION}.0")
    assert "0 chart(s) failed" in out


def test_defaults_render_the_kustomize_base(chart_defaults: list[Doc]) -> None:
    base = _by_key(_docs(KUSTOMIZE.run("build", str(BASE))))
    chart = _by_key(chart_defaults)
    # A chart installs into a namespace it is given (helm install -n/--create-namespace).
    assert base.pop(("Namespace", NAMESPACE))["kind"] == "Namespace"
    assert sorted(chart) == sorted(base)
    for key, doc in base.items():
        assert [(c["name"], c.get("command"), c.get("args")) for c in _containers(doc)] == [
            (c["name"], c.get("command"), c.get("args")) for c in _containers(chart[key])
        ], key
        assert chart[key] == doc, key  # whole objects, not only their commands


def test_every_rendering_validates(chart_defaults: list[Doc], chart_all_on: list[Doc]) -> None:
    kinds = set()
    for doc in [*chart_defaults, *chart_all_on]:
        validate(doc)
        assert doc["metadata"]["namespace"] == NAMESPACE
        kinds.add(doc["kind"])
    assert {"ScaledObject", "TriggerAuthentication", "PodMonitor", "PrometheusRule"} <= kinds


def test_monitoring_objects_are_the_kustomize_ones(chart_all_on: list[Doc]) -> None:
    chart = _by_key(chart_all_on)
    kustomized = _by_key(_docs(KUSTOMIZE.run("build", str(MONITORING))))
    assert chart[("PodMonitor", "graylane")] == kustomized[("PodMonitor", "graylane")]
    rule = chart[("PrometheusRule", "graylane")]
    assert rule == kustomized[("PrometheusRule", "graylane")]
    assert rule["spec"]["groups"] == operator_objects.rule_groups()


def test_monitoring_is_off_by_default(chart_defaults: list[Doc]) -> None:
    kinds = {d["kind"] for d in chart_defaults}
    assert not kinds & {"PodMonitor", "PrometheusRule"}


def test_keda_off_leaves_the_workers_their_replicas(tmp_path: Path) -> None:
    values = {"keda": {"enabled": False}, **GPU_VALUES}
    values["models"] = [{"name": "demo-gpt", "versions": [{"version": "1.0.0", "replicas": 3}]}]
    docs = template(values, tmp_path)
    assert not {d["kind"] for d in docs} & {"ScaledObject", "TriggerAuthentication"}
    (worker,) = [
        d
        for d in docs
        if d["metadata"]["name"] == "worker-demo-gpt-1-0-0" and d["kind"] == "Deployment"
    ]
    assert worker["spec"]["replicas"] == 3
    for doc in docs:
        validate(doc)


def test_a_gpu_version_is_one_deployment_placed_by_compute_capability(
    chart_all_on: list[Doc],
) -> None:
    workers = [
        d
        for d in chart_all_on
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]
    assert sorted(d["metadata"]["name"] for d in workers) == [
        "worker-demo-gpt-1-0-0",
        "worker-demo-gpt-1-1-0",
    ]
    for worker in workers:
        pod = worker["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = build_parser().parse_args(container["command"][1:])
        on_gpu = "nvidia.com/gpu" in container["resources"].get("limits", {})
        assert args.require_tensorrt is on_gpu
        if not on_gpu:
            assert "affinity" not in pod
            continue
        assert container["image"] == GPU_IMAGE
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        capabilities = {
            ".".join(e["values"][0] for e in sorted(t["matchExpressions"], key=lambda e: e["key"]))
            for t in terms["nodeSelectorTerms"]
        }
        assert capabilities == {"9.0", "8.9"}
    scaled = {d["metadata"]["name"]: d for d in chart_all_on if d["kind"] == "ScaledObject"}
    assert scaled["worker-demo-gpt-1-1-0"]["spec"]["maxReplicaCount"] == 6


def test_gpu_values_render_the_gpu_overlay(tmp_path: Path) -> None:
    versions = [
        {"version": v, "gpuClass": "tensorrt", "image": GPU_IMAGE.replace("1.1.0", v)}
        for v in ("1.0.0", "1.1.0")
    ]
    values = {
        **ALL_ON,
        "image": {"repository": "ghcr.io/graylane/graylane", "tag": "0.1.0"},
        "models": [{"name": "demo-gpt", "versions": versions}, ENGINE_MODEL],
    }
    chart = _by_key(template(values, tmp_path))
    overlay = _by_key(_docs(KUSTOMIZE.run("build", str(BASE.parent / "overlays" / "gpu"))))
    overlay.pop(("Namespace", NAMESPACE))
    assert sorted(chart) == sorted(overlay)
    for key, doc in overlay.items():
        assert chart[key] == doc, key


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_real_kustomize_renders_overlays_that_validate(overlay: str) -> None:
    docs = _docs(KUSTOMIZE.run("build", str(BASE.parent / "overlays" / overlay)))
    for doc in docs:
        validate(doc)
    kinds = {d["kind"] for d in docs}
    assert {"ScaledObject", "TriggerAuthentication", "PodMonitor", "PrometheusRule"} <= kinds


def test_artifact_store_and_trusted_keys_are_values(tmp_path: Path) -> None:
    values = {
        "artifacts": {
            "store": "gs://models-bucket/graylane",
            "trustedKeys": {"enabled": False},
            "requireSignatures": False,
        }
    }
    docs = _by_key(template(values, tmp_path))
    config = docs[("ConfigMap", "graylane-config")]["data"]
    assert config["GRAYLANE_ARTIFACT_STORE"] == "gs://models-bucket/graylane"
    assert "GRAYLANE_REQUIRE_SIGNATURES" not in config
    worker = docs[("Deployment", "worker-demo-gpt-1-0-0")]
    pod = worker["spec"]["template"]["spec"]
    assert "artifact-keys" not in {v["name"] for v in pod["volumes"]}
    for container in _containers(worker):
        assert "GRAYLANE_TRUSTED_KEYS" not in {e["name"] for e in container["env"]}
        assert "artifact-keys" not in {m["name"] for m in container["volumeMounts"]}
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-artifacts"]
    for doc in docs.values():
        validate(doc)


def test_signatures_are_required_by_default_and_keys_cannot_be_dropped_alone(
    chart_defaults: list[Doc], tmp_path: Path
) -> None:
    """Regression (fail open): the chart's key Secret was optional and nothing required a
    signature, so a release without the Secret served unsigned artifacts."""
    docs = _by_key(chart_defaults)
    config = docs[("ConfigMap", "graylane-config")]["data"]
    assert Settings.from_env(config).require_signatures is True
    for key, doc in docs.items():
        if key[0] == "Deployment" and "fetch-artifacts" in {c["name"] for c in _containers(doc)}:
            volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}
            assert not volumes["artifact-keys"]["secret"].get("optional"), key
    with pytest.raises(ContainerToolError, match="requireSignatures needs"):
        template({"artifacts": {"trustedKeys": {"enabled": False}}}, tmp_path)


def test_the_artifact_store_egress_is_a_value_and_never_every_address(tmp_path: Path) -> None:
    """Regression: worker pods could open 443 to any address."""
    store = [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
    docs = _by_key(template({"artifacts": {"storeEgress": store}}, tmp_path))
    policy = docs[("NetworkPolicy", "worker-artifact-store")]
    assert [rule["to"] for rule in policy["spec"]["egress"]] == [store]
    for peers in ([{"ipBlock": {"cidr": "0.0.0.0/0"}}], []):
        with pytest.raises(ContainerToolError, match="storeEgress"):
            template({"artifacts": {"storeEgress": peers}}, tmp_path)


def test_the_local_overlay_fetches_from_the_host_store_into_the_empty_dir() -> None:
    docs = _docs(KUSTOMIZE.run("build", str(BASE.parent / "overlays" / "local")))
    (config,) = [
        d for d in docs if d["kind"] == "ConfigMap" and "GRAYLANE_ARTIFACT_DIR" in d["data"]
    ]
    store = config["data"]["GRAYLANE_ARTIFACT_STORE"]
    assert store.startswith("file://")
    workers = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]
    assert len(workers) == 2
    for worker in workers:
        pod = worker["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert set(volumes["models"]) == {"name", "emptyDir"}
        assert volumes["artifact-store"]["hostPath"]["path"] == "/var/lib/graylane-local/models"
        assert set(volumes["artifact-keys"]) == {"name", "emptyDir"}  # nothing signed locally
        (init,) = pod["initContainers"]
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in init["volumeMounts"]}
        assert mounts["artifact-store"]["readOnly"] is True
        assert store == f"file://{mounts['artifact-store']['mountPath']}"
        assert mounts["state"]["mountPath"] == "/var/lib/graylane"  # the SQLite registry
        assert mounts["models"]["mountPath"] == config["data"]["GRAYLANE_ARTIFACT_DIR"]
        assert "artifact-store" not in {m["name"] for m in container["volumeMounts"]}
        validate(worker)
    # podman kube play serves each Secret one way: the logins and database URLs, now files,
    # are volume Secrets only (none is also read through env)
    payloads = secret_payloads(docs)
    assert {"graylane-kafka-worker", "graylane-database-readonly"} <= payloads.keys()
    assert config["data"]["GRAYLANE_REQUIRE_SIGNATURES"] == "false"  # nothing signed locally


CERT_MANAGER = BASE.parent / "components" / "cert-manager"


def _with_cert_manager(tmp_path: Path) -> list[Doc]:
    """The base with the cert-manager component, rendered by the real kustomize."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": NAMESPACE,
                "resources": [os.path.relpath(BASE, overlay)],
                "components": [os.path.relpath(CERT_MANAGER, overlay)],
            }
        )
    )
    return _docs(KUSTOMIZE.run("build", str(overlay)))


def test_the_cert_manager_component_issues_the_control_planes_secret(tmp_path: Path) -> None:
    docs = _with_cert_manager(tmp_path)
    (cert,) = [d for d in docs if d["kind"] == "Certificate"]
    assert ("cert-manager.io/v1", "Certificate") in CRDS
    validate(cert)
    assert cert["metadata"]["namespace"] == NAMESPACE
    (controlplane,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "controlplane"
    ]
    tls = {
        v["secret"]["secretName"]
        for v in controlplane["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert (
        cert["spec"]["secretName"] == "graylane-controlplane-tls"
        and cert["spec"]["secretName"] in tls
    )
    (service,) = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "controlplane"
    ]
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    broken = {**cert, "spec": {**cert["spec"], "privateKey": {"algorithm": "DSA"}}}
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)


def test_the_chart_renders_the_same_certificate_when_asked(
    tmp_path: Path, chart_defaults: list[Doc]
) -> None:
    assert not [d for d in chart_defaults if d["kind"] == "Certificate"]
    values = {"controlplane": {"tls": {"certManager": {"enabled": True}}}}
    (chart,) = [d for d in template(values, tmp_path) if d["kind"] == "Certificate"]
    validate(chart)
    (component,) = [d for d in _with_cert_manager(tmp_path) if d["kind"] == "Certificate"]
    assert chart == component
    issuer = {"name": "letsencrypt", "kind": "ClusterIssuer"}
    values = {"controlplane": {"tls": {"certManager": {"enabled": True, "issuer": issuer}}}}
    (other,) = [d for d in template(values, tmp_path) if d["kind"] == "Certificate"]
    assert other["spec"]["issuerRef"] == {**issuer, "group": "cert-manager.io"}
    validate(other)


def _engine_values(**engine: Any) -> dict[str, Any]:
    version = {**ENGINE_MODEL["versions"][0], "engine": {**VLLM_ENGINE, **engine}}
    return {
        "models": [
            {"name": "demo-gpt", "versions": [{"version": "1.0.0"}]},
            {**ENGINE_MODEL, "versions": [version]},
        ]
    }


def _pod_containers(doc: Doc) -> dict[str, Doc]:
    return {c["name"]: c for c in doc["spec"]["template"]["spec"]["containers"]}


def test_an_engine_version_is_the_engine_and_its_worker_in_one_pod(tmp_path: Path) -> None:
    """The values' engine section: the engine's GPU, port, probes and model volume; the
    worker beside it calls it on loopback; the router and topic Job learn the model."""
    docs = _by_key(template(_engine_values(), tmp_path))
    for doc in docs.values():
        validate(doc)
    deploy = docs[ENGINE_WORKER]
    pod = deploy["spec"]["template"]["spec"]
    containers = _pod_containers(deploy)
    assert list(containers) == ["engine", "worker"] and "initContainers" not in pod
    engine, worker = containers["engine"], containers["worker"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert engine["args"][-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert engine[probe]["httpGet"] == {"path": "/health", "port": "engine"}
    assert (
        engine["startupProbe"]["periodSeconds"] * engine["startupProbe"]["failureThreshold"] == 900
    )
    args = build_parser().parse_args(worker["command"][1:])
    assert args.endpoint == ["fp16=http://127.0.0.1:8000"] and args.engine == "vllm"
    assert (args.engine_version, args.engine_model, args.engine_slots) == ("0.11.0", "smollm2", 16)
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    claim = {v["name"]: v for v in pod["volumes"]}["engine-model"]["persistentVolumeClaim"]
    assert claim == {"claimName": "graylane-engine-models", "readOnly": True}
    assert docs[("ScaledObject", "worker-smollm2-1-0-0")]["spec"]["maxReplicaCount"] == 4
    router = docs[("Deployment", "router")]["spec"]["template"]["spec"]["containers"][0]
    assert router["command"][3:] == ["--model", "demo-gpt=1.0.0", "--model", "smollm2=1.0.0"]
    job = docs[("Job", "graylane-topics")]["spec"]["template"]["spec"]["containers"][0]
    assert job["command"][2:] == ["--model", "demo-gpt=1.0.0", "--model", "smollm2=1.0.0"]


def test_engine_defaults_are_values_a_version_overrides(tmp_path: Path) -> None:
    """A TensorRT-LLM version with its own port, a longer start and no GPU of its own."""
    values = _engine_values(
        kind="trtllm",
        image="nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
        command=["trtllm-serve"],
        args=["/models/SmolLM2-135M-Instruct", "--backend", "pytorch"],
        port=8100,
        gpus=0,
        probes={"startup": {"failureThreshold": 180}},
        stopDelaySeconds=0,
    )
    docs = _by_key(template(values, tmp_path))
    deploy = docs[ENGINE_WORKER]
    validate(deploy)
    pod = deploy["spec"]["template"]["spec"]
    engine, worker = _pod_containers(deploy).values()
    assert "nvidia.com/gpu" not in engine["resources"]["limits"] and "tolerations" not in pod
    assert engine["startupProbe"]["failureThreshold"] == 180
    assert engine["startupProbe"]["periodSeconds"] == 10  # the rest from engineDefaults
    assert engine["ports"] == [{"name": "engine", "containerPort": 8100, "protocol": "TCP"}]
    assert "lifecycle" not in engine
    args = build_parser().parse_args(worker["command"][1:])
    assert args.endpoint == ["fp16=http://127.0.0.1:8100"] and args.engine == "trtllm"


@pytest.mark.parametrize(
    ("engine", "extra", "message"),
    [
        ({"kind": "onnx"}, {}, "engine.kind must be one of"),
        ({}, {"gpuClass": "tensorrt"}, "takes no gpuClass"),
        ({"image": None}, {}, "engine.image"),
    ],
)
def test_engine_values_are_checked(
    tmp_path: Path, engine: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    values = _engine_values(**engine)
    values["models"][1]["versions"][0].update(extra)
    values["gpuClasses"] = GPU_VALUES["gpuClasses"]
    with pytest.raises(ContainerToolError, match=message):
        template(values, tmp_path)


def test_the_engine_stop_delay_needs_the_sleep_action(tmp_path: Path) -> None:
    path = tmp_path / "values.json"
    path.write_text(json.dumps(_engine_values()))
    args = ["template", "graylane", str(CHART), "-n", NAMESPACE, "--values", str(path)]
    with pytest.raises(ContainerToolError, match=r"Kubernetes 1\.30"):
        HELM.run(*args, "--kube-version", "1.29.0")


def test_every_model_reaches_the_router_topic_job_and_policy_engine(tmp_path: Path) -> None:
    values = {
        "models": [
            {"name": "demo-gpt", "versions": [{"version": "1.0.0"}, {"version": "1.1.0"}]},
            {
                "name": "classifier",
                "stable": "2.0.0",
                "versions": [{"version": "2.1.0"}, {"version": "2.0.0"}],
            },
        ]
    }
    docs = _by_key(template(values, tmp_path))

    def command(kind: str, name: str) -> list[str]:
        (container,) = _containers(docs[(kind, name)])
        return list(container["command"])

    router = build_parser().parse_args(command("Deployment", "router")[1:])
    assert router.model == ["demo-gpt=1.0.0", "classifier=2.0.0"]
    topics = build_parser().parse_args(command("Job", "graylane-topics")[1:])
    assert topics.model == ["demo-gpt=1.0.0,1.1.0", "classifier=2.1.0,2.0.0"]
    policy = build_parser().parse_args(command("Deployment", "policy-engine")[1:])
    assert policy.model == ["demo-gpt", "classifier"]


@pytest.mark.parametrize("tree", ["base", "overlays/cpu", "overlays/gpu"])
def test_the_offline_renderer_agrees_with_kustomize(tree: str) -> None:
    """tests/unit/test_k8s_manifests.py renders without kustomize: the same objects."""
    folder = BASE.parent / tree
    real = _by_key(_docs(KUSTOMIZE.run("build", str(folder))))
    assert _by_key(render(folder)) == real
