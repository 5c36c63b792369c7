"""The Kubernetes pod specs, started as written: ``deploy/k8s/overlays/local`` rendered by
the real kustomize and run with ``podman kube play`` on the CPU image built here.

Router, two workers, policy engine, control plane, audit sink and gateway come up from the
base's container commands, env, ConfigMaps, Secrets, securityContext and probes (the
overlay adds host networking, a metrics port per service, the local broker and hostPath
folders). Each one's ``/readyz`` answers, a request flows end to end, and a canary started
through the control plane's TLS endpoint (the CLI, as an operator would) is promoted.

The test sets three things in the rendered objects and nothing else: a topic prefix of its
own and the local broker's address in the ConfigMap, and its own hostPath folders; it pins
the image by the digest it was built with. The topic Job runs first (its pod template
played as a Pod: this podman plays no Jobs) and must exit 0. The control plane's TLS
Secret is a fresh self-signed certificate. Services, PodDisruptionBudgets,
NetworkPolicies and KEDA objects are not started by podman: they stay validated
against their schemas (tests/unit/test_k8s_manifests.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from graylane import serde
from graylane.app.demo.build_versions import build_versions
from graylane.client import GraylaneClient
from graylane.deploy.containers.images import BuiltImage
from graylane.deploy.containers.podman import KubePlay, Podman, job_as_pod
from graylane.deploy.containers.tools import KUSTOMIZE
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import KafkaFactory
from graylane.registry.repository import open_registry
from graylane.settings import Settings
from graylane.v1 import rollout_pb2
from tests.conftest import ROOT
from tests.support.policy import RoutingWatch, steady_load
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.slow,
    pytest.mark.containers,
    pytest.mark.timeout(2400),
]

OVERLAY = ROOT / "deploy" / "k8s" / "overlays" / "local"
MODEL, BASE, CANDIDATE = "demo-gpt", "1.0.0", "1.1.0"
STARTED_KINDS = frozenset({"Deployment", "ConfigMap", "Secret"})
OPERATOR_TOKEN = "local-operator-token-0123456"
SERVICE_UID = 10001


def render(folder: Path, image: BuiltImage | None = None) -> list[dict[str, Any]]:
    """The local overlay by the real kustomize; with ``image``, its reference by digest."""
    kust = folder / "pinned"
    kust.mkdir(exist_ok=True)
    images = [{"name": image.ref.rsplit(":", 1)[0], "digest": image.digest}] if image else []
    (kust / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(OVERLAY, kust)],
                "images": images,
            }
        )
    )
    out = KUSTOMIZE.run("build", "--load-restrictor", "LoadRestrictionsNone", str(kust))
    return [d for d in yaml.safe_load_all(out) if d]


def test_the_local_overlay_is_valid_kubernetes(tmp_path: Path) -> None:
    """Rendered by the real kustomize, every object validates against the 1.31 schemas
    (KEDA's are checked in tests/unit/test_k8s_manifests.py with the base)."""
    docs = render(tmp_path)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ConfigMap", "Secret"} <= kinds
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        kubernetes_validate.validate(doc, "1.31", strict=True)
    for doc in docs:
        if doc["kind"] == "Deployment":
            pod = doc["spec"]["template"]["spec"]
            assert pod["hostNetwork"] is True
            assert all(c["image"] == "localhost/graylane:0.1.0" for c in pod["containers"])


def metrics_ports(docs: list[dict[str, Any]]) -> dict[str, int]:
    ports: dict[str, int] = {}
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"]
        ports[doc["metadata"]["name"]] = port
    return ports


def tls_secret(folder: Path) -> tuple[dict[str, Any], Path]:
    """A self-signed certificate for 127.0.0.1, as the graylane-controlplane-tls Secret."""
    crt, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=controlplane",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
    )
    data = {
        n: base64.b64encode(p.read_bytes()).decode()
        for n, p in (("tls.crt", crt), ("tls.key", key))
    }
    doc = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": "graylane-controlplane-tls", "namespace": "graylane"},
        "data": data,
    }
    return doc, crt


def localize(
    docs: list[dict[str, Any]], settings: Settings, host: Path, *, jobs: bool = False
) -> list[dict[str, Any]]:
    """Our topic prefix and broker in the ConfigMap, our folders as the hostPaths; with
    ``jobs`` the Jobs (as Pods) in place of the Deployments."""
    started = []
    for doc in docs:
        if jobs and doc["kind"] == "Job":
            doc = job_as_pod(doc)
        elif doc["kind"] not in STARTED_KINDS or (jobs and doc["kind"] == "Deployment"):
            continue
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "graylane-config":
            doc["data"]["GRAYLANE_TOPIC_PREFIX"] = settings.topic_prefix
            doc["data"]["GRAYLANE_BOOTSTRAP_SERVERS"] = settings.bootstrap_servers
        if doc["kind"] == "Deployment":
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                if "hostPath" in volume:
                    name = Path(volume["hostPath"]["path"]).name
                    volume["hostPath"]["path"] = str(host / name)
        started.append(doc)
    return started


def host_ports(docs: list[dict[str, Any]]) -> set[int]:
    """Every port the host-network pods will listen on (metrics, gRPC, HTTP)."""
    return {
        p["containerPort"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
    }


def busy(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as res:
            return bool(res.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def played(podman: Podman, docs: list[dict[str, Any]], folder: Path) -> Iterator[KubePlay]:
    play = KubePlay.start(podman, docs, folder / "local.yaml")
    try:
        yield play
    finally:
        for pod in play.pods():
            if pod.startswith(("router", "gateway", "policy", "controlplane", "audit", "worker")):
                (folder / f"{pod}.log").write_text(play.logs(pod))
        play.down()


async def create_topics(podman: Podman, docs: list[dict[str, Any]], folder: Path) -> None:
    """The topic Job's pod, played and waited for: it must exit 0."""
    (job,) = [d for d in docs if d["kind"] == "Pod"]
    (container,) = job["spec"]["containers"]
    play = KubePlay.start(podman, docs, folder / "topics.yaml")
    try:
        name = f"{job['metadata']['name']}-{container['name']}"
        res = await asyncio.to_thread(podman.run, ["wait", name], check=False, timeout=300)
        logs = podman.run(["logs", name], check=False)
        assert res.stdout.strip() == "0", logs.stdout + logs.stderr
    finally:
        play.down()


def cli(*argv: str, env: dict[str, str]) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "graylane.app.cli.main", *argv],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


async def one_request(factory: KafkaFactory) -> None:
    async with GraylaneClient(factory) as client:
        request_id = await client.submit(MODEL, token_ids=[1, 2, 3], routing_key="user-1")
        async with asyncio.timeout(120):
            async for result in client.results():
                if result.request_id == request_id:
                    assert result.code is None, result
                    return


async def test_the_local_overlay_runs_every_pod_serves_and_promotes_a_canary(
    podman: Podman, cpu_image: BuiltImage, settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    host = tmp_path / "host"
    (host / "state").mkdir(parents=True)
    (host / "models").mkdir()
    build = replace(
        settings, artifact_dir=host / "models", db_url=f"sqlite:///{host / 'state' / 'registry.db'}"
    )
    build_versions(build, MODEL, {BASE: 1, CANDIDATE: 2}, size="tiny", precisions=("fp32",))
    registry = open_registry(build.db_url)
    registry.set_stable(MODEL, BASE)
    registry.engine.dispose()
    for path in [host, *host.rglob("*")]:
        os.chown(path, SERVICE_UID, SERVICE_UID)
    docs = render(tmp_path, cpu_image)  # the image by digest, as built
    secret, ca = tls_secret(tmp_path)
    started = [secret, *localize(docs, settings, host)]  # Secrets before the pods using them
    ports = metrics_ports(started)
    taken = sorted(p for p in host_ports(started) if busy(p))
    assert not taken, f"ports the local overlay's pods listen on are in use: {taken}"
    print(f"rendered and prepared in {time.monotonic() - t0:.0f}s: {sorted(ports)}")
    await create_topics(podman, [secret, *localize(docs, settings, host, jobs=True)], tmp_path)
    print(f"topics created by the Job's pod {time.monotonic() - t0:.0f}s in")
    with played(podman, started, tmp_path):
        t_play = time.monotonic()

        def all_ready() -> bool:
            return all(ready(p) for p in ports.values())

        await wait_until(all_ready, timeout=300, what="every pod's /readyz")
        print(f"every pod ready {time.monotonic() - t_play:.0f}s after kube play")
        images = {
            c["image"]
            for d in started
            if d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"]
        }
        assert images == {cpu_image.pinned}
        await one_request(factory)
        env = {"GRAYLANE_CP_ADDR": "127.0.0.1:50051", "GRAYLANE_CP_TOKEN": OPERATOR_TOKEN}
        async with RoutingWatch(factory, MODEL) as routing, steady_load(factory, MODEL, 20.0):
            out = cli(
                "rollout",
                "start",
                "--ca",
                str(ca),
                "--model",
                MODEL,
                "--candidate",
                CANDIDATE,
                "--steps",
                "10,50,100",
                "--min-samples",
                "10",
                "--dwell-s",
                "2",
                env=env,
            )
            match = re.search(r"ro-[\w.:-]+", out)
            assert match, out
            _, final = await routing.until(lambda t: t.stable_version == CANDIDATE, 180)
        assert routing.weight(final, CANDIDATE) == 100.0
        states = await read_latest_per_key(factory, factory.layout.rollouts())
        state = serde.decode(rollout_pb2.RolloutState, states[match.group(0).encode()])
        assert state.phase == rollout_pb2.PROMOTED
        print(f"canary promoted {time.monotonic() - t_play:.0f}s after kube play")
