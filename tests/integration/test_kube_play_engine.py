"""An engine-served version's pod, started as written: ``deploy/k8s/local-llamacpp``
rendered by the real kustomize and played with ``podman kube play``.

The pod holds llama.cpp's ``llama-server`` (the image built here FROM the Debian base,
SmolLM2-135M-Instruct Q4_1 mounted read-only from the set-up's cache) and the Graylane
worker of smollm2 1.0.0 (the CPU image), which reaches the engine on the pod's loopback.
The engine answers ``/health`` inside the pod, the worker becomes ready, and a real
generation sent through Kafka, routed by a router running here, comes back in English
from the model.

The test sets in the rendered objects only what makes the run its own: its topic prefix
and the local broker's address in the ConfigMap, free ports for the engine and the
worker's metrics (the pod shares the host network), and the cache folder as the model's
hostPath; it pins both images by the digests they were built with.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from graylane.client import GraylaneClient, Task
from graylane.deploy.containers.engine_images import llamacpp_cache
from graylane.deploy.containers.images import BuiltImage
from graylane.deploy.containers.podman import KubePlay, Podman
from graylane.deploy.containers.tools import KUSTOMIZE
from graylane.kafka.admin import ensure_topics
from graylane.kafka.seam import KafkaFactory
from graylane.services.router.service import Router, RouterConfig
from graylane.settings import Settings
from graylane.v1 import inference_pb2
from tests.conftest import ROOT
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.slow,
    pytest.mark.containers,
    pytest.mark.timeout(1800),
]

FOLDER = ROOT / "deploy" / "k8s" / "local-llamacpp"
DEPLOYMENT = "worker-smollm2-1-0-0"
MODEL, VERSION = "smollm2", "1.0.0"
ENGINE_PORT, METRICS_PORT = 8081, 29110  # as written in the pod spec
# Greedy SmolLM2-135M at Q4_1 answers the bare question with "L'Étoile, la Marseillaise,
# ..." under its own chat template; asked for one word it answers in English.
QUESTION = "What is the capital of France? Answer in one word."


def render(folder: Path, images: list[BuiltImage]) -> list[dict[str, Any]]:
    """The pod spec by the real kustomize, each image by the digest it was built with."""
    kust = folder / "pinned"
    kust.mkdir(exist_ok=True)
    (kust / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(FOLDER, kust)],
                "images": [{"name": i.ref.rsplit(":", 1)[0], "digest": i.digest} for i in images],
            }
        )
    )
    out = KUSTOMIZE.run("build", "--load-restrictor", "LoadRestrictionsNone", str(kust))
    return [d for d in yaml.safe_load_all(out) if d]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _containers(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["spec"]["template"]["spec"]["containers"]}


def localize(
    docs: list[dict[str, Any]], settings: Settings, models: Path, engine: int, metrics: int
) -> list[dict[str, Any]]:
    """Our prefix and broker, our ports (in every place the spec names them), our models."""
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            doc["data"]["GRAYLANE_TOPIC_PREFIX"] = settings.topic_prefix
            doc["data"]["GRAYLANE_BOOTSTRAP_SERVERS"] = settings.bootstrap_servers
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]
        pod["metadata"]["annotations"]["prometheus.io/port"] = str(metrics)
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "model"]
        volume["hostPath"]["path"] = str(models)
        containers = _containers(doc)
        args = containers["engine"]["args"]
        assert args[args.index("--port") + 1] == str(ENGINE_PORT)
        args[args.index("--port") + 1] = str(engine)
        command = containers["worker"]["command"]
        endpoint = command.index("--endpoint") + 1
        assert command[endpoint] == f"q4_1=http://127.0.0.1:{ENGINE_PORT}"
        command[endpoint] = f"q4_1=http://127.0.0.1:{engine}"
        for name, port in (("engine", engine), ("worker", metrics)):
            for declared in containers[name]["ports"]:
                declared["containerPort"] = port
        for env in containers["worker"]["env"]:
            if env["name"] == "GRAYLANE_METRICS_PORT":
                env["value"] = str(metrics)
    return docs


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as res:
            return bool(res.status == 200)
    except OSError:
        return False


@contextlib.asynccontextmanager
async def routing(factory: KafkaFactory) -> AsyncIterator[Router]:
    """The version's topics, and a router sending smollm2 to 1.0.0, running here."""
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(MODEL, [VERSION]))
    stop = asyncio.Event()
    router = Router(factory, RouterConfig(stable_versions={MODEL: VERSION}, metrics_port=-1))
    task = asyncio.create_task(router.run(stop))
    try:
        await asyncio.wait_for(router.ready.wait(), 60)
        yield router
    finally:
        stop.set()
        await task


@contextlib.contextmanager
def played(podman: Podman, docs: list[dict[str, Any]], folder: Path) -> Iterator[KubePlay]:
    play = KubePlay.start(podman, docs, folder / "engine.yaml")
    try:
        yield play
    finally:
        for pod in play.pods():
            if pod.startswith(DEPLOYMENT):
                (folder / f"{pod}.log").write_text(play.logs(pod))
        play.down()


def container_of(podman: Podman, name: str) -> str:
    """The running container ``name`` of the played Deployment's pod."""
    out = podman.run(["ps", "--format", "{{.Names}}"]).stdout.split()
    (found,) = [n for n in out if n.startswith(DEPLOYMENT) and n.endswith(f"-{name}")]
    return found


def inside(podman: Podman, container: str, url: str) -> bool:
    """``url`` answers 200 from within ``container`` (the worker image has Python)."""
    code = f"import urllib.request as u; u.urlopen({url!r}, timeout=2)"
    res = podman.run(["exec", container, "python3", "-c", code], check=False, timeout=30)
    return res.returncode == 0


async def test_the_engine_and_its_worker_serve_a_generation_from_one_pod(
    podman: Podman,
    cpu_image: BuiltImage,
    llamacpp_image: BuiltImage,
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    cache = llamacpp_cache()
    model = cache.model("q4_1")
    assert model.is_file(), f"no {model}: run `make engines`"
    engine, metrics = free_port(), free_port()
    docs = localize(
        render(tmp_path, [cpu_image, llamacpp_image]), settings, model.parent, engine, metrics
    )
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    images = {n: c["image"] for n, c in _containers(deploy).items()}
    assert images == {"engine": llamacpp_image.pinned, "worker": cpu_image.pinned}
    async with routing(factory):
        with played(podman, docs, tmp_path):
            t_play = time.monotonic()
            worker = container_of(podman, "worker")
            health = f"http://127.0.0.1:{engine}/health"
            await wait_until(
                lambda: asyncio.to_thread(inside, podman, worker, health),
                timeout=120,
                what="the engine's /health, asked from the worker's container",
                poll_s=1.0,
            )
            print(f"engine healthy {time.monotonic() - t_play:.1f}s after kube play")
            readyz = f"http://127.0.0.1:{metrics}/readyz"
            await wait_until(
                lambda: asyncio.to_thread(answers, readyz), timeout=120, what="worker /readyz"
            )
            print(f"worker ready {time.monotonic() - t_play:.1f}s after kube play")
            # the engine runs as the service user, as the pod spec and the image both say
            user = podman.run(
                ["inspect", "--format", "{{.Config.User}}", container_of(podman, "engine")]
            ).stdout.strip()
            assert user.split(":")[0] == "10001", user
            async with GraylaneClient(factory) as client:
                t_gen = time.monotonic()
                result = await client.infer(
                    MODEL,
                    task=Task.GENERATE,
                    prompt="",
                    messages=[inference_pb2.ChatMessage(role="user", content=QUESTION)],
                    max_new_tokens=16,
                    temperature=0.0,
                    timeout=120,
                )
            print(f"answered {result.text!r} in {time.monotonic() - t_gen:.1f}s")
    assert result.ok and result.version == VERSION
    assert "Paris" in result.text, result.text
    assert result.text.isascii() and len(result.text.split()) >= 1
    print(f"whole test {time.monotonic() - t0:.0f}s")
