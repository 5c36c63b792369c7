"""The CPU image, built once per session with podman (installed from Debian when missing)."""

from __future__ import annotations

import pytest

from graylane.deploy.containers.images import BuiltImage, build_cpu_image
from graylane.deploy.containers.podman import Podman


@pytest.fixture(scope="session")
def podman() -> Podman:
    return Podman.ready()


@pytest.fixture(scope="session")
def cpu_image(podman: Podman) -> BuiltImage:
    """localhost/graylane:<version> built FROM the local Debian base (layers cached)."""
    return build_cpu_image(podman)
