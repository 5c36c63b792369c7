"""The CPU image and the llama.cpp engine image are built here (podman, a Debian base made
with debootstrap) and run as the manifests run them: non-root, read-only root file system,
no shell or package manager."""

from __future__ import annotations

import re

import pytest

from graylane.deploy.containers.images import BuiltImage, project_version
from graylane.deploy.containers.podman import Podman
from graylane.deploy.engines.layout import LLAMA_CPP_VERSION

pytestmark = [pytest.mark.slow, pytest.mark.containers, pytest.mark.timeout(1800)]

LOCKED_DOWN = ("--rm", "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges")


def run(podman: Podman, image: BuiltImage, *argv: str) -> tuple[int, str]:
    res = podman.run(["run", *LOCKED_DOWN, image.ref, *argv], check=False, timeout=300)
    return res.returncode, res.stdout + res.stderr


def test_the_image_runs_graylane_as_a_non_root_user_on_a_read_only_root(
    podman: Podman, cpu_image: BuiltImage
) -> None:
    rc, out = run(podman, cpu_image, "graylane", "--version")
    version, commit, built = out.strip().splitlines()
    assert (rc, version) == (0, f"graylane {project_version()}")
    assert re.fullmatch(r"commit [0-9a-f]{40}(-dirty)?", commit), commit
    assert re.fullmatch(r"built \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(image\)", built), built
    rc, out = run(podman, cpu_image, "python3", "-c", "import os; print(os.getuid(), os.getgid())")
    assert (rc, out.split()) == (0, ["10001", "10001"])
    probe = "open('/opt/graylane/x', 'w')"
    rc, out = run(podman, cpu_image, "python3", "-c", probe)
    assert rc != 0 and "Read-only file system" in out, out
    assert cpu_image.digest.startswith("sha256:") and "@sha256:" in cpu_image.pinned


def test_the_image_serves_onnx_runtime_and_the_postgres_driver(
    podman: Podman, cpu_image: BuiltImage
) -> None:
    code = "import onnxruntime, psycopg, s3fs; print(onnxruntime.get_available_providers()[-1])"
    # stdout first, then stderr (ONNX Runtime warns there that it cannot persist an ID)
    rc, out = run(podman, cpu_image, "python3", "-c", code)
    assert rc == 0 and out.splitlines()[0] == "CPUExecutionProvider", out


@pytest.mark.parametrize("tool", ["sh", "bash", "dash", "apt-get", "dpkg", "pip", "pip3"])
def test_the_image_has_no_shell_or_package_manager(
    podman: Podman, cpu_image: BuiltImage, tool: str
) -> None:
    rc, out = run(podman, cpu_image, tool, "--version")
    assert rc != 0 and "not found" in out, f"{tool} is in the image: {out}"
    rc, out = run(podman, cpu_image, "python3", "-m", "pip", "--version")
    assert rc != 0 and "No module named pip" in out, out
    rc, out = run(podman, cpu_image, "python3", "-m", "ensurepip")
    assert rc != 0, out


def test_the_llamacpp_image_runs_the_server_as_a_non_root_user_and_holds_no_model(
    podman: Podman, llamacpp_image: BuiltImage
) -> None:
    assert llamacpp_image.ref == f"localhost/graylane-llamacpp:{LLAMA_CPP_VERSION}"
    rc, out = run(podman, llamacpp_image, "--version")  # the entrypoint is llama-server
    assert rc == 0 and "version:" in out, out
    user = podman.run(["image", "inspect", "--format", "{{.Config.User}}", llamacpp_image.ref])
    assert user.stdout.strip() == "10001:10001"
    for tool in ("sh", "bash", "python3", "perl", "apt-get", "dpkg"):
        res = podman.run(
            ["run", *LOCKED_DOWN, "--entrypoint", tool, llamacpp_image.ref, "--version"],
            check=False,
        )
        assert res.returncode != 0, f"{tool} is in the image"
    find = ["run", *LOCKED_DOWN, "--entrypoint", "find", llamacpp_image.ref]
    res = podman.run([*find, "/", "-xdev", "-name", "*.gguf"], check=False)
    assert res.stdout.strip() == "", f"a model is baked into the image: {res.stdout}"
