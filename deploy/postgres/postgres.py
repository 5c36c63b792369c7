#!/usr/bin/env python3
"""Local throwaway PostgreSQL server for the Graylane registry tests (no Docker).

Usage::

    python deploy/postgres/postgres.py start    # initdb once, start, create database graylane_test
    python deploy/postgres/postgres.py status   # "PostgreSQL 15.x running on 127.0.0.1:55432 ..."
    python deploy/postgres/postgres.py url      # postgresql+psycopg://postgres@127.0.0.1:55432/...
    python deploy/postgres/postgres.py stop
    python deploy/postgres/postgres.py logs [-n 50]

Importable (stdlib only): ``start()``, ``stop()``, ``url()``, ``is_running()``.

The server binaries are found in $GRAYLANE_PG_BIN, next to an `initdb` on PATH, or in
/usr/lib/postgresql/<major>/bin. When none is found and we are root on Debian/Ubuntu, the
`postgresql` package is installed with apt-get. PostgreSQL refuses to run as root, so as root
the server runs as the `postgres` OS user (created when missing) through `runuser`.

Data: ${GRAYLANE_LOCAL_DIR:-<repo>/.local}/postgres/{data,run,postgres.log}. Trust
authentication, listening on 127.0.0.1 only; fsync is off: this is a test database.
Environment: GRAYLANE_PG_PORT (55432), GRAYLANE_PG_BIN, GRAYLANE_LOCAL_DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_PORT = 55432
DATABASE = "graylane_test"
SUPERUSER = "postgres"
OS_USER = "postgres"  # the OS account used when we are root
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent

# Appended to postgresql.conf once, after initdb. Port, socket dir and listen address are
# passed on the command line at every start instead, so GRAYLANE_PG_PORT can change.
SERVER_SETTINGS = """
# ---- graylane local test server (deploy/postgres/postgres.py) ----
# Throwaway test database: durability traded for speed.
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 64MB
max_connections = 100
log_min_messages = warning
log_line_prefix = '%m [%p] '
"""


class PostgresLocalError(RuntimeError):
    """Any failure of the local PostgreSQL tooling, with a message meant for humans."""


def _say(msg: str) -> None:
    print(f"[postgres] {msg}", flush=True)


# ---------------------------------------------------------------------------------- paths
def port() -> int:
    raw = os.environ.get("GRAYLANE_PG_PORT", "").strip()
    if not raw:
        return DEFAULT_PORT
    try:
        value = int(raw)
    except ValueError:
        raise PostgresLocalError(f"GRAYLANE_PG_PORT={raw!r} is not a port number") from None
    if not 0 < value < 65536:
        raise PostgresLocalError(f"GRAYLANE_PG_PORT={value} is out of range")
    return value


def url(database: str = DATABASE) -> str:
    """SQLAlchemy URL of the test database."""
    return f"postgresql+psycopg://{SUPERUSER}@{HOST}:{port()}/{database}"


def _as_root() -> bool:
    return os.geteuid() == 0


def _preferred_base() -> Path:
    base = os.environ.get("GRAYLANE_LOCAL_DIR") or str(REPO_ROOT / ".local")
    return Path(base).expanduser().resolve() / "postgres"


def _fallback_base() -> Path:
    # As root with the checkout somewhere the postgres user cannot reach (e.g. under /root):
    # a stable per-checkout directory in /var/tmp instead.
    digest = hashlib.sha1(str(_preferred_base()).encode()).hexdigest()[:10]
    return Path("/var/tmp") / f"graylane-postgres-{digest}"


def base_dir() -> Path:
    preferred = _preferred_base()
    if not _as_root() or _os_user_can_reach(preferred):
        return preferred
    fallback = _fallback_base()
    marker = preferred / "DATA_IS_ELSEWHERE"
    with contextlib.suppress(OSError):
        preferred.mkdir(parents=True, exist_ok=True)
        if not marker.exists():
            marker.write_text(f"{fallback}\n")
    return fallback


def data_dir() -> Path:
    return base_dir() / "data"


def run_dir() -> Path:
    return base_dir() / "run"


def log_file() -> Path:
    return base_dir() / "postgres.log"


def socket_dir() -> Path:
    d = run_dir()
    # sun_path is 108 bytes; ".s.PGSQL.NNNNN.lock" must fit after the directory.
    return d if len(str(d)) < 80 else Path("/tmp")


def _os_user_can_reach(path: Path) -> bool:
    """Can the postgres OS user traverse every existing ancestor of `path`?"""
    try:
        pw = pwd.getpwnam(OS_USER)
    except KeyError:
        pw = None
    for parent in [path, *path.parents]:
        try:
            st = parent.stat()
        except FileNotFoundError:
            continue
        if pw is not None and st.st_uid == pw.pw_uid:
            ok = bool(st.st_mode & 0o100)
        elif pw is not None and st.st_gid == pw.pw_gid:
            ok = bool(st.st_mode & 0o010)
        else:
            ok = bool(st.st_mode & 0o001)
        if not ok:
            return False
    return True


# ------------------------------------------------------------------------------- binaries
def _bin_dir_ok(d: Path) -> bool:
    return all((d / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres", "psql"))


def _version_key(p: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", p.parent.name)) or (0,)


def find_bin_dir() -> Path | None:
    env = os.environ.get("GRAYLANE_PG_BIN")
    if env:
        d = Path(env).expanduser()
        if not _bin_dir_ok(d):
            raise PostgresLocalError(f"GRAYLANE_PG_BIN={d} lacks initdb/pg_ctl/postgres/psql")
        return d
    for exe in ("initdb", "pg_ctl"):
        found = shutil.which(exe)
        if found:
            # /usr/local/bin/initdb may be a symlink into /usr/lib/postgresql/<v>/bin.
            d = Path(found).resolve().parent
            if _bin_dir_ok(d):
                return d
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    candidates += [Path("/usr/local/pgsql/bin")]
    for d in candidates:
        if _bin_dir_ok(d):
            return d
    return None


def _install_with_apt() -> None:
    if not shutil.which("apt-get"):
        raise PostgresLocalError(
            "PostgreSQL server binaries (initdb, pg_ctl) not found and no apt-get to install "
            "them; install PostgreSQL or set GRAYLANE_PG_BIN=/path/to/bin"
        )
    if not _as_root():
        raise PostgresLocalError(
            "PostgreSQL server binaries (initdb, pg_ctl) not found; install them with\n"
            "    sudo apt-get install -y postgresql\n"
            "or set GRAYLANE_PG_BIN=/path/to/postgres/bin"
        )
    _say("initdb/pg_ctl not found: installing the Debian package `postgresql` (apt-get)")
    # We only need the binaries: ask postgresql-common not to create (and start) the
    # default "main" cluster on port 5432.
    with contextlib.suppress(OSError):
        conf_d = Path("/etc/postgresql-common/createcluster.d")
        conf_d.mkdir(parents=True, exist_ok=True)
        (conf_d / "graylane-no-main-cluster.conf").write_text("create_main_cluster = false\n")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    t0 = time.monotonic()
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"],
    ):
        _say("$ " + " ".join(cmd))
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
            raise PostgresLocalError(f"`{' '.join(cmd)}` failed (exit {res.returncode}):\n{tail}")
    _say(f"installed postgresql in {time.monotonic() - t0:.0f} s")


def bin_dir(install: bool = True) -> Path:
    d = find_bin_dir()
    if d is None and install:
        _install_with_apt()
        d = find_bin_dir()
    if d is None:
        raise PostgresLocalError("PostgreSQL server binaries not found (initdb, pg_ctl)")
    return d


# ---------------------------------------------------------------------------- OS user / run
def _ensure_os_user() -> None:
    try:
        pwd.getpwnam(OS_USER)
        return
    except KeyError:
        pass
    _say(f"creating the `{OS_USER}` OS user (PostgreSQL refuses to run as root)")
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", OS_USER],
        check=True,
    )


def _server_cmd(cmd: list[str]) -> list[str]:
    """initdb / pg_ctl must not run as root: run them as the postgres OS user then."""
    if _as_root():
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
    if _as_root():
        pw = pwd.getpwnam(OS_USER)
        for root, dirs, files in os.walk(base):
            os.chown(root, pw.pw_uid, pw.pw_gid)
            for name in dirs + files:
                with contextlib.suppress(FileNotFoundError):
                    os.lchown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    lock = _preferred_base() / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
    _say(f"removing stale {pid_path} (pid {old_pid} is dead but not reaped)")
    pid_path.unlink(missing_ok=True)


def running_pid() -> int | None:
    info = _postmaster_info()
    return info[0] if info else None


def is_running() -> bool:
    return _postmaster_info() is not None


def _port_in_use(p: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((HOST, p)) == 0


def server_version(bins: Path | None = None) -> str:
    bins = bins or find_bin_dir()
    if bins is None:
        return "?"
    out = subprocess.run(
        [str(bins / "postgres"), "--version"], capture_output=True, text=True, check=False
    ).stdout
    m = re.search(r"(\d+(?:\.\d+)*)", out)
    return m.group(1) if m else "?"


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
        _say(f"created database {DATABASE}")


# -------------------------------------------------------------------------- start / stop
def _initdb(bins: Path) -> None:
    if (data_dir() / "PG_VERSION").exists():
        return
    _say(f"initdb {data_dir()} (trust auth, UTF8, C locale)")
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
    with _lock():
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
        _say(f"already running: {_describe(pid, wanted, bins)}")
        return url()

    _clear_stale_pid_file()
    if _port_in_use(wanted):
        raise PostgresLocalError(
            f"port {HOST}:{wanted} is already in use by another process; "
            "free it or set GRAYLANE_PG_PORT"
        )
    if _as_root():
        _ensure_os_user()
    if base_dir() != _preferred_base():
        _say(f"the {OS_USER} user cannot reach {_preferred_base()}; using {base_dir()}")
    _prepare_dirs()
    _initdb(bins)
    opts = f"-p {wanted} -k {socket_dir()} -c listen_addresses={HOST}"
    _say(f"starting PostgreSQL {server_version(bins)} on {HOST}:{wanted}")
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
            f"--- {log_file()} (tail) ---\n{_tail(log_file())}"
        )
    _ensure_database(bins, wanted)
    pid = running_pid() or -1
    _say(f"{_describe(pid, wanted, bins)}, ready in {time.monotonic() - t0:.1f} s")
    return url()


def stop(timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the server (fast shutdown, then immediate); False when it was not running."""
    with _lock():
        info = _postmaster_info()
        if info is None:
            _say("not running")
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
                _say(f"stopped pid {info[0]} ({mode} shutdown) in {time.monotonic() - t0:.1f} s")
                return True
        raise PostgresLocalError(f"could not stop pid {info[0]}:\n{res.stdout}{res.stderr}")


def _describe(pid: int, p: int, bins: Path | None = None) -> str:
    return (
        f"PostgreSQL {server_version(bins)} running on {HOST}:{p} (pid {pid}), database {DATABASE}"
    )


def status() -> tuple[bool, str]:
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


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} does not exist)"


# ----------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="postgres.py", description="Local PostgreSQL test server")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start", help="initdb once, start, create the graylane_test database")
    sub.add_parser("stop", help="stop (fast shutdown)")
    sub.add_parser("status", help="exit 0 when running and accepting connections, else 1")
    sub.add_parser("url", help="print the SQLAlchemy URL of the test database")
    p_logs = sub.add_parser("logs", help="tail the server log")
    p_logs.add_argument("-n", "--lines", type=int, default=50)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            start()
        elif args.command == "stop":
            stop()
        elif args.command == "status":
            ok, line = status()
            print(line)
            return 0 if ok else 1
        elif args.command == "url":
            print(url())
        elif args.command == "logs":
            print(_tail(log_file(), args.lines))
    except PostgresLocalError as exc:
        print(f"[postgres] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
