"""Facts about the machine a build runs on: CPU, GPU, library versions, git commit."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import shutil
import socket
import subprocess
from pathlib import Path

import onnx
import onnxruntime

from graylane.artifacts.manifest import BuildHost, GpuInfo

__all__ = ["build_host", "cpu_model", "detect_gpu", "git_commit", "tensorrt_version"]

_TIMEOUT_S = 10


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def detect_gpu() -> GpuInfo | None:
    """The first NVIDIA GPU per ``nvidia-smi``, or ``None`` where there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        name, _, cc = line.rpartition(",")
        if name.strip() and cc.strip():
            return GpuInfo(name=name.strip(), compute_capability=cc.strip())
    return None


def tensorrt_version() -> str | None:
    """The installed TensorRT Python package's version, without importing it."""
    if importlib.util.find_spec("tensorrt") is None:
        return None
    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-cu11"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import tensorrt

        return str(tensorrt.__version__)
    except Exception:  # a broken install reads as absent
        return None


def git_commit(cwd: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the working tree, or ``None`` outside git."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        result = subprocess.run(
            [git, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            cwd=cwd,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and commit else None


def build_host(gpu: GpuInfo | None = None, probe_gpu: bool = True) -> BuildHost:
    return BuildHost(
        hostname=socket.gethostname(),
        cpu=cpu_model(),
        gpu=gpu if gpu is not None or not probe_gpu else detect_gpu(),
        python=platform.python_version(),
        onnx=str(onnx.__version__),
        onnxruntime=str(onnxruntime.__version__),
        tensorrt=tensorrt_version(),
    )
