#!/usr/bin/env python3
"""A local OCI registry on 127.0.0.1: the CNCF distribution registry, built from its Go module.

Usage::

    python deploy/registry/registry.py build    # go install the registry once (cached)
    python deploy/registry/registry.py start    # start in the background, wait until it answers
    python deploy/registry/registry.py status   # "registry v3.1.2 running on 127.0.0.1:5000 ..."
    python deploy/registry/registry.py stop     # SIGTERM, then SIGKILL; its storage is deleted

Importable::

    from graylane.deploy.registry import registry
    with registry.running_registry(tmp_path) as reg:   # a private one on a free port
        reg.address                                    # "127.0.0.1:PORT"

The binary is ``go install github.com/distribution/distribution/v3/cmd/registry@v3.1.2``,
kept at ``${GRAYLANE_CACHE_DIR:-~/.cache/graylane}/registry-v3.1.2/registry`` and built only
when missing (progress lines while it compiles). Each start writes a throwaway config: plain
HTTP on loopback only, filesystem storage in a fresh temporary folder that ``stop`` deletes,
no access log, no telemetry exporters. Podman reaches it with ``--tls-verify=false``
(plain HTTP is acceptable on 127.0.0.1 only; the registry listens nowhere else).

Image signatures are kept beside it in a lookaside folder (``lookaside/``, also deleted by
``stop``; see ``deploy/containers/signing.py``).

State of the one started by the command line: ``${GRAYLANE_LOCAL_DIR:-<repo>/.local}/registry``
(``config.yml``, ``registry.log``, ``registry.pid``, ``storage-*``, ``lookaside``). Its port is
``$GRAYLANE_REGISTRY_PORT`` (5000 by default).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a script: import the package from the repo root, not from this folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from graylane.deploy.containers.podman import ContainerToolError
from graylane.deploy.containers.tools import GoTool
from graylane.deploy.kafka.layout import REPO_ROOT

__all__ = [
    "DEFAULT_PORT",
    "HOST",
    "REGISTRY",
    "LocalRegistry",
    "answers",
    "configured_port",
    "free_port",
    "local_dir",
    "main",
    "running_registry",
    "start",
    "status",
    "stop",
]

REGISTRY = GoTool(
    name="registry",
    module="github.com/distribution/distribution/v3/cmd/registry",
    version="v3.1.2",
    shared=True,
)
HOST = "127.0.0.1"
DEFAULT_PORT = 5000
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

CONFIG = """\
# Written by deploy/registry for one run: loopback only, plain HTTP, throwaway storage.
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: {host}:{port}
  secret: {secret}
"""


def say(msg: str) -> None:
    print(f"[registry] {msg}", flush=True)


def local_dir() -> Path:
    """``<GRAYLANE_LOCAL_DIR>/registry``: the state of the registry the command line starts."""
    base = os.environ.get("GRAYLANE_LOCAL_DIR") or str(REPO_ROOT / ".local")
    return Path(base).expanduser().resolve() / "registry"


def configured_port() -> int:
    return int(os.environ.get("GRAYLANE_REGISTRY_PORT") or DEFAULT_PORT)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def answers(address: str, timeout: float = 2.0) -> bool:
    """True when ``GET /v2/`` at ``address`` answers as a distribution registry does."""
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=timeout) as resp:
            version = resp.headers.get("Docker-Distribution-API-Version", "")
            return bool(resp.status == 200 and version.startswith("registry/2"))
    except (OSError, urllib.error.URLError):
        return False


@dataclass(frozen=True, kw_only=True)
class LocalRegistry:
    """A running registry: where it listens, its process and its state folder."""

    port: int
    pid: int
    folder: Path

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def lookaside(self) -> Path:
        """Where signatures of its images are kept (podman's lookaside store, a folder
        beside the storage; made fresh by ``start``, deleted by ``stop``)."""
        return self.folder / "lookaside"

    def catalog(self) -> list[str]:
        """The repositories it holds (``GET /v2/_catalog``)."""
        with urllib.request.urlopen(f"http://{self.address}/v2/_catalog", timeout=10) as resp:
            return list(json.load(resp).get("repositories") or [])


def _pid_file(folder: Path) -> Path:
    return folder / "registry.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _recorded(folder: Path) -> LocalRegistry | None:
    """The registry recorded in ``folder`` when its process is still alive."""
    try:
        rec = json.loads(_pid_file(folder).read_text())
    except (OSError, ValueError):
        return None
    reg = LocalRegistry(port=int(rec["port"]), pid=int(rec["pid"]), folder=folder)
    return reg if _alive(reg.pid) else None


def start(
    folder: Path | None = None, *, port: int | None = None, timeout: float = START_TIMEOUT_S
) -> LocalRegistry:
    """Start a registry with its state in ``folder`` (no-op when it runs already)."""
    folder = (folder or local_dir()).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    running = _recorded(folder)
    if running is not None and answers(running.address):
        return running
    binary = REGISTRY.ensure()
    port = port if port is not None else configured_port()
    if answers(f"{HOST}:{port}", timeout=0.5):
        raise ContainerToolError(f"port {port} already has a registry that is not ours")
    for old in [*folder.glob("storage-*"), folder / "lookaside"]:
        shutil.rmtree(old, ignore_errors=True)
    storage = Path(tempfile.mkdtemp(dir=folder, prefix="storage-"))
    (folder / "lookaside").mkdir()
    config = folder / "config.yml"
    config.write_text(
        CONFIG.format(storage=storage, host=HOST, port=port, secret=os.urandom(16).hex())
    )
    env = {
        **os.environ,
        "OTEL_SDK_DISABLED": "true",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    log = (folder / "registry.log").open("ab")
    proc = subprocess.Popen(
        [str(binary), "serve", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    log.close()
    reg = LocalRegistry(port=port, pid=proc.pid, folder=folder)
    _pid_file(folder).write_text(json.dumps({"pid": proc.pid, "port": port}))
    say(f"starting {REGISTRY.version} on {reg.address} (storage {storage})")
    deadline = time.monotonic() + timeout
    while not answers(reg.address, timeout=1.0):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(folder)
            tail = (folder / "registry.log").read_text(errors="replace")[-2000:]
            raise ContainerToolError(f"the registry did not come up on {reg.address}:\n{tail}")
        time.sleep(0.2)
    return reg


def stop(folder: Path | None = None, *, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the registry recorded in ``folder`` and delete its storage; True if one ran."""
    folder = (folder or local_dir()).resolve()
    running = _recorded(folder)
    if running is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(running.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(running.pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(running.pid, os.WNOHANG)
            time.sleep(0.1)
        if _alive(running.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(running.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(running.pid, 0)
    _pid_file(folder).unlink(missing_ok=True)
    for old in [*folder.glob("storage-*"), folder / "lookaside"]:
        shutil.rmtree(old, ignore_errors=True)
    return running is not None


def status(folder: Path | None = None) -> tuple[bool, str]:
    """(running and answering, a line saying so)."""
    folder = (folder or local_dir()).resolve()
    running = _recorded(folder)
    if running is None:
        return False, "registry not running"
    if not answers(running.address):
        return False, f"registry process {running.pid} does not answer on {running.address}"
    return True, f"registry {REGISTRY.version} running on {running.address} (pid {running.pid})"


@contextlib.contextmanager
def running_registry(folder: Path) -> Iterator[LocalRegistry]:
    """A registry of its own (state in ``folder``, a free port), stopped after the block."""
    reg = start(folder, port=free_port())
    try:
        yield reg
    finally:
        stop(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="registry.py", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "start", "stop", "status"])
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(REGISTRY.ensure())
        elif args.command == "start":
            reg = start()
            say(f"running on {reg.address} (pid {reg.pid}); state in {reg.folder}")
        elif args.command == "stop":
            say("stopped" if stop() else "was not running")
        else:
            ok, line = status()
            print(line)
            return 0 if ok else 1
    except ContainerToolError as exc:
        print(f"[registry] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
