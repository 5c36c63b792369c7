"""A local Prometheus for people running the stack on one machine (``graylane up
--with-prometheus``): it scrapes every service ``start_service`` launches, found through
target files in ``.local/prometheus/targets``, and evaluates the repository's rules."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from graylane.settings import REPO_ROOT

__all__ = [
    "LOCAL_PROMETHEUS",
    "TARGETS",
    "announce",
    "job_of",
    "start_local_prometheus",
    "stop_local_prometheus",
    "withdraw",
]

LOCAL_PROMETHEUS = REPO_ROOT / ".local" / "prometheus"
TARGETS = LOCAL_PROMETHEUS / "targets"
_PID = LOCAL_PROMETHEUS / "prometheus.pid"
_JOBS = {
    "router": "graylane-router",
    "worker": "graylane-worker",
    "policy": "graylane-policy-engine",
    "controlplane": "graylane-controlplane",
    "audit-sink": "graylane-audit-sink",
}


def job_of(command: str) -> str | None:
    """The scrape job of a ``graylane <command>`` service (None: not a service)."""
    return _JOBS.get(command)


def announce(name: str, command: str, port: int) -> Path | None:
    from graylane.deploy.prometheus.server import write_target

    job = job_of(command)
    return None if job is None else write_target(TARGETS, name, job, port)


def withdraw(name: str) -> None:
    from graylane.deploy.prometheus.server import remove_target

    remove_target(TARGETS, name)


def _running_pid() -> int | None:
    try:
        pid = int(_PID.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if str(LOCAL_PROMETHEUS).encode() in cmdline else None


def start_local_prometheus(port: int = 9090) -> str:
    """Start (or find) the local Prometheus; returns its URL."""
    from graylane.deploy.prometheus.server import PrometheusServer

    if _running_pid() is not None:
        return f"http://127.0.0.1:{(LOCAL_PROMETHEUS / 'port').read_text().strip()}"
    TARGETS.mkdir(parents=True, exist_ok=True)
    server = PrometheusServer.start(
        {}, LOCAL_PROMETHEUS, port=port, interval_s=5.0, targets_dir=TARGETS, detach=True
    )
    _PID.write_text(str(server.process.pid))
    (LOCAL_PROMETHEUS / "port").write_text(str(server.port))
    return server.url


def stop_local_prometheus() -> bool:
    """Stop the local Prometheus this repository started; False when none ran."""
    pid = _running_pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    _PID.unlink(missing_ok=True)
    return True
