"""scripts/gpu-check.sh refuses plainly (exit 2, a JSON line saying why) where it cannot run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


def _tool_dir(tmp_path: Path, smi_output: str | None) -> Path:
    """A PATH folder with the tools the script needs and, if given, a fake nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("bash", "head", "mktemp", "rm", "dirname", "printf"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    if smi_output is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nprintf '%s' '{smi_output}'\n")
        smi.chmod(0o755)
    return bin_dir


def _run(tmp_path: Path, smi_output: str | None, python: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(_tool_dir(tmp_path, smi_output)), "PYTHON": python, "HOME": str(tmp_path)}
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(os.name != "posix", reason="a bash script")
def test_without_a_gpu_the_script_says_so_and_exits_2(tmp_path: Path) -> None:
    done = _run(tmp_path, None, "/bin/false")
    assert done.returncode == 2
    assert "no NVIDIA GPU" in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["skipped"] and not summary["ok"]


@pytest.mark.skipif(os.name != "posix", reason="a bash script")
def test_a_gpu_without_tensorrt_is_refused_before_anything_runs(tmp_path: Path) -> None:
    empty = _run(tmp_path / "a", "", "/bin/false")
    assert empty.returncode == 2 and "lists no GPU" in empty.stderr
    no_trt = _run(tmp_path / "b", "NVIDIA H200, 9.0", "/bin/false")
    assert no_trt.returncode == 2 and "tensorrt cannot be imported" in no_trt.stderr
