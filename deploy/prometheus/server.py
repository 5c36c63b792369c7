"""A throwaway Prometheus server: generated scrape config, free port, data in a temp dir.

Used by the real-Prometheus integration test and by ``graylane up --with-prometheus``::

    with PrometheusServer.start({"graylane-router": ["127.0.0.1:41234"]}, workdir) as prom:
        prom.query('graylane_router_weight_ratio{model="m"}')

The ``prometheus`` binary is taken from $GRAYLANE_PROMETHEUS or PATH and installed from
Debian (package ``prometheus``, with promtool) when missing. Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from graylane.deploy.prometheus.prometheus import RULES, PrometheusToolError, promtool

__all__ = [
    "PrometheusServer",
    "Sample",
    "prometheus_binary",
    "remove_target",
    "scrape_config",
    "write_target",
]


def prometheus_binary(install: bool = True) -> str:
    found = os.environ.get("GRAYLANE_PROMETHEUS") or shutil.which("prometheus")
    if not found and install:
        promtool(install=True)  # the same Debian package brings both
        found = shutil.which("prometheus")
    if not found:
        raise PrometheusToolError("prometheus not found; apt-get install prometheus")
    return found


def scrape_config(
    jobs: Mapping[str, Sequence[str]],
    *,
    interval_s: float = 1.0,
    rule_files: Sequence[Path] = tuple(RULES),
    targets_dir: Path | None = None,
) -> str:
    """Prometheus YAML (JSON is YAML) scraping ``job -> [host:port, ...]`` every ``interval_s``,
    and, with ``targets_dir``, every target file :func:`write_target` leaves there."""
    interval = f"{int(interval_s * 1000)}ms"
    scrapes: list[dict[str, object]] = [
        {"job_name": job, "static_configs": [{"targets": list(targets)}]}
        for job, targets in sorted(jobs.items())
    ]
    if targets_dir is not None:
        scrapes.append(
            {
                "job_name": "graylane-local",  # each file's own "job" label wins
                "file_sd_configs": [
                    {"files": [str(targets_dir / "*.json")], "refresh_interval": "2s"}
                ],
            }
        )
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": scrapes,
    }
    return json.dumps(config, indent=2)


def write_target(targets_dir: Path, name: str, job: str, port: int) -> Path:
    """Announce a local process's metrics port to a Prometheus reading ``targets_dir``."""
    targets_dir.mkdir(parents=True, exist_ok=True)
    path = targets_dir / f"{name}.json"
    group = {"targets": [f"127.0.0.1:{port}"], "labels": {"job": job, "process": name}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([group]))
    tmp.replace(path)  # Prometheus never reads half a file
    return path


def remove_target(targets_dir: Path, name: str) -> None:
    (targets_dir / f"{name}.json").unlink(missing_ok=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass
class PrometheusServer:
    """A running ``prometheus``; :meth:`stop` (or leaving the ``with``) ends it."""

    process: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log_path: Path
    _stopped: bool = field(default=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        jobs: Mapping[str, Sequence[str]],
        workdir: Path,
        *,
        port: int = 0,
        interval_s: float = 1.0,
        ready_timeout_s: float = 60.0,
        targets_dir: Path | None = None,
        detach: bool = False,
    ) -> PrometheusServer:
        """Start and wait until ready; ``detach`` = its own session (outlives the caller)."""
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(scrape_config(jobs, interval_s=interval_s, targets_dir=targets_dir))
        port = port or _free_port()
        log_path = workdir / "prometheus.log"
        cmd = [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1d",
            "--web.enable-lifecycle",
        ]
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=detach
            )
        server = cls(proc, port, workdir, log_path)
        try:
            server.wait_ready(ready_timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def _get(self, path: str, timeout_s: float = 5.0) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as res:
            return bytes(res.read())

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PrometheusToolError(f"prometheus exited:\n{self.log_tail()}")
            try:
                self._get("/-/ready", timeout_s=1.0)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise PrometheusToolError(f"prometheus not ready in {timeout_s}s:\n{self.log_tail()}")

    def query(self, promql: str) -> list[Sample]:
        """An instant vector query; raises on an error or a non-vector result."""
        body = json.loads(self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
        if body.get("status") != "success":
            raise PrometheusToolError(f"{promql}: {body}")
        data = body["data"]
        if data["resultType"] != "vector":
            raise PrometheusToolError(f"{promql}: a {data['resultType']}, not a vector")
        return [Sample(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def targets(self) -> list[dict[str, object]]:
        body = json.loads(self._get("/api/v1/targets"))
        return list(body["data"]["activeTargets"])

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
