"""Process bookkeeping of the local broker: pid file, liveness, bootstrap address, log tails."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from graylane.deploy.kafka.layout import (
    HOST,
    MAIN_CLASS,
    VERSION_RE,
    configured_port,
    pid_file,
    say,
    server_log,
    server_properties,
)

__all__ = [
    "alive",
    "bootstrap",
    "bootstrap_port",
    "is_running",
    "logged_version",
    "properties_port",
    "running_pid",
    "tail",
    "terminate",
    "track_child",
]

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def track_child(proc: subprocess.Popen[bytes]) -> None:
    """Remember a broker we spawned so `alive` can reap it once it exits."""
    _CHILDREN[proc.pid] = proc


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie (reaps it if it is our own child)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return state not in ("Z", "X")


def _is_our_broker(pid: int) -> bool:
    args = _cmdline(pid)
    return MAIN_CLASS in args and str(server_properties()) in args


def _read_pid() -> int | None:
    try:
        text = pid_file().read_text().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _scan_for_broker() -> int | None:
    """Find our broker without a pid file (e.g. the file was deleted while it ran)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if pid != os.getpid() and _is_our_broker(pid) and alive(pid):
                return pid
    return None


def running_pid(cleanup: bool = True) -> int | None:
    """The pid of the broker started from this checkout, or None.

    A stale pid file (process gone, zombie, or pid reused by something that is not this
    broker) is removed when `cleanup` is true.
    """
    pid = _read_pid()
    if pid is not None and alive(pid) and _is_our_broker(pid):
        return pid
    if pid_file().exists() and cleanup:
        why = "unreadable" if pid is None else f"pid {pid} is not a running Kafka broker"
        say(f"removing stale pid file {pid_file()} ({why})")
        pid_file().unlink(missing_ok=True)
    found = _scan_for_broker()
    if found is not None and cleanup:
        pid_file().write_text(f"{found}\n")
    return found


def is_running() -> bool:
    """True when the broker of this local dir runs (stale pid files are cleaned up)."""
    return running_pid() is not None


def properties_port(path: Path) -> int | None:
    """The advertised PLAINTEXT port in a server.properties, or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    m = re.search(r"^advertised\.listeners=PLAINTEXT://[^:\s]+:(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def bootstrap_port() -> int:
    """Port of the running broker, else the configured one."""
    if running_pid(cleanup=False) is not None:
        port = properties_port(server_properties())
        if port is not None:
            return port
    return configured_port()


def bootstrap() -> str:
    """bootstrap.servers for clients, e.g. "127.0.0.1:9092"."""
    return f"{HOST}:{bootstrap_port()}"


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file (read from its last 64 KiB)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return f"({path} does not exist)"
    return "\n".join(data.splitlines()[-lines:])


def logged_version(since: int = 0) -> str | None:
    """Last "Kafka version: X" the broker logged (AppInfoParser, at startup) in
    ``server.log`` from byte ``since``, and in the files log4j rolled it into
    (``server.log.1`` is the newest; it rolls at 10 MB): when the log is shorter than
    ``since``, it rolled since, and what came after ``since`` is in ``server.log.1``
    and the new log."""
    log = server_log()
    try:
        size = log.stat().st_size
    except OSError:
        return None
    rolled = sorted(
        (p for p in log.parent.glob(log.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: int(p.suffix[1:]),
    )
    # Newest first: the last version logged is in the first file that has one.
    if since > size:  # rolled since: the new log, then the rest of the old one
        files = [(log, 0)] + ([(rolled[0], since)] if rolled else [])
    elif since > 0:
        files = [(log, since)]
    else:
        files = [(log, 0)] + [(p, 0) for p in rolled]
    for path, start in files:
        found = VERSION_RE.findall(_read_from(path, start))
        if found:
            return str(found[-1])
    return None


def _read_from(path: Path, start: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def terminate(pid: int, grace: float) -> str:
    """SIGTERM, wait `grace` seconds, then SIGKILL. Returns how it ended."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid):
            return "clean shutdown"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if not alive(pid):
            break
        time.sleep(0.1)
    return f"killed (no clean shutdown within {grace:.0f} s)"
