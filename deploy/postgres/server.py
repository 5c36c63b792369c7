"""Run the local PostgreSQL test server: initdb, start, stop, status.

As root the server runs as the `postgres` OS user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import subprocess
import time
from pathlib import Path

from graylane.deploy.postgres.binaries import bin_dir, find_bin_dir, server_version
from graylane.deploy.postgres.layout import (
    DATABASE,
    HOST,
    OS_USER,
    SERVER_SETTINGS,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    SUPERUSER,
    PostgresLocalError,
    as_root,
    base_dir,
    data_dir,
    log_file,
    port,
    preferred_base,
    run_dir,
    say,
    server_lock,
    socket_dir,
    url,
)

__all__ = ["is_running", "running_pid", "start", "status", "stop", "tail"]


# ---------------------------------------------------------------------------- OS user / run
def _ensure_os_user() -> None:
    try:
        pwd.getpwnam(OS_USER)
        return
    except KeyError:
        pass
    say(f"creating the `{OS_USER}` OS user (PostgreSQL refuses to run as root)")
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", OS_USER],
        check=True,
    )


def _server_cmd(cmd: list[str]) -> list[str]:
    """initdb / pg_ctl must not run as root: run them as the postgres OS user then."""
    if as_root():
        return ["runuser", "-u", OS_USER, "--", *cmd]
    return cmd


def _run(
    cmd: list[str], timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    cwd = base_dir() if base_dir().is_dir() else Path("/")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd)
    if check and res.returncode != 0:
        raise PostgresLocalError(
            f"`{' '.join(cmd)}` failed (exit {res.returncode}):\n{res.stdout}{res.stderr}".rstrip()
        )
    return res


def _prepare_dirs() -> None:
    base = base_dir()
    for d in (base, run_dir()):
        d.mkdir(parents=True, exist_ok=True)
    if as_root():
        pw = pwd.getpwnam(OS_USER)
        for root, dirs, files in os.walk(base):
            os.chown(root, pw.pw_uid, pw.pw_gid)
            for name in dirs + files:
                with contextlib.suppress(FileNotFoundError):
                    os.lchown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)


# --------------------------------------------------------------------------------- state
def _postmaster_info() -> tuple[int, int] | None:
    """(pid, port) of a live postmaster of our data dir, from postmaster.pid."""
    try:
        lines = (data_dir() / "postmaster.pid").read_text().splitlines()
        pid, pm_port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if b"postgres" not in cmdline and b"postmaster" not in cmdline:
        return None  # stale file, pid reused; postgres itself cleans it up on start
    return pid, pm_port


def _clear_stale_pid_file(wait: float = 10.0) -> None:
    """Deal with postmaster.pid left by a postmaster that died without cleaning up.

    PostgreSQL removes a stale file itself, unless the recorded pid still "exists": a dead
    postmaster stays a zombie until its parent (often PID 1 after pg_ctl exited) reaps it, and
    some init processes reap slowly or never. Wait for that, then remove the file ourselves.
    """
    pid_path = data_dir() / "postmaster.pid"
    try:
        old_pid = int(pid_path.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(old_pid, 0)
        except ProcessLookupError:
            return  # gone for good: postgres handles the stale file itself
        except PermissionError:
            pass
        if _postmaster_info() is not None:
            return  # it is a live postmaster after all
        time.sleep(0.2)
    say(f"removing stale {pid_path} (pid {old_pid} is dead but not reaped)")
    pid_path.unlink(missing_ok=True)


def running_pid() -> int | None:
    """The pid of the live postmaster of our data dir, or None."""
    info = _postmaster_info()
    return info[0] if info else None


def is_running() -> bool:
    """True when a live postmaster owns our data dir."""
    return _postmaster_info() is not None


def _port_in_use(p: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((HOST, p)) == 0


def _psql(bins: Path, sql: str, p: int, database: str = "postgres") -> str:
    cmd = [
        str(bins / "psql"),
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-h",
        HOST,
        "-p",
        str(p),
        "-U",
        SUPERUSER,
        "-d",
        database,
        "-tAc",
        sql,
    ]
    return str(_run(cmd, timeout=30).stdout).strip()


def _ensure_database(bins: Path, p: int) -> None:
    exists = _psql(bins, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'", p)
    if exists != "1":
        _psql(bins, f'CREATE DATABASE "{DATABASE}"', p)
        say(f"created database {DATABASE}")


# -------------------------------------------------------------------------- start / stop
def _initdb(bins: Path) -> None:
    if (data_dir() / "PG_VERSION").exists():
        return
    say(f"initdb {data_dir()} (trust auth, UTF8, C locale)")
    if data_dir().exists() and any(data_dir().iterdir()):
        raise PostgresLocalError(f"{data_dir()} exists but is not a PostgreSQL data directory")
    _run(
        _server_cmd(
            [
                str(bins / "initdb"),
                "-D",
                str(data_dir()),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ]
        )
    )
    conf = data_dir() / "postgresql.conf"
    with open(conf, "a") as fh:
        fh.write(SERVER_SETTINGS)


def start(timeout: float = START_TIMEOUT_S) -> str:
    """Start the server (no-op when running) and make sure graylane_test exists; returns url()."""
    with server_lock():
        return _start_locked(timeout)


def _start_locked(timeout: float) -> str:
    wanted = port()
    info = _postmaster_info()
    bins = bin_dir(install=info is None)
    if info is not None:
        pid, running_port = info
        if running_port != wanted:
            raise PostgresLocalError(
                f"PostgreSQL is already running on port {running_port} (pid {pid}); "
                f"stop it first to use port {wanted}"
            )
        _ensure_database(bins, wanted)
        say(f"already running: {_describe(pid, wanted, bins)}")
        return url()

    _clear_stale_pid_file()
    if _port_in_use(wanted):
        raise PostgresLocalError(
            f"port {HOST}:{wanted} is already in use by another process; "
            "free it or set GRAYLANE_PG_PORT"
        )
    if as_root():
        _ensure_os_user()
    if base_dir() != preferred_base():
        say(f"the {OS_USER} user cannot reach {preferred_base()}; using {base_dir()}")
    _prepare_dirs()
    _initdb(bins)
    opts = f"-p {wanted} -k {socket_dir()} -c listen_addresses={HOST}"
    say(f"starting PostgreSQL {server_version(bins)} on {HOST}:{wanted}")
    t0 = time.monotonic()
    res = _run(
        _server_cmd(
            [
                str(bins / "pg_ctl"),
                "start",
                "-D",
                str(data_dir()),
                "-l",
                str(log_file()),
                "-w",
                "-t",
                str(int(timeout)),
                "-o",
                opts,
            ]
        ),
        timeout=timeout + 15,
        check=False,
    )
    if res.returncode != 0:
        raise PostgresLocalError(
            f"pg_ctl start failed (exit {res.returncode}):\n{res.stdout}{res.stderr}"
            f"--- {log_file()} (tail) ---\n{tail(log_file())}"
        )
    _ensure_database(bins, wanted)
    pid = running_pid() or -1
    say(f"{_describe(pid, wanted, bins)}, ready in {time.monotonic() - t0:.1f} s")
    return url()


def stop(timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the server (fast shutdown, then immediate); False when it was not running."""
    with server_lock():
        info = _postmaster_info()
        if info is None:
            say("not running")
            return False
        bins = bin_dir(install=False)
        t0 = time.monotonic()
        for mode in ("fast", "immediate"):
            res = _run(
                _server_cmd(
                    [
                        str(bins / "pg_ctl"),
                        "stop",
                        "-D",
                        str(data_dir()),
                        "-m",
                        mode,
                        "-w",
                        "-t",
                        str(int(timeout)),
                    ]
                ),
                timeout=timeout + 15,
                check=False,
            )
            if res.returncode == 0 or not is_running():
                say(f"stopped pid {info[0]} ({mode} shutdown) in {time.monotonic() - t0:.1f} s")
                return True
        raise PostgresLocalError(f"could not stop pid {info[0]}:\n{res.stdout}{res.stderr}")


def _describe(pid: int, p: int, bins: Path | None = None) -> str:
    return (
        f"PostgreSQL {server_version(bins)} running on {HOST}:{p} (pid {pid}), database {DATABASE}"
    )


def status() -> tuple[bool, str]:
    """(healthy, one-line description)."""
    info = _postmaster_info()
    if info is None:
        return False, "PostgreSQL not running"
    pid, p = info
    bins = find_bin_dir()
    if bins is not None:
        res = subprocess.run(
            [str(bins / "pg_isready"), "-q", "-h", HOST, "-p", str(p), "-U", SUPERUSER],
            check=False,
        )
        if res.returncode != 0:
            return False, f"pid {pid} is alive but not accepting connections on {HOST}:{p}"
    return True, _describe(pid, p, bins)


def tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} does not exist)"
