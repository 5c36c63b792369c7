"""The chaos bench's own stack: a private Kafka broker it may stop, and every service as
a separate OS process it may kill -9 and start again."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from graylane.app.cli.demo import Service, free_port, start_service
from graylane.errors import GraylaneError
from graylane.settings import REPO_ROOT, Settings

MODEL = "chaos-gpt"
STABLE, CANDIDATE = "1.0.0", "1.1.0"
TOKEN = "chaos-bench-token-0123456789"


class StackError(GraylaneError):
    """The bench's stack could not be set up."""


@dataclass
class PrivateBroker:
    """A local broker of its own (state under ``root``, free ports), never the shared one."""

    root: Path
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "GRAYLANE_LOCAL_DIR": str(self.root),
            "GRAYLANE_KAFKA_PORT": str(self.port),
            "GRAYLANE_KAFKA_CONTROLLER_PORT": str(self.controller_port),
        }

    def _run(self, command: str, timeout_s: float) -> None:
        done = subprocess.run(
            [sys.executable, str(REPO_ROOT / "deploy" / "kafka" / "kafka.py"), command],
            env=self._env(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(
                f"kafka.py {command} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )

    def start(self) -> None:
        self._run("start", 240)

    def stop(self) -> None:
        self._run("stop", 120)

    def remove(self) -> None:
        """Stop (if running) and delete the broker's data; its logs stay."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root / "kafka" / "data", ignore_errors=True)


@dataclass
class Proc:
    """One service: how to start it, and its current process."""

    name: str
    argv: list[str]
    service: Service | None = None
    starts: int = 0

    @property
    def pid(self) -> int | None:
        return self.service.process.pid if self.service else None

    def alive(self) -> bool:
        return self.service is not None and self.service.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.service is None else self.service.process.poll()

    @property
    def log(self) -> Path | None:
        return self.service.log if self.service else None


@dataclass
class ServiceSet:
    """The stack's service processes (router, workers, policy engine, control plane)."""

    env: dict[str, str]
    logs: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    def add(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv)
        self.procs[name] = proc
        self.start(name)
        return proc

    def start(self, name: str) -> Proc:
        proc = self.procs[name]
        label = name if proc.starts == 0 else f"{name}.{proc.starts}"  # keep earlier logs
        proc.service = start_service(label, proc.argv, self.logs, self.env)
        proc.starts += 1
        return proc

    def kill(self, name: str) -> None:
        """kill -9, and reap it."""
        proc = self.procs[name]
        if proc.service is not None and proc.alive():
            os.kill(proc.service.process.pid, signal.SIGKILL)
            proc.service.process.wait(timeout=30)

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if not p.alive()]

    def all_alive(self) -> bool:
        return not self.dead()

    def stop_all(self) -> None:
        running = [p.service for p in self.procs.values() if p.service and p.alive()]
        for s in running:
            s.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for s in running:
            try:
                s.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.process.kill()
                s.process.wait()


def service_env(settings: Settings, run_dir: Path, cp_port: int) -> dict[str, str]:
    """What every service process is told: the private broker, DB, artifacts, tokens."""
    return {
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_DB_URL": settings.db_url,
        "GRAYLANE_ARTIFACT_DIR": str(settings.artifact_dir),
        "GRAYLANE_LOCAL_DIR": str(run_dir),
        "GRAYLANE_METRICS_PORT": "-1",
        "GRAYLANE_LOG_FORMAT": "text",
        "GRAYLANE_CP_TOKENS": f"{TOKEN}:operator:chaos-bench",
        "GRAYLANE_CP_PORT": str(cp_port),
    }


def worker_argv(version: str, model_file: Path, worker_id: str) -> list[str]:
    return [
        "worker",
        "--model",
        MODEL,
        "--version",
        version,
        "--variant",
        f"fp32={model_file}",
        "--threads",
        "1",
        "--worker-id",
        worker_id,
    ]


def start_all(
    services: ServiceSet, files: dict[str, Path], *, window_ms: int, step_ms: int
) -> None:
    """Router, two workers of the stable version, one of the candidate, policy, control plane."""
    services.add("controlplane", ["controlplane"])
    services.add("router", ["router", "--model", f"{MODEL}={STABLE}"])
    services.add("worker-a", worker_argv(STABLE, files[STABLE], "chaos-worker-a"))
    services.add("worker-b", worker_argv(STABLE, files[STABLE], "chaos-worker-b"))
    services.add("candidate", worker_argv(CANDIDATE, files[CANDIDATE], "chaos-candidate"))
    services.add(
        "policy",
        ["policy", "--model", MODEL, "--window-ms", str(window_ms), "--step-ms", str(step_ms)],
    )


def log_mentions(path: Path | None, text: str) -> bool:
    return path is not None and path.exists() and text in path.read_text(errors="replace")


def wait_port(port: int, timeout_s: float, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise StackError(f"the process for port {port} exited")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise StackError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")


def tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def build_model(settings: Settings, progress: Callable[[str], None]) -> dict[str, Path]:
    """Build both demo versions through the builder into this run's registry; model files."""
    from graylane.app.cli.calibrate import registered_variants
    from graylane.app.demo.build_versions import build_versions
    from graylane.registry import open_registry

    build_versions(
        settings,
        MODEL,
        {STABLE: 1, CANDIDATE: 2},
        size="tiny",
        precisions=("fp32",),
        progress=progress,
    )
    registry = open_registry(settings.db_url)
    registry.set_stable(MODEL, STABLE)
    registry.engine.dispose()
    return {v: registered_variants(settings, MODEL, v)["fp32"] for v in (STABLE, CANDIDATE)}
