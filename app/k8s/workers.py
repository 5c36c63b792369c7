"""The per-version worker manifests: Deployment, KEDA ScaledObject, PodDisruptionBudget.

A :class:`WorkerPlan` in, plain manifest dicts out (pure), in the same shape as the
checked-in ``deploy/k8s`` workers (locked-down pod, probes on ``/healthz``/``/readyz``,
artifacts mounted read-only, credentials from Secrets: the worker role's own Kafka login
over TLS and a read-only database role, scaling on the version topic's lag
and on ``graylane_desired_replicas``). :func:`plan_from_registry` makes the plan from
what the registry holds for one model version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graylane.artifacts.naming import ArtifactName, Backend, Precision
from graylane.errors import GraylaneError
from graylane.registry.repository import Registry
from graylane.topics import TopicLayout

__all__ = [
    "ARTIFACT_DIR",
    "ARTIFACT_KEYS_DIR",
    "ARTIFACT_KEYS_SECRET",
    "CPU_RESOURCES",
    "GPU_ARCHES",
    "GPU_RESOURCES",
    "HARDWARE_COMPATIBLE_FROM",
    "GpuArch",
    "NothingToDeploy",
    "Resources",
    "WorkerPlan",
    "fetch_container",
    "gpu_affinity",
    "pick_image",
    "plan_from_registry",
    "worker_manifests",
]


Doc = dict[str, Any]
METRICS_PORT = 9100
UID = 10001
KAFKA_SECRET = "graylane-kafka-worker"
ARTIFACT_DIR = "/models"
"""Where the init container fetches a version's artifacts (an emptyDir) and the worker reads
them (read-only; GRAYLANE_ARTIFACT_DIR in the ConfigMap)."""
ARTIFACT_KEYS_SECRET = "graylane-artifact-keys"
"""Secret of trusted public keys (``*.pub``), not optional: with GRAYLANE_REQUIRE_SIGNATURES
(the ConfigMap's default) a pod whose key folder is empty refuses to start."""
ARTIFACT_KEYS_DIR = "/etc/graylane/artifact-keys"
"""The worker role's Kafka login (one Secret per role, see ``graylane.acls.KafkaRole``)."""


@dataclass(frozen=True)
class GpuArch:
    """A GPU architecture: its GPU Feature Discovery product label and compute capability."""

    name: str
    product: str
    compute_capability: str


GPU_ARCHES: Mapping[str, GpuArch] = {
    a.name: a
    for a in (
        GpuArch("t4", "Tesla-T4", "7.5"),
        GpuArch("a100", "NVIDIA-A100-SXM4-80GB", "8.0"),
        GpuArch("a10g", "NVIDIA-A10G", "8.6"),
        GpuArch("l4", "NVIDIA-L4", "8.9"),
        GpuArch("h100", "NVIDIA-H100-80GB-HBM3", "9.0"),
    )
}


@dataclass(frozen=True, kw_only=True)
class Resources:
    cpu_request: str = "1"
    memory_request: str = "1Gi"
    cpu_limit: str = "2"
    memory_limit: str = "2Gi"
    gpus: int = 0

    def spec(self) -> Doc:
        limits: Doc = {"cpu": self.cpu_limit, "memory": self.memory_limit}
        if self.gpus:
            limits["nvidia.com/gpu"] = str(self.gpus)
        return {
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": limits,
        }


CPU_RESOURCES = Resources()
GPU_RESOURCES = Resources(
    cpu_request="2", memory_request="8Gi", cpu_limit="4", memory_limit="16Gi", gpus=1
)


HARDWARE_COMPATIBLE_FROM = (8, 0)
"""A hardware-compatible (portable) TensorRT engine runs on Ampere (8.0) and later."""


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def gpu_affinity(capabilities: Sequence[str]) -> Doc:
    """Required node affinity: a node whose GPU has one of ``capabilities`` ("major.minor"),
    read from the GPU Feature Discovery labels ``nvidia.com/gpu.compute.major``/``.minor``."""
    terms = []
    for cc in sorted(set(capabilities), key=_cc, reverse=True):
        major, minor = _cc(cc)
        terms.append(
            {
                "matchExpressions": [
                    {
                        "key": "nvidia.com/gpu.compute.major",
                        "operator": "In",
                        "values": [str(major)],
                    },
                    {
                        "key": "nvidia.com/gpu.compute.minor",
                        "operator": "In",
                        "values": [str(minor)],
                    },
                ]
            }
        )
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


@dataclass(frozen=True, kw_only=True)
class WorkerPlan:
    """What one worker Deployment runs: which version, which image, where, how big."""

    model: str
    version: str
    image_name: ArtifactName
    """The artifact whose name is the image's (``<model>-<backend><v>-<prec>-<strategy>``)."""
    variants: tuple[str, ...]
    image_registry: str = "ghcr.io/graylane"
    gpu_capabilities: tuple[str, ...] = ()
    """Compute capabilities its TensorRT engines run on; empty: a CPU worker."""
    resources: Resources = CPU_RESOURCES
    max_replicas: int = 6
    layout: TopicLayout = field(default_factory=TopicLayout)
    bootstrap_servers: str = "kafka-bootstrap.kafka.svc:9092"
    prometheus_url: str = "http://prometheus.monitoring.svc:9090"
    lag_threshold: int = 100

    def __post_init__(self) -> None:
        if (self.image_name.model, str(self.image_name.version)) != (self.model, self.version):
            raise ValueError(f"image {self.image_name} is not of {self.model} {self.version}")
        if not self.variants:
            raise ValueError(f"{self.model} {self.version} has no servable variant")
        if self.max_replicas < 1:
            raise ValueError("max_replicas must be >= 1")

    @property
    def name(self) -> str:
        base = f"worker-{self.model}-{self.version.replace('.', '-').replace('+', '-')}"
        return base

    @property
    def image(self) -> str:
        return f"{self.image_registry.rstrip('/')}/{self.image_name}"

    def labels(self) -> dict[str, str]:
        labels = {
            "app.kubernetes.io/name": "graylane",
            "app.kubernetes.io/part-of": "graylane",
            "app.kubernetes.io/component": "worker",
            "graylane.io/model": self.model,
            "graylane.io/version": self.version,
        }
        return labels

    def selector(self) -> dict[str, str]:
        return {k: v for k, v in self.labels().items() if k != "app.kubernetes.io/part-of"}


KAFKA_LOGIN_DIR = "/etc/graylane/kafka-login"
DATABASE_DIR = "/etc/graylane/database"
DATABASE_SECRET = "graylane-database-readonly"
_KAFKA_LOGIN_KEYS = ("username", "password", "mechanism")


def _file_env(setting: str, folder: str, key: str) -> Doc:
    """A secret setting read from a file of a Secret volume (``GRAYLANE_<NAME>_FILE``):
    never an environment variable, which child processes and /proc show."""
    return {"name": f"GRAYLANE_{setting}_FILE", "value": f"{folder}/{key}"}


def _secret_volume(name: str, secret: str, keys: tuple[str, ...]) -> Doc:
    return {
        "name": name,
        "secret": {
            "secretName": secret,
            "defaultMode": 0o444,
            "items": [{"key": k, "path": k} for k in keys],
        },
    }


def _mount(name: str, path: str) -> Doc:
    return {"name": name, "mountPath": path, "readOnly": True}


def _probe(path: str, period: int, failures: int, timeout: int | None = None) -> Doc:
    probe: Doc = {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "failureThreshold": failures,
    }
    if timeout is not None:
        probe["timeoutSeconds"] = timeout
    return probe


def _locked_down() -> Doc:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _keys_env() -> Doc:
    return {"name": "GRAYLANE_TRUSTED_KEYS", "value": ARTIFACT_KEYS_DIR}


def _keys_mount() -> Doc:
    return {"name": "artifact-keys", "mountPath": ARTIFACT_KEYS_DIR, "readOnly": True}


def fetch_container(plan: WorkerPlan) -> Doc:
    """The init container filling the worker's artifact folder (``graylane artifacts fetch``
    from GRAYLANE_ARTIFACT_STORE, verified by sha256 and, with keys, signature). A CPU
    worker fetches its ONNX Runtime variants only: no TensorRT engine it could not run. A
    GPU worker's init container sees the pod's GPU and fetches, per precision, the engine
    the worker will load on it (``--this-gpu``), and the ONNX variants."""
    return {
        "name": "fetch-artifacts",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "graylane",
            "artifacts",
            "fetch",
            "--model",
            plan.model,
            "--version",
            plan.version,
            "--into",
            ARTIFACT_DIR,
            *(["--this-gpu"] if plan.gpu_capabilities else ["--backend", "onnxruntime"]),
        ],
        "envFrom": [{"configMapRef": {"name": "graylane-config"}}],
        "env": [_file_env("DB_URL", DATABASE_DIR, "url"), _keys_env()],
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {
                "cpu": "1",
                "memory": "512Mi",
                # the pod's GPU (kubelet hands an init container's devices on to the worker)
                **({"nvidia.com/gpu": "1"} if plan.gpu_capabilities else {}),
            },
        },
        "securityContext": _locked_down(),
        "volumeMounts": [
            _mount("database", DATABASE_DIR),
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "models", "mountPath": ARTIFACT_DIR},
            _keys_mount(),
        ],
    }


def _container(plan: WorkerPlan) -> Doc:
    return {
        "name": "worker",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "graylane",
            "serve",
            "worker",
            "--model",
            plan.model,
            "--version",
            plan.version,
            "--from-registry",
            *(["--require-tensorrt"] if plan.gpu_capabilities else []),
        ],
        "envFrom": [{"configMapRef": {"name": "graylane-config"}}],
        "env": [
            _file_env("SASL_USERNAME", KAFKA_LOGIN_DIR, "username"),
            _file_env("SASL_PASSWORD", KAFKA_LOGIN_DIR, "password"),
            _file_env("SASL_MECHANISM", KAFKA_LOGIN_DIR, "mechanism"),
            _file_env("DB_URL", DATABASE_DIR, "url"),
            _keys_env(),
        ],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "startupProbe": _probe("/healthz", 5, 60),
        "livenessProbe": _probe("/healthz", 10, 3, 2),
        "readinessProbe": _probe("/readyz", 5, 2, 2),
        "resources": plan.resources.spec(),
        "securityContext": _locked_down(),
        "volumeMounts": [
            _mount("kafka-login", KAFKA_LOGIN_DIR),
            _mount("database", DATABASE_DIR),
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "kafka-ca", "mountPath": "/etc/graylane/kafka-ca", "readOnly": True},
            {"name": "models", "mountPath": ARTIFACT_DIR, "readOnly": True},
            _keys_mount(),
        ],
    }


def _deployment(plan: WorkerPlan) -> Doc:
    pod: Doc = {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 30,
        "initContainers": [fetch_container(plan)],
        "containers": [_container(plan)],
        "volumes": [
            _secret_volume("database", DATABASE_SECRET, ("url",)),
            _secret_volume("kafka-login", KAFKA_SECRET, _KAFKA_LOGIN_KEYS),
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            {
                "name": "kafka-ca",
                "secret": {"secretName": "graylane-kafka-ca", "defaultMode": 0o444},
            },
            {"name": "models", "emptyDir": {"sizeLimit": "50Gi"}},
            {
                "name": "artifact-keys",
                "secret": {
                    "secretName": ARTIFACT_KEYS_SECRET,
                    "defaultMode": 0o444,
                },
            },
        ],
    }
    if plan.gpu_capabilities:
        # One Deployment for every GPU an engine exists for: the worker picks the engine
        # matching its GPU at start (graylane.artifacts.compatibility.select_engine).
        pod["affinity"] = gpu_affinity(plan.gpu_capabilities)
        pod["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": plan.name,
            "labels": plan.labels(),
            "annotations": {"graylane.io/variants": ",".join(plan.variants)},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": plan.selector()},
            "template": {
                "metadata": {
                    "labels": plan.labels(),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(METRICS_PORT),
                    },
                },
                "spec": pod,
            },
        },
    }


def _scaled_object(plan: WorkerPlan) -> Doc:
    layout = plan.layout
    query = f'max(graylane_desired_replicas{{model="{plan.model}",version="{plan.version}"}})'
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": plan.name, "labels": plan.labels()},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": plan.name},
            "minReplicaCount": 1,
            "maxReplicaCount": plan.max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}
                }
            },
            "triggers": [
                {
                    "type": "kafka",
                    "name": "version-topic-lag",
                    "metadata": {
                        "bootstrapServers": plan.bootstrap_servers,
                        "consumerGroup": f"{layout.prefix}-worker-{plan.model}-{plan.version}",
                        "topic": layout.version_requests(plan.model, plan.version),
                        "lagThreshold": str(plan.lag_threshold),
                        "offsetResetPolicy": "latest",
                        "allowIdleConsumers": "false",
                    },
                    "authenticationRef": {"name": "graylane-keda-kafka"},
                },
                {
                    "type": "prometheus",
                    "name": "policy-desired-replicas",
                    "metadata": {
                        "serverAddress": plan.prometheus_url,
                        "query": query,
                        "threshold": "1",
                    },
                },
            ],
        },
    }


def _budget(plan: WorkerPlan) -> Doc:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": plan.name, "labels": plan.labels()},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": plan.selector()}},
    }


def worker_manifests(plan: WorkerPlan, namespace: str = "graylane") -> list[Doc]:
    """Deployment, ScaledObject and PodDisruptionBudget of one worker, in ``namespace``."""
    docs = [_deployment(plan), _scaled_object(plan), _budget(plan)]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return docs


def pick_image(names: Sequence[ArtifactName]) -> ArtifactName:
    """The image of a worker that loads all of ``names``: its best-precision artifact."""
    order = {p: i for i, p in enumerate(Precision)}
    return min(names, key=lambda n: (order[n.precision], str(n)))


# -- the plan from the registry ---------------------------------------------------------------


class NothingToDeploy(GraylaneError, LookupError):
    """The registry holds no servable artifact of the version for the requested target."""


def plan_from_registry(
    registry: Registry,
    model: str,
    version: str,
    *,
    gpu: bool = False,
    layout: TopicLayout,
    **options: object,
) -> WorkerPlan:
    """CPU: the servable ONNX Runtime variants. GPU: the TensorRT engines of the version,
    on every compute capability one was built for (a portable engine: every known GPU from
    Ampere on; ONNX Runtime variants of other precisions ride along); the image is named
    after the best-precision artifact of the kind the worker runs."""
    info = registry.get_version(model, version)  # raises UnknownVersion
    servable = [a for a in registry.list_artifacts(model, version) if a.servable]
    onnx = [a for a in servable if a.backend is Backend.ONNXRUNTIME]
    capabilities: set[str] = set()
    if not gpu:
        primary = onnx
    else:
        primary = [a for a in servable if a.backend is Backend.TENSORRT]
        for art in primary:
            if art.gpu_compute_capability is not None:
                capabilities.add(art.gpu_compute_capability)
            else:
                capabilities |= {
                    g.compute_capability
                    for g in GPU_ARCHES.values()
                    if _cc(g.compute_capability) >= HARDWARE_COMPATIBLE_FROM
                }
    if not primary:
        kind = "ONNX Runtime" if not gpu else "TensorRT"
        served = sorted({a.backend.value for a in servable if a.backend.is_engine_server})
        raise NothingToDeploy(
            f"{model} {info.version}: no servable {kind} artifact registered"
            + (f" (engine servers serve it: {', '.join(served)})" if served else "")
        )
    variants = sorted({a.precision.value for a in primary} | {a.precision.value for a in onnx})
    return WorkerPlan(
        model=model,
        version=str(info.version),
        image_name=pick_image([a.name for a in primary]),
        variants=tuple(variants),
        gpu_capabilities=tuple(sorted(capabilities, key=_cc, reverse=True)),
        resources=GPU_RESOURCES if gpu else CPU_RESOURCES,
        layout=layout,
        **options,  # type: ignore[arg-type]
    )
