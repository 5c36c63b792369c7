"""deploy/k8s: every rendered manifest is valid offline and follows the platform rules.

Kubernetes kinds are checked against the Kubernetes JSON schemas (kubernetes-validate,
strict: unknown fields fail); KEDA kinds against the CRD schemas kept in
deploy/k8s/schemas, with unknown fields refused as the API server would prune them.
Overlays are rendered by tests/unit/k8s_render.py (no kustomize binary here).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from graylane.acls import KafkaRole
from graylane.app.cli.main import LEGACY_SERVER_COMMANDS, build_parser
from graylane.artifacts.naming import Backend, parse_artifact_name
from graylane.settings import Settings
from graylane.topics import TopicLayout
from tests.unit.k8s_render import Doc, RenderError, merge, render
from tests.unit.k8s_validate import CRDS, KUBERNETES_VERSION, unknown_fields, validate, validate_crd

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
TREES = {"base": K8S / "base", "cpu": K8S / "overlays" / "cpu", "gpu": K8S / "overlays" / "gpu"}
RENDERED = {name: render(path) for name, path in TREES.items()}
# One Kafka login per role (graylane.acls.KafkaRole values), the broker's CA, the schema
# owner's and a read-only database URL, the API tokens.
ROLE_OF_COMPONENT = {
    "router": KafkaRole.ROUTER,
    "worker": KafkaRole.WORKER,
    "policy": KafkaRole.POLICY_ENGINE,
    "controlplane": KafkaRole.CONTROL_PLANE,
    "audit-sink": KafkaRole.CONTROL_PLANE,
    "gateway": KafkaRole.GATEWAY,
}
KAFKA_SECRETS = {role: f"graylane-kafka-{role.value}" for role in ROLE_OF_COMPONENT.values()}
SECRETS = frozenset(
    {
        *KAFKA_SECRETS.values(),
        "graylane-kafka-scaler",
        "graylane-kafka-ca",
        "graylane-database",
        "graylane-database-readonly",
        "graylane-api-tokens",
        "graylane-gateway-keys",
        "graylane-controlplane-tls",
        "graylane-artifact-keys",
    }
)
CA_DIR = "/etc/graylane/kafka-ca"
# Services whose CLI command is still to be written (the test fails once it exists).
PENDING_COMMANDS: frozenset[str] = frozenset()


def _all() -> list[tuple[str, Doc]]:
    return [(tree, doc) for tree, docs in RENDERED.items() for doc in docs]


def _of(tree: str, kind: str) -> list[Doc]:
    return [d for d in RENDERED[tree] if d["kind"] == kind]


def _pod(deploy: Doc) -> Doc:
    spec: Doc = deploy["spec"]["template"]["spec"]
    return spec


ENGINE = "engine"
"""The container name of an engine server beside its worker (an engine-served version)."""


def _graylane(deploy: Doc) -> Doc:
    """The pod's Graylane container (an engine-served worker's pod also runs its engine)."""
    found: list[Doc] = [c for c in _pod(deploy)["containers"] if c["name"] != ENGINE]
    (container,) = found
    return container


def _engine(deploy: Doc) -> Doc | None:
    found: list[Doc] = [c for c in _pod(deploy)["containers"] if c["name"] == ENGINE]
    return found[0] if found else None


def _engine_served(deploy: Doc) -> bool:
    """A worker that serves through engine servers (``--endpoint``), not registry artifacts."""
    return "--endpoint" in _graylane(deploy)["command"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _config(tree: str) -> dict[str, str]:
    (config,) = [d for d in _of(tree, "ConfigMap") if d["metadata"]["name"] == "graylane-config"]
    data: dict[str, str] = config["data"]
    return data


@pytest.mark.parametrize(
    ("tree", "doc"), _all(), ids=[f"{t}-{d['kind']}-{d['metadata']['name']}" for t, d in _all()]
)
def test_manifest_is_valid(tree: str, doc: Doc) -> None:
    validate(doc)
    if doc["kind"] != "Namespace":
        assert doc["metadata"]["namespace"] == "graylane"


def test_validation_catches_a_misspelt_field() -> None:
    deploy = _of("base", "Deployment")[0]
    bad = merge(
        deploy,
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": _pod(deploy)["containers"][0]["name"], "readinesProbe": {}}
                        ]
                    }
                }
            }
        },
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    scaled = _of("base", "ScaledObject")[0]
    assert unknown_fields(
        merge(scaled, {"spec": {"maxReplicas": 3}}), CRDS[("keda.sh/v1alpha1", "ScaledObject")]
    ) == [".spec.maxReplicas"]
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(
            merge(scaled, {"spec": {"minReplicaCount": "one"}}),
            CRDS[("keda.sh/v1alpha1", "ScaledObject")],
        )


@pytest.mark.parametrize("tree", TREES)
def test_pods_are_locked_down_and_probed(tree: str) -> None:
    deployments = _of(tree, "Deployment")
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments} == {
        "router",
        "policy",
        "controlplane",
        "audit-sink",
        "worker",
        "gateway",
    }
    for deploy in deployments:
        pod = _pod(deploy)
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"] and sc["runAsNonRoot"] is True
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert c["resources"]["limits"]["memory"]
            name, _, tag = c["image"].rpartition(":")
            assert name and tag and tag != "latest", c["image"]
            if c["name"] == ENGINE:  # an engine server's own probes, on its own port
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    assert c[probe]["httpGet"] == {"path": "/health", "port": ENGINE}, probe
                continue
            assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
            assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
            assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in c["ports"]
        annotations = deploy["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9100"}
    assert _config(tree)["GRAYLANE_METRICS_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("tree", TREES)
def test_every_pod_has_exactly_one_deployment_and_one_budget(tree: str) -> None:
    deployments = _of(tree, "Deployment")
    budgets = _of(tree, "PodDisruptionBudget")
    for deploy in deployments:
        labels = deploy["spec"]["template"]["metadata"]["labels"]
        assert _selects(deploy["spec"]["selector"]["matchLabels"], labels)
        owners = [d for d in deployments if _selects(d["spec"]["selector"]["matchLabels"], labels)]
        assert owners == [deploy], f"{deploy['metadata']['name']}: selectors overlap"
        covering = [b for b in budgets if _selects(b["spec"]["selector"]["matchLabels"], labels)]
        assert len(covering) == 1, f"{deploy['metadata']['name']}: {len(covering)} budgets"


@pytest.mark.parametrize("tree", TREES)
def test_workers_scale_on_their_topic_lag_and_desired_replicas(tree: str) -> None:
    config = _config(tree)
    layout = TopicLayout(prefix=config["GRAYLANE_TOPIC_PREFIX"])
    partitions = int(config["GRAYLANE_PARTITIONS"])
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in _of(tree, "ScaledObject")}
    per_topic: dict[str, int] = defaultdict(int)
    workers = [
        d
        for d in _of(tree, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]
    assert workers and set(scaled) == {w["metadata"]["name"] for w in workers}
    for worker in workers:
        labels = worker["metadata"]["labels"]
        model, version = labels["graylane.io/model"], labels["graylane.io/version"]
        cmd = _graylane(worker)["command"]
        assert cmd[cmd.index("--model") + 1] == model and cmd[cmd.index("--version") + 1] == version
        spec = scaled[worker["metadata"]["name"]]["spec"]
        assert spec["scaleTargetRef"]["kind"] == "Deployment" and spec["minReplicaCount"] >= 1
        triggers = {t["type"]: t for t in spec["triggers"]}
        assert set(triggers) == {"kafka", "prometheus"}
        kafka = triggers["kafka"]["metadata"]
        topic = layout.version_requests(model, version)
        assert kafka["topic"] == topic
        assert kafka["consumerGroup"] == f"{layout.prefix}-worker-{model}-{version}"
        assert kafka["bootstrapServers"] == config["GRAYLANE_BOOTSTRAP_SERVERS"]
        assert triggers["kafka"]["authenticationRef"]["name"] in {
            t["metadata"]["name"] for t in _of(tree, "TriggerAuthentication")
        }
        query = triggers["prometheus"]["metadata"]["query"]
        assert query == f'max(graylane_desired_replicas{{model="{model}",version="{version}"}})'
        per_topic[topic] += spec["maxReplicaCount"]
    for topic, replicas in per_topic.items():
        assert replicas <= partitions, f"{topic}: {replicas} replicas > {partitions} partitions"


@pytest.mark.parametrize("tree", TREES)
def test_the_policy_engine_asks_for_replicas_within_the_partitions(tree: str) -> None:
    partitions = int(_config(tree)["GRAYLANE_PARTITIONS"])
    (policy,) = [
        d
        for d in _of(tree, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "policy"
    ]
    (container,) = _pod(policy)["containers"]
    cmd = container["command"]
    max_replicas = int(cmd[cmd.index("--max-replicas") + 1])
    assert 1 < max_replicas <= partitions  # scaling on, never more consumers than partitions


def _workers(tree: str) -> list[Doc]:
    return [
        d
        for d in _of(tree, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]


def _registry_workers(tree: str) -> list[Doc]:
    """Workers that load their version's artifacts from the registry (not engine-served)."""
    return [w for w in _workers(tree) if not _engine_served(w)]


@pytest.mark.parametrize("tree", TREES)
def test_models_are_fetched_into_an_empty_dir_the_worker_mounts_read_only(tree: str) -> None:
    assert not _of(tree, "PersistentVolumeClaim")
    assert _registry_workers(tree)
    for worker in _registry_workers(tree):
        pod = _pod(worker)
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes["models"] and "persistentVolumeClaim" not in volumes["models"]
        (container,) = pod["containers"]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
        assert (
            mount["readOnly"] is True
            and mount["mountPath"] == _config(tree)["GRAYLANE_ARTIFACT_DIR"]
        )


@pytest.mark.parametrize("tree", TREES)
def test_every_worker_fetches_its_own_version_with_the_real_cli(tree: str) -> None:
    assert _config(tree)["GRAYLANE_ARTIFACT_STORE"]
    for worker in _registry_workers(tree):
        pod = _pod(worker)
        (init,) = pod["initContainers"]
        (container,) = pod["containers"]
        assert init["name"] == "fetch-artifacts"
        assert init["image"] == container["image"]
        assert init["securityContext"] == container["securityContext"]
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
        fetch = build_parser().parse_args(init["command"][1:])
        serve = build_parser().parse_args(container["command"][1:])
        assert (fetch.command, fetch.artifacts_command) == ("artifacts", "fetch")
        assert (fetch.model, fetch.version) == (serve.model, serve.version)
        assert str(fetch.into) == _config(tree)["GRAYLANE_ARTIFACT_DIR"]
        mount = next(m for m in init["volumeMounts"] if m["name"] == "models")
        assert mount["mountPath"] == str(fetch.into) and not mount.get("readOnly", False)
        assert _file_secrets(init, pod)["GRAYLANE_DB_URL"] == "graylane-database-readonly"
        # a CPU worker fetches no TensorRT engine; a GPU worker's init container sees the
        # pod's GPU and fetches the engines the worker loads on it, and the ONNX variants
        assert fetch.backend == ([] if serve.require_tensorrt else ["onnxruntime"])
        assert fetch.this_gpu is serve.require_tensorrt
        gpus = [c["resources"]["limits"].get("nvidia.com/gpu") for c in (init, container)]
        assert gpus == (["1", "1"] if serve.require_tensorrt else [None, None])


EVERY_ADDRESS = frozenset({"0.0.0.0/0", "::/0"})
STORE_NAMESPACE = "artifact-store"


@pytest.mark.parametrize("tree", TREES)
def test_egress_leads_only_to_named_peers(tree: str) -> None:
    """Regression: the artifact-store rule allowed port 443 to any address, so a worker
    pod could send to anywhere on the internet over HTTPS."""
    for policy in _of(tree, "NetworkPolicy"):
        for rule in policy["spec"].get("egress", []):
            name = policy["metadata"]["name"]
            assert rule.get("to"), f"{name}: an egress rule to any address"
            for peer in rule["to"]:
                assert peer.get("ipBlock", {}).get("cidr") not in EVERY_ADDRESS, name
    https = [
        peer
        for policy in _of(tree, "NetworkPolicy")
        for rule in policy["spec"].get("egress", [])
        if {"protocol": "TCP", "port": 443} in rule.get("ports", [])
        for peer in rule["to"]
    ]
    assert https == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": STORE_NAMESPACE}}}
    ]


@pytest.mark.parametrize("tree", TREES)
def test_worker_pods_may_reach_the_artifact_store_over_https(tree: str) -> None:
    worker_labels = _workers(tree)[0]["spec"]["template"]["metadata"]["labels"]
    egress_ports = {
        (port["protocol"], port["port"])
        for policy in _of(tree, "NetworkPolicy")
        if "Egress" in policy["spec"]["policyTypes"]
        and policy["spec"]["podSelector"].get("matchLabels", {}).items() <= worker_labels.items()
        for rule in policy["spec"].get("egress", [])
        for port in rule.get("ports", [])
    }
    assert ("TCP", 443) in egress_ports


@pytest.mark.parametrize("tree", TREES)
def test_signatures_are_required_from_a_key_secret_both_containers_read(tree: str) -> None:
    """Regression (fail open): the key Secret was ``optional``, and a pod without it
    fetched and served unsigned artifacts with a warning."""
    assert Settings.from_env(_config(tree)).require_signatures is True
    for worker in _registry_workers(tree):
        pod = _pod(worker)
        volumes = {v["name"]: v for v in pod["volumes"]}
        keys = volumes["artifact-keys"]["secret"]
        assert keys["secretName"] == "graylane-artifact-keys" and not keys.get("optional")
        for c in [*pod["initContainers"], *pod["containers"]]:
            env = {e["name"]: e.get("value") for e in c["env"]}
            mount = next(m for m in c["volumeMounts"] if m["name"] == "artifact-keys")
            assert mount["readOnly"] is True
            assert env["GRAYLANE_TRUSTED_KEYS"] == mount["mountPath"], c["name"]


def _secret_refs(value: Any) -> set[str]:
    refs: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("secretKeyRef", "secretRef") and isinstance(item, dict):
                refs.add(item["name"])
            elif key == "secret" and isinstance(item, dict):
                refs.add(item["secretName"])
            elif key == "secretTargetRef":
                refs |= {t["name"] for t in item}
            refs |= _secret_refs(item)
    elif isinstance(value, list):
        for item in value:
            refs |= _secret_refs(item)
    return refs


@pytest.mark.parametrize("tree", TREES)
def test_credentials_come_from_secrets_only(tree: str) -> None:
    docs = RENDERED[tree]
    assert not [d for d in docs if d["kind"] == "Secret"], "no Secret is committed"
    assert _secret_refs(docs) == SECRETS
    secretish = re.compile(r"PASSWORD|TOKEN|SECRET|USERNAME|DB_URL|MECHANISM")
    for deploy in [*_of(tree, "Deployment"), *_of(tree, "Job")]:
        pod = _pod(deploy)
        for c in [*pod["containers"], *pod.get("initContainers", [])]:
            from_files = _file_secrets(c, pod)
            for env in c.get("env", []):
                # Regression: SASL passwords and database URLs were environment variables
                # (secretKeyRef), which child processes and /proc/<pid>/environ show.
                assert "valueFrom" not in env, (deploy["metadata"]["name"], env["name"])
                if secretish.search(env["name"]):
                    assert env["name"].endswith("_FILE"), env["name"]
                    assert env["name"].removesuffix("_FILE") in from_files, env["name"]
    for key in _config(tree):
        assert not secretish.search(key), key


def _file_secrets(container: Doc, pod: Doc) -> dict[str, str]:
    """Each setting's Secret, for the settings the container reads from a file of a Secret
    volume it mounts read-only (``GRAYLANE_<NAME>_FILE``), by the setting's name."""
    volumes = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
    mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
    found: dict[str, str] = {}
    for env in container.get("env", []):
        if not env["name"].endswith("_FILE") or "value" not in env:
            continue
        path = PurePosixPath(env["value"])
        mount = mounts.get(str(path.parent))
        secret = volumes.get(mount["name"]) if mount is not None else None
        if secret is None:
            continue
        assert mount is not None and mount["readOnly"] is True, env["name"]
        paths = {i["path"]: i["key"] for i in secret.get("items", [])}
        assert not paths or path.name in paths, env["name"]
        found[env["name"].removesuffix("_FILE")] = secret["secretName"]
    return found


@pytest.mark.parametrize("tree", TREES)
def test_each_deployment_logs_in_as_its_own_role_over_tls(tree: str) -> None:
    """Regression: every component logged in as one shared SASL user over SASL_PLAINTEXT,
    so the per-role ACLs could never apply."""
    config = _config(tree)
    assert config["GRAYLANE_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert config["GRAYLANE_SSL_CAFILE"] == f"{CA_DIR}/ca.crt"
    deployments = _of(tree, "Deployment")
    seen = set()
    for deploy in deployments:
        component = deploy["metadata"]["labels"]["app.kubernetes.io/component"]
        own = KAFKA_SECRETS[ROLE_OF_COMPONENT[component]]
        container = _graylane(deploy)
        secrets = _file_secrets(container, _pod(deploy))
        for var in ("GRAYLANE_SASL_USERNAME", "GRAYLANE_SASL_PASSWORD", "GRAYLANE_SASL_MECHANISM"):
            assert secrets[var] == own, (deploy["metadata"]["name"], var)
        assert not (set(secrets.values()) & set(KAFKA_SECRETS.values())) - {own}
        seen.add(own)
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == CA_DIR)
        (volume,) = [v for v in _pod(deploy)["volumes"] if v["name"] == mount["name"]]
        assert mount["readOnly"] is True
        assert volume["secret"]["secretName"] == "graylane-kafka-ca"
    assert seen == set(KAFKA_SECRETS.values())
    (keda,) = _of(tree, "TriggerAuthentication")
    refs = {t["parameter"]: t["name"] for t in keda["spec"]["secretTargetRef"]}
    # Regression: KEDA logged in as the worker principal (read its topics, write results);
    # its own login may only describe the lag.
    assert refs["username"] == refs["password"] == refs["sasl"] == "graylane-kafka-scaler"
    assert "graylane-kafka-scaler" not in KAFKA_SECRETS.values()
    assert refs["tls"] == refs["ca"] == "graylane-kafka-ca"
    for scaled in _of(tree, "ScaledObject"):
        kafka = next(t for t in scaled["spec"]["triggers"] if t["type"] == "kafka")
        assert kafka["authenticationRef"]["name"] == keda["metadata"]["name"]


@pytest.mark.parametrize("tree", TREES)
def test_only_the_control_plane_and_audit_sink_may_write_the_database(tree: str) -> None:
    """Regression: workers got the full-write database credentials."""
    for deploy in _of(tree, "Deployment"):
        component = deploy["metadata"]["labels"]["app.kubernetes.io/component"]
        url = _file_secrets(_graylane(deploy), _pod(deploy)).get("GRAYLANE_DB_URL")
        wanted = {
            "worker": "graylane-database-readonly",
            "gateway": "graylane-database-readonly",
            "controlplane": "graylane-database",
            "audit-sink": "graylane-database",
        }.get(component)
        if component == "worker" and _engine_served(deploy):
            wanted = None  # its endpoints are its arguments: it reads no registry
        assert url == wanted, deploy["metadata"]["name"]
        engine = _engine(deploy)
        assert engine is None or not _secret_refs(engine), "an engine reads no Secret"


@pytest.mark.parametrize("tree", TREES)
def test_network_is_denied_by_default(tree: str) -> None:
    policies = {p["metadata"]["name"]: p["spec"] for p in _of(tree, "NetworkPolicy")}
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    scrape = policies["graylane-services"]["ingress"]
    assert scrape == [{"from": scrape[0]["from"], "ports": [{"protocol": "TCP", "port": 9100}]}]


# The compute capabilities demo-gpt's TensorRT engines are built for (H100, L4).
ENGINE_CAPABILITIES = {"demo-gpt": {"9.0", "8.9"}}


def _capabilities(pod: Doc) -> set[str]:
    """The "major.minor" compute capabilities a pod's required node affinity admits."""
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    found = set()
    for term in terms["nodeSelectorTerms"]:
        exprs = {e["key"]: e for e in term["matchExpressions"]}
        major, minor = exprs["nvidia.com/gpu.compute.major"], exprs["nvidia.com/gpu.compute.minor"]
        assert major["operator"] == minor["operator"] == "In"
        assert len(major["values"]) == len(minor["values"]) == 1, term
        found.add(f"{major['values'][0]}.{minor['values'][0]}")
    return found


@pytest.mark.parametrize("tree", TREES)
def test_one_worker_deployment_per_version(tree: str) -> None:
    """Two Deployments of one version, both scaled by its lag and desired replicas, would
    give twice the replicas asked for."""
    versions = [
        (
            d["metadata"]["labels"]["graylane.io/model"],
            d["metadata"]["labels"]["graylane.io/version"],
        )
        for d in _of(tree, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]
    assert versions and len(versions) == len(set(versions)), sorted(versions)


def test_gpu_workers_are_placed_by_compute_capability_with_named_images() -> None:
    workers = _registry_workers("gpu")
    assert workers
    for worker in workers:
        pod = _pod(worker)
        (container,) = pod["containers"]
        model = worker["metadata"]["labels"]["graylane.io/model"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        # Any GPU an engine exists for, not one product per Deployment.
        assert "nodeSelector" not in pod
        assert _capabilities(pod) == ENGINE_CAPABILITIES[model]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        image = parse_artifact_name(container["image"].rsplit("/", 1)[1])
        assert image.backend is Backend.TENSORRT
        assert (image.model, str(image.version)) == (
            model,
            worker["metadata"]["labels"]["graylane.io/version"],
        )
    for deploy in _of("cpu", "Deployment") + _of("base", "Deployment"):
        for c in _pod(deploy)["containers"]:
            assert "nvidia.com/gpu" not in c["resources"].get("limits", {})


def test_container_commands_exist_in_the_cli() -> None:
    unknown: set[str] = set()
    parser = build_parser()
    for _, doc in _all():
        if doc["kind"] != "Deployment":
            continue
        for c in _pod(doc)["containers"]:
            if c["name"] == ENGINE:  # an engine server's own command (its image's)
                assert _engine_served(doc), doc["metadata"]["name"]
                continue
            assert c["command"][0] == "graylane"
            if c["command"][1] in PENDING_COMMANDS:
                unknown.add(c["command"][1])
                continue
            # the servers under ``graylane serve``, not the deprecated top-level spellings
            assert c["command"][1] not in LEGACY_SERVER_COMMANDS, c["command"]
            args = parser.parse_args(c["command"][1:])
            assert callable(args.handler)
    assert unknown == PENDING_COMMANDS


def test_renderer_refuses_what_it_does_not_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nreplacements: []\n")
    with pytest.raises(RenderError):
        render(tmp_path)
    component = tmp_path / "component"
    component.mkdir()
    (component / "kustomization.yaml").write_text("kind: Component\nreplacements: []\n")
    (tmp_path / "kustomization.yaml").write_text("components: [component]\n")
    with pytest.raises(RenderError, match="Component"):
        render(tmp_path)
    (component / "kustomization.yaml").write_text("kind: Component\nresources: []\n")
    with pytest.raises(RenderError, match="rendered only as a component"):
        render(component)  # a Component is no kustomization of its own
    assert merge(
        {"c": [{"name": "a", "x": 1}], "k": [1]}, {"c": [{"name": "a", "y": 2}], "k": [2]}
    ) == {
        "c": [{"name": "a", "x": 1, "y": 2}],
        "k": [2],
    }


@pytest.mark.parametrize("tree", TREES)
def test_the_gateway_is_served_scaled_and_reachable(tree: str) -> None:
    (deploy,) = [
        d
        for d in _of(tree, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    ]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    (container,) = _pod(deploy)["containers"]
    cmd = container["command"]
    port = int(cmd[cmd.index("--port") + 1])
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert {"name": "http", "containerPort": port, "protocol": "TCP"} in container["ports"]
    keys = cmd[cmd.index("--keys-file") + 1]
    mount = next(m for m in container["volumeMounts"] if keys.startswith(m["mountPath"] + "/"))
    (volume,) = [v for v in _pod(deploy)["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "graylane-gateway-keys" and mount["readOnly"]
    (service,) = [s for s in _of(tree, "Service") if s["metadata"]["name"] == "gateway"]
    assert _selects(service["spec"]["selector"], labels)
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    (hpa,) = _of(tree, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deploy["metadata"]["name"],
    }
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    (api,) = [p for p in _of(tree, "NetworkPolicy") if p["metadata"]["name"] == "gateway-api"]
    assert _selects(api["spec"]["podSelector"]["matchLabels"], labels)
    assert api["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": port}]


@pytest.mark.parametrize("tree", TREES)
def test_the_control_plane_listens_beyond_loopback_with_tls_from_a_secret(tree: str) -> None:
    """Bound to 127.0.0.1 in its pod, the Service on 50051 would reach nothing while the
    pod shows Ready; beyond loopback the CLI wants TLS or --insecure."""
    (deploy,) = [
        d
        for d in _of(tree, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "controlplane"
    ]
    pod = _pod(deploy)
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.host == "0.0.0.0"
    assert not args.insecure
    assert args.tls_cert is not None and args.tls_key is not None
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for path in (args.tls_cert, args.tls_key):
        mount = str(path.parent)
        assert secrets.get(mounts.get(mount, "")) == "graylane-controlplane-tls", path
    assert {p["containerPort"] for p in container["ports"]} >= {50051}


@pytest.mark.parametrize("tree", TREES)
def test_gpu_workers_refuse_to_fall_back_to_onnx_runtime_on_cpu(tree: str) -> None:
    """A GPU pod whose engine does not match its GPU would otherwise serve ONNX Runtime on
    CPU while holding the GPU."""
    parser = build_parser()
    workers = [
        d
        for d in _of(tree, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]
    assert workers
    for worker in workers:
        container = _graylane(worker)  # an engine beside it holds the GPU, not the worker
        on_gpu = "nvidia.com/gpu" in container["resources"].get("limits", {})
        args = parser.parse_args(container["command"][1:])
        assert args.require_tensorrt is on_gpu, worker["metadata"]["name"]


@pytest.mark.parametrize("tree", TREES)
def test_a_job_creates_the_topics_of_every_served_version(tree: str) -> None:
    """Nothing else creates the version topics the router writes and KEDA reads."""
    (job,) = _of(tree, "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "topics"
    wanted: set[tuple[str, str]] = set()
    for item in args.model:
        model, _, versions = item.partition("=")
        wanted |= {(model, v) for v in versions.split(",")}
    served = {
        (
            d["metadata"]["labels"]["graylane.io/model"],
            d["metadata"]["labels"]["graylane.io/version"],
        )
        for d in _of(tree, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    }
    assert served and served <= wanted
    secrets = set(_file_secrets(container, pod).values())
    assert secrets == {KAFKA_SECRETS[KafkaRole.CONTROL_PLANE]}  # the role that may create
    assert pod["restartPolicy"] == "OnFailure"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _engine_pods(tree: str) -> list[Doc]:
    return [w for w in _workers(tree) if _engine_served(w)]


def test_the_gpu_overlay_serves_a_version_through_an_engine_server() -> None:
    assert _engine_pods("gpu")
    assert not _engine_pods("base") and not _engine_pods("cpu")  # an engine needs its GPU


@pytest.mark.parametrize("tree", TREES)
def test_an_engine_served_version_is_its_engine_and_its_worker_in_one_pod(tree: str) -> None:
    """The engine holds the GPU and the model volume; the worker calls it on the pod's
    loopback, at the port the engine listens on, naming the model it serves."""
    for deploy in _engine_pods(tree):
        name = deploy["metadata"]["name"]
        pod = _pod(deploy)
        engine, worker = _engine(deploy), _graylane(deploy)
        assert engine is not None and [c["name"] for c in pod["containers"]] == [ENGINE, "worker"]
        assert "initContainers" not in pod, "nothing to fetch: the engine reads its model"
        # the GPU is the engine's, and the pod tolerates GPU nodes' taint
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert "nvidia.com/gpu" not in worker["resources"]["limits"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        # probes: the engine's on its port; the kubelet reaches them at the pod's address
        argv = engine["args"]
        port = int(_flag(argv, "--port"))
        assert _flag(argv, "--host") == "0.0.0.0"
        assert engine["ports"] == [{"name": ENGINE, "containerPort": port, "protocol": "TCP"}]
        startup = engine["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "model load"
        assert engine["livenessProbe"]["failureThreshold"] >= 3
        # the worker calls its engine over loopback, names its model and its slots
        args = build_parser().parse_args(worker["command"][1:])
        (endpoint,) = args.endpoint
        variant, _, url = endpoint.partition("=")
        assert url == f"http://127.0.0.1:{port}" and variant, name
        assert not args.from_registry and not args.require_tensorrt
        image = engine["image"].rsplit("/", 1)[-1]
        assert image.startswith("vllm-openai:v") and args.engine == "vllm"
        assert args.engine_version == image.rsplit(":v", 1)[1]
        assert args.engine_model == _flag(argv, "--served-model-name")
        assert args.engine_slots == int(_flag(argv, "--max-num-seqs"))
        # the worker's readiness is its /readyz (engine_up among its conditions)
        assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        # the model comes from a volume, read-only, mounted in the engine only
        volumes = {v["name"]: v for v in pod["volumes"]}
        (model,) = [m for m in engine["volumeMounts"] if argv[0].startswith(m["mountPath"] + "/")]
        assert model["readOnly"] is True
        claim = volumes[model["name"]]["persistentVolumeClaim"]
        assert claim == {"claimName": "graylane-engine-models", "readOnly": True}
        assert model["name"] not in {m["name"] for m in worker["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in engine["env"]}
        assert env["HF_HUB_OFFLINE"] == "1", "the model is the volume's, never the hub's"
        # stopping: the engine outlives the worker's last calls, within the grace period
        stop = engine["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert 0 < stop < pod["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("tree", TREES)
def test_the_router_and_the_topic_job_know_every_engine_served_version(tree: str) -> None:
    deployments = {d["metadata"]["name"]: d for d in _of(tree, "Deployment")}
    router = build_parser().parse_args(_graylane(deployments["router"])["command"][1:])
    stable = dict(m.partition("=")[::2] for m in router.model)
    for deploy in _engine_pods(tree):
        labels = deploy["metadata"]["labels"]
        assert stable[labels["graylane.io/model"]] == labels["graylane.io/version"]


@pytest.mark.parametrize("tree", TREES)
def test_nothing_but_the_pod_itself_reaches_an_engine(tree: str) -> None:
    """No Service selects an engine-served pod, and no NetworkPolicy admits its engine's
    port: only the worker beside it (over loopback, which policies do not govern)."""
    policies = _of(tree, "NetworkPolicy")
    for deploy in _engine_pods(tree):
        labels = deploy["spec"]["template"]["metadata"]["labels"]
        engine = _engine(deploy)
        assert engine is not None
        port = engine["ports"][0]["containerPort"]
        selecting = [
            p for p in policies if _selects(p["spec"]["podSelector"].get("matchLabels", {}), labels)
        ]
        assert "default-deny" in {p["metadata"]["name"] for p in selecting}
        admitted = {
            (rule_port["port"])
            for p in selecting
            for rule in p["spec"].get("ingress", [])
            for rule_port in rule.get("ports", [])
        }
        assert admitted == {9100}, "monitoring scrapes the worker; nothing reaches the engine"
        assert port not in admitted
        for service in _of(tree, "Service"):
            assert not _selects(service["spec"]["selector"], labels), service["metadata"]["name"]
        # the worker still reaches Kafka: the services' egress policy selects the pod
        assert "graylane-services" in {p["metadata"]["name"] for p in selecting}


LOCAL_ENGINE = K8S / "local-llamacpp"


def test_the_local_engine_pod_is_valid_and_its_worker_calls_its_engine() -> None:
    """deploy/k8s/local-llamacpp (played by tests/integration/test_kube_play_engine.py):
    llama-server and the worker in one host-network pod, the model a read-only hostPath."""
    docs = render(LOCAL_ENGINE)
    for doc in docs:
        validate(doc)
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = _pod(deploy)
    assert pod["hostNetwork"] is True and _engine_served(deploy)
    engine, worker = _engine(deploy), _graylane(deploy)
    assert engine is not None
    assert engine["image"].startswith("localhost/graylane-llamacpp:")
    assert worker["image"].startswith("localhost/graylane:")
    argv = engine["args"]
    port = int(_flag(argv, "--port"))
    assert _flag(argv, "--host") == "127.0.0.1"  # the host's loopback, not its interfaces
    assert "--metrics" in argv  # the worker reads the engine's load there
    args = build_parser().parse_args(worker["command"][1:])
    assert args.endpoint == [f"q4_1=http://127.0.0.1:{port}"] and args.engine == "llamacpp"
    assert args.engine_slots == int(_flag(argv, "--parallel"))
    assert args.engine_model == _flag(argv, "--alias")
    (model,) = [
        m for m in engine["volumeMounts"] if _flag(argv, "--model").startswith(m["mountPath"])
    ]
    volume = {v["name"]: v for v in pod["volumes"]}[model["name"]]
    assert model["readOnly"] is True and volume["hostPath"]["type"] == "Directory"
    assert Path(_flag(argv, "--model")).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    for c in pod["containers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsUser"] == 10001
    env = {e["name"]: e["value"] for e in worker["env"]}
    metrics = int(env["GRAYLANE_METRICS_PORT"])
    assert {p["containerPort"] for p in worker["ports"]} == {metrics} != {port}
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config["data"]["GRAYLANE_SECURITY_PROTOCOL"] == "PLAINTEXT"
    assert "GRAYLANE_TRUSTED_KEYS" not in config["data"]  # refused without --from-registry


def test_graylane_deploy_writes_the_workers_the_base_holds() -> None:
    """The generated worker pod (``graylane deploy``) reads its secrets from the same
    files, requires the same keys and mounts the same volumes as the checked-in base."""
    from graylane.app.k8s.workers import WorkerPlan, worker_manifests
    from graylane.artifacts.naming import ArtifactName, Precision, SemVer

    name = ArtifactName(
        "demo-gpt", Backend.ONNXRUNTIME, "1.23", Precision.FP32, "demo", SemVer(1, 0, 0)
    )
    plan = WorkerPlan(model="demo-gpt", version="1.0.0", image_name=name, variants=("fp32",))
    generated = _pod(worker_manifests(plan)[0])
    (base,) = [
        d for d in _of("base", "Deployment") if d["metadata"]["name"] == "worker-demo-gpt-1-0-0"
    ]
    checked_in = _pod(base)
    assert generated["volumes"] == checked_in["volumes"]
    for made, kept in zip(
        [*generated["initContainers"], *generated["containers"]],
        [*checked_in["initContainers"], *checked_in["containers"]],
        strict=True,
    ):
        assert made["env"] == kept["env"] and made["volumeMounts"] == kept["volumeMounts"]
