"""Integration fixtures: ``settings`` (and so ``factory``) point at the real local broker;
``private_broker`` is a broker of the test's own, for tests that stop or secure one;
``models`` are two versions of the tiny demo GPT, written once per session; ``podman`` and
``cpu_image`` and ``llamacpp_image`` (built once per session) serve the container tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from graylane.deploy.containers.engine_images import build_llamacpp_image
from graylane.deploy.containers.images import BuiltImage, build_cpu_image
from graylane.deploy.containers.podman import Podman
from graylane.models.demo_gpt import write_demo_gpt
from graylane.settings import Settings
from tests.support.brokers import PrivateBroker, running_broker
from tests.support.settings import make_settings


@pytest.fixture
def settings(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Settings:
    """Settings on the real local broker (started on demand, never stopped by a test)."""
    return make_settings(kafka_bootstrap, unique_prefix, tmp_path)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``v1`` and ``v2``: the tiny demo GPT with different weights (seeds 1 and 2)."""
    root = tmp_path_factory.mktemp("models")
    return {
        "v1": write_demo_gpt(root / "v1.onnx", "tiny", seed=1),
        "v2": write_demo_gpt(root / "v2.onnx", "tiny", seed=2),
    }


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    """A broker of this test's own (state in tmp_path, free ports), stopped after it."""
    with running_broker(tmp_path / "private-kafka") as broker:
        yield broker


@pytest.fixture(scope="session")
def podman() -> Podman:
    """podman with runc and modest ulimits (installed from Debian when missing)."""
    return Podman.ready()


@pytest.fixture(scope="session")
def cpu_image(podman: Podman) -> BuiltImage:
    """localhost/graylane:<version>, built once per session FROM the local Debian base."""
    return build_cpu_image(podman)


@pytest.fixture(scope="session")
def llamacpp_image(podman: Podman) -> BuiltImage:
    """localhost/graylane-llamacpp:<version>: the set-up's llama-server (``make engines``)
    FROM the local Debian base, built once per session."""
    return build_llamacpp_image(podman)
