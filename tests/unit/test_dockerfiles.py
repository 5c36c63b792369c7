"""The images cannot be built here (no Docker engine); their Dockerfiles are checked statically."""

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


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [v for i, v in self.instructions if i == instruction]


def _stages(path: Path) -> list[Stage]:
    with path.open("rb") as handle:  # fileobj: the parser takes other paths for folders
        parser = DockerfileParser(fileobj=handle, env_replace=False)
        structure = parser.structure
    stages: list[Stage] = []
    for item in structure:
        if item["instruction"] == "FROM":
            words = item["value"].split()
            assert len(words) == 3 and words[1].upper() == "AS", f"unnamed stage: {item}"
            stages.append(Stage(words[0], words[2]))
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


@pytest.mark.parametrize("path", [CPU, GPU], ids=lambda p: p.name)
def test_two_stages_on_a_pinned_base(path: Path) -> None:
    build, runtime = _stages(path)
    assert (build.name, runtime.name) == ("build", "runtime")
    for stage in (build, runtime):
        assert PINNED[path].fullmatch(stage.base), f"{stage.name}: {stage.base} is not pinned"
    assert any("pip wheel" in run and "/wheels" in run for run in build.values("RUN"))


@pytest.mark.parametrize("path", [CPU, GPU], ids=lambda p: p.name)
def test_runtime_stage_takes_only_wheels_and_installs_no_compiler(path: Path) -> None:
    runtime = _stages(path)[-1]
    copies = runtime.values("COPY")
    assert copies == ["--from=build /wheels /wheels"]
    for run in runtime.values("RUN"):
        assert not COMPILERS.search(run), f"runtime stage installs a compiler: {run}"
    runs = runtime.values("RUN")
    assert any("--no-index" in run and "--find-links=/wheels" in run for run in runs)


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
    assert any(f"--uid {uid}" in run and f"--gid {gid}" in run for run in runtime.values("RUN"))


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


def test_gpu_image_installs_the_trt_extra() -> None:
    runtime = _stages(GPU)[-1]
    assert any('"graylane[trt]"' in run for run in runtime.values("RUN"))


@pytest.mark.parametrize("path", [CPU, GPU], ids=lambda p: p.name)
def test_build_context_copies_exist(path: Path) -> None:
    for stage in _stages(path):
        for copy in stage.values("COPY"):
            words = copy.split()
            if words[0].startswith("--from="):
                continue
            for src in words[:-1]:
                assert (ROOT / src).exists(), f"{path.name} copies missing {src}"
