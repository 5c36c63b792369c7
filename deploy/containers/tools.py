"""Go commands built from the Go module proxy once and cached: ``kustomize`` and ``helm``
under ``.local/``, the OCI registry and ``cosign`` in the machine's shared cache.

Compiling takes a few minutes on two cores, so each binary is kept at
``<GRAYLANE_LOCAL_DIR>/tools/<name>-<version>/<name>`` (or, for a ``shared`` tool, at
``${GRAYLANE_CACHE_DIR:-~/.cache/graylane}/<name>-<version>/<name>``, shared by every clone)
and rebuilt only when missing (a new pinned version lands in a new folder). The first build
prints its progress: every few dozen packages compiled, and the time it took.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from graylane.deploy.containers.podman import ContainerToolError, say
from graylane.deploy.engines.layout import cache_root
from graylane.deploy.kafka.layout import REPO_ROOT, file_lock

__all__ = ["HELM", "KUSTOMIZE", "GoTool", "go_binary", "tools_dir"]


def tools_dir() -> Path:
    base = os.environ.get("GRAYLANE_LOCAL_DIR") or str(REPO_ROOT / ".local")
    return Path(base).expanduser().resolve() / "tools"


def go_binary() -> str:
    found = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(found).is_file():
        raise ContainerToolError("Go is needed once to build kustomize and helm (set GO=...)")
    return found


@dataclass(frozen=True, kw_only=True)
class GoTool:
    """A command installed with ``go install MODULE@VERSION``."""

    name: str
    module: str
    version: str
    shared: bool = False  # kept in the machine's cache rather than the clone's .local/

    def path(self) -> Path:
        root = cache_root() if self.shared else tools_dir()
        return root / f"{self.name}-{self.version}" / self.name

    def ensure(self) -> Path:
        """The cached binary, built first when missing."""
        target = self.path()
        if target.is_file():
            return target
        with file_lock(target.parent.parent / f".{self.name}.lock"):
            if target.is_file():
                return target
            say(f"tools: go install {self.module}@{self.version} (a few minutes, once)")
            t0 = time.monotonic()
            env = {**os.environ, "GOBIN": str(target.parent), "GOTOOLCHAIN": "local"}
            proc = subprocess.Popen(
                [go_binary(), "install", "-v", f"{self.module}@{self.version}"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
            )
            assert proc.stdout is not None
            lines: list[str] = []
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if len(lines) % PROGRESS_EVERY == 0:
                    took = time.monotonic() - t0
                    say(f"tools: {self.name}: {len(lines)} packages so far ({took:.0f}s)")
            rc = proc.wait()
            if rc != 0 or not target.is_file():
                tail = "\n".join(lines[-40:])
                raise ContainerToolError(f"go install {self.name} failed ({rc}):\n{tail}")
            say(f"tools: {self.name} built in {time.monotonic() - t0:.0f}s -> {target}")
        return target

    def run(self, *args: str, cwd: Path | None = None) -> str:
        res = subprocess.run(
            [str(self.ensure()), *args], cwd=cwd, capture_output=True, text=True, check=False
        )
        if res.returncode != 0:
            raise ContainerToolError(f"{self.name} {' '.join(args)} failed:\n{res.stderr[-4000:]}")
        return res.stdout


PROGRESS_EVERY = 50  # a progress line every so many packages downloaded or compiled

KUSTOMIZE = GoTool(name="kustomize", module="sigs.k8s.io/kustomize/kustomize/v5", version="v5.8.0")
HELM = GoTool(name="helm", module="helm.sh/helm/v3/cmd/helm", version="v3.22.0")
