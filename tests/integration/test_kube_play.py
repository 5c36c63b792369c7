"""The Kubernetes pod specs, started as written: ``deploy/k8s/overlays/local`` rendered by
the real kustomize and run with ``podman kube play`` on the CPU image built here.

Router, two workers, policy engine, control plane, audit sink and gateway come up from the
base's container commands, env, ConfigMaps, Secrets, securityContext and probes (the
overlay adds host networking, a metrics port per service, the local broker and hostPath
folders). Each one's ``/readyz`` answers, a request flows end to end, and a canary started
through the control plane's TLS endpoint (the CLI, as an operator would) is promoted.

The test sets three things in the rendered objects and nothing else: a topic prefix of its
own and the local broker's address in the ConfigMap, and its own hostPath folders. It
creates the topics (what a topic-creation Job does in a cluster) and the control plane's
TLS Secret (a fresh self-signed certificate). Services, PodDisruptionBudgets,
NetworkPolicies, KEDA objects and the PVC are not started by podman: they stay validated
against their schemas (tests/unit/test_k8s_manifests.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from graylane import serde
from graylane.app.demo.build_versions import build_versions
from graylane.client import GraylaneClient
from graylane.deploy.containers.images import BuiltImage
from graylane.deploy.containers.podman import KubePlay, Podman
from graylane.deploy.containers.tools import KUSTOMIZE
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import KafkaFactory
from graylane.registry import open_registry
from graylane.settings import Settings
from graylane.v1 import rollout_pb2
from tests.conftest import ROOT
from tests.support.containers import cpu_image, podman
from tests.support.policy import RoutingWatch, steady_load
from tests.support.waiting import wait_until

__all__ = ["cpu_image", "podman"]

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


def render() -> list[dict[str, Any]]:
    out = KUSTOMIZE.run("build", str(OVERLAY))
    return [d for d in yaml.safe_load_all(out) if d]


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


def localize(docs: list[dict[str, Any]], settings: Settings, host: Path) -> list[dict[str, Any]]:
    """Our topic prefix and broker in the ConfigMap, our folders as the hostPaths."""
    started = []
    for doc in docs:
        if doc["kind"] not in STARTED_KINDS:
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
    await ensure_topics(
        factory,
        factory.layout.shared_specs() + factory.layout.model_specs(MODEL, [BASE, CANDIDATE]),
    )
    docs = render()
    secret, ca = tls_secret(tmp_path)
    started = [secret, *localize(docs, settings, host)]  # Secrets before the pods using them
    ports = metrics_ports(started)
    print(f"rendered and prepared in {time.monotonic() - t0:.0f}s: {sorted(ports)}")
    with played(podman, started, tmp_path):
        t_play = time.monotonic()

        def all_ready() -> bool:
            return all(ready(p) for p in ports.values())

        await wait_until(all_ready, timeout=300, what="every pod's /readyz")
        print(f"every pod ready {time.monotonic() - t_play:.0f}s after kube play")
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
