"""The Dockerfiles, checked statically (the CPU image is also built and run: see
tests/integration/test_images.py; the GPU image's NGC base cannot be pulled here)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
CPU = DOCKER / "Dockerfile"
GPU = DOCKER / "Dockerfile.gpu"
PINNED = {
    CPU: re.compile(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?"),
    GPU: re.compile(r"nvcr\.io/nvidia/tensorrt:\d{2}\.\d{2}-py3(@sha256:[0-9a-f]{64})?"),
}
COMPILERS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|cmake|make)\b")
OCI_FROM_ARGS = {
    "org.opencontainers.image.version": "${VERSION}",
    "org.opencontainers.image.revision": "${GIT_SHA}",
    "org.opencontainers.image.created": "${BUILD_DATE}",
}
# What the CPU image's rootfs stage deletes so the final image has no way to get a shell
# or install anything.
SHELLS_AND_INSTALLERS = (
    "/usr/bin/sh",
    "/usr/bin/bash",
    "/usr/bin/dash",
    "/usr/bin/apt*",
    "/usr/bin/dpkg*",
    "/var/lib/dpkg",
    "ensurepip",
)


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [v for i, v in self.instructions if i == instruction]


def _global_args(path: Path) -> dict[str, str]:
    """ARGs declared before the first FROM (the base image's default)."""
    with path.open("rb") as handle:
        structure = DockerfileParser(fileobj=handle, env_replace=False).structure
    found: dict[str, str] = {}
    for item in structure:
        if item["instruction"] == "FROM":
            break
        if item["instruction"] == "ARG":
            key, _, value = item["value"].partition("=")
            found[key] = value
    return found


def _stages(path: Path) -> list[Stage]:
    with path.open("rb") as handle:  # fileobj: the parser takes other paths for folders
        parser = DockerfileParser(fileobj=handle, env_replace=False)
        structure = parser.structure
    args = _global_args(path)
    stages: list[Stage] = []
    for item in structure:
        if item["instruction"] == "FROM":
            words = item["value"].split()
            assert len(words) == 3 and words[1].upper() == "AS", f"unnamed stage: {item}"
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            stages.append(Stage(base, words[2]))
        elif item["instruction"] == "ARG" and not stages:
            continue
        elif item["instruction"] != "COMMENT":
            assert stages, f"{item['instruction']} before the first FROM"
            stages[-1].instructions.append((item["instruction"], item["value"]))
    return stages


def _labels(stage: Stage) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in stage.values("LABEL"):
        for word in shlex.split(value, posix=True):
            key, _, raw = word.partition("=")
            labels[key] = raw
    return labels


def test_base_image_is_a_build_argument_defaulting_to_a_pinned_public_one() -> None:
    for path in (CPU, GPU):
        assert PINNED[path].fullmatch(_global_args(path)["BASE_IMAGE"]), path.name
        for stage in _stages(path):
            assert (
                stage.base == "scratch"
                or stage.base in {s.name for s in _stages(path)}
                or (PINNED[path].fullmatch(stage.base))
            ), f"{path.name} {stage.name}: {stage.base} is not pinned"


def test_cpu_dependencies_are_installed_before_the_code_is_copied() -> None:
    requirements, deps, app, rootfs, runtime = _stages(CPU)
    names = (requirements.name, deps.name, app.name, rootfs.name, runtime.name)
    assert names == ("requirements", "deps", "app", "rootfs", "runtime")
    assert requirements.values("COPY") == ["pyproject.toml ./"], "code edits keep the lists"
    # only the lists reach the deps stage: a pyproject.toml edit that leaves the
    # dependencies as they are (version, tool settings) keeps the installed wheels
    assert deps.base != "requirements"
    assert deps.values("COPY") == ["--from=requirements /src/requirements.txt /src/build.txt ./"]
    assert any("-r requirements.txt" in run for run in deps.values("RUN"))
    assert app.base == "deps"
    assert any("--no-deps" in run for run in app.values("RUN")), "the code stage resolves nothing"


def test_cpu_final_stage_is_the_runtime_file_system_only() -> None:
    *_, rootfs, runtime = _stages(CPU)
    assert runtime.base == "scratch"
    assert runtime.values("COPY") == ["--from=rootfs / /"]
    assert runtime.values("RUN") == [], "no RUN: the final stage has no shell to run it"
    assert rootfs.values("COPY") == ["--from=app /opt/graylane /opt/graylane"]
    removed = " ".join(rootfs.values("RUN"))
    for target in SHELLS_AND_INSTALLERS:
        assert target in removed, f"the rootfs stage keeps {target}"
    (check,) = runtime.values("HEALTHCHECK")
    assert "CMD [" in check, "the health check runs without a shell (exec form)"


def test_gpu_image_builds_wheels_apart_from_the_runtime() -> None:
    build, runtime = _stages(GPU)
    assert (build.name, runtime.name) == ("build", "runtime")
    assert any("pip wheel" in run and "/wheels" in run for run in build.values("RUN"))
    assert runtime.values("COPY") == ["--from=build /wheels /wheels"]
    runs = runtime.values("RUN")
    assert any("--no-index" in run and "--find-links=/wheels" in run for run in runs)


@pytest.mark.parametrize("path", [CPU, GPU], ids=lambda p: p.name)
def test_runtime_stage_installs_no_compiler(path: Path) -> None:
    for stage in _stages(path)[1:]:
        for run in stage.values("RUN"):
            assert not COMPILERS.search(run), f"{stage.name} installs a compiler: {run}"


@pytest.mark.parametrize("path", [CPU, GPU], ids=lambda p: p.name)
def test_runs_as_a_fixed_non_root_uid(path: Path) -> None:
    runtime = _stages(path)[-1]
    users = runtime.values("USER")
    assert users, "no USER in the runtime stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) >= 1000 and gid.isdigit()
    start = runtime.instructions.index(("USER", users[-1]))
    after_user = [i for i, _ in runtime.instructions[start:]]
    assert "RUN" not in after_user, "a RUN after USER would run as the service user by accident"
    creates = [run for stage in _stages(path) for run in stage.values("RUN")]
    assert any(f"--uid {uid}" in run and f"--gid {gid}" in run for run in creates)


@pytest.mark.parametrize("path", [CPU, GPU], ids=lambda p: p.name)
def test_oci_labels_come_from_build_args(path: Path) -> None:
    runtime = _stages(path)[-1]
    args = {v.split("=", 1)[0] for v in runtime.values("ARG")}
    assert {"VERSION", "GIT_SHA", "BUILD_DATE"} <= args
    labels = _labels(runtime)
    for key, value in OCI_FROM_ARGS.items():
        assert labels.get(key) == value, f"{key} = {labels.get(key)!r}"
    assert labels["org.opencontainers.image.title"]


@pytest.mark.parametrize("path", [CPU, GPU], ids=lambda p: p.name)
def test_healthcheck_asks_the_healthz_endpoint(path: Path) -> None:
    (check,) = _stages(path)[-1].values("HEALTHCHECK")
    assert "--interval=" in check and "/healthz" in check and "GRAYLANE_METRICS_PORT" in check
    env = " ".join(_stages(path)[-1].values("ENV"))
    assert "GRAYLANE_METRICS_HOST=0.0.0.0" in env


def test_gpu_image_installs_the_trt_postgres_and_s3_extras() -> None:
    """GPU workers get a postgresql+psycopg:// registry URL: without psycopg they fail; their
    init containers fetch artifacts from the s3:// store the manifests name."""
    build, runtime = _stages(GPU)
    assert any('"graylane[trt,postgres,s3]"' in run for run in runtime.values("RUN"))
    assert any('".[postgres,s3]"' in run for run in build.values("RUN"))


def test_cpu_image_carries_the_extras_the_manifests_need() -> None:
    """The CPU image installs the postgres and s3 extras by default (an ``EXTRAS`` build
    argument): the pod specs name a postgresql+psycopg:// registry and an s3:// store."""
    deps = _stages(CPU)[0]
    (extras,) = [a for a in deps.values("ARG") if a.startswith("EXTRAS=")]
    assert extras.split("=", 1)[1].strip('"').split() == ["postgres", "s3"]
    assert any("os.environ['EXTRAS']" in run for run in deps.values("RUN"))


@pytest.mark.parametrize("path", [CPU, GPU], ids=lambda p: p.name)
def test_build_context_copies_exist(path: Path) -> None:
    for stage in _stages(path):
        for copy in stage.values("COPY"):
            words = copy.split()
            if words[0].startswith("--from="):
                continue
            for src in words[:-1]:
                assert (ROOT / src).exists(), f"{path.name} copies missing {src}"


LLAMACPP = DOCKER / "Dockerfile.llamacpp"


def test_the_llamacpp_image_is_the_server_on_the_base_with_nothing_to_run_besides() -> None:
    """The engine container's image (built and run in tests/integration/test_images.py
    and test_kube_play_engine.py): the staged server and its libraries on the Debian base,
    no shell, package manager or interpreter left, no model, the server as entrypoint."""
    assert re.fullmatch(r"debian:bookworm(-slim)?", _global_args(LLAMACPP)["BASE_IMAGE"])
    rootfs, runtime = _stages(LLAMACPP)
    assert (rootfs.name, runtime.name) == ("rootfs", "runtime")
    assert rootfs.values("COPY") == ["bin/ /opt/llama.cpp/bin/", "lib/ /opt/llama.cpp/lib/"]
    removed = " ".join(rootfs.values("RUN"))
    for target in (*SHELLS_AND_INSTALLERS[:-1], "/usr/bin/python3*", "/usr/lib/python3*"):
        assert target in removed, f"the rootfs stage keeps {target}"
    assert "llama-server --version" in removed, "a missing library fails the build"
    assert not COMPILERS.search(removed)
    assert runtime.base == "scratch" and runtime.values("COPY") == ["--from=rootfs / /"]
    assert runtime.values("RUN") == []
    assert runtime.values("USER") == ["10001:10001"]
    assert any("--uid 10001" in run and "--gid 10001" in run for run in rootfs.values("RUN"))
    assert runtime.values("ENTRYPOINT") == ['["/opt/llama.cpp/bin/llama-server"]']
    assert "LD_LIBRARY_PATH=/opt/llama.cpp/lib" in " ".join(runtime.values("ENV"))
    assert ".gguf" not in LLAMACPP.read_text(), "the model is mounted, never baked in"
