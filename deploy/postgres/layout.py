"""Settings and on-disk layout of the local PostgreSQL test server (port, URL, directories)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

from graylane.errors import GraylaneError

__all__ = [
    "DATABASE",
    "DEFAULT_PORT",
    "HERE",
    "HOST",
    "OS_USER",
    "REPO_ROOT",
    "SERVER_SETTINGS",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "SUPERUSER",
    "PostgresLocalError",
    "as_root",
    "base_dir",
    "data_dir",
    "log_file",
    "port",
    "preferred_base",
    "run_dir",
    "say",
    "server_lock",
    "socket_dir",
    "url",
]

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


class PostgresLocalError(GraylaneError):
    """Any failure of the local PostgreSQL tooling, with a message meant for humans."""


def say(msg: str) -> None:
    """Print a progress line prefixed with [postgres]."""
    print(f"[postgres] {msg}", flush=True)


# ---------------------------------------------------------------------------------- paths
def port() -> int:
    """$GRAYLANE_PG_PORT, else 55432."""
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


def as_root() -> bool:
    return os.geteuid() == 0


def preferred_base() -> Path:
    base = os.environ.get("GRAYLANE_LOCAL_DIR") or str(REPO_ROOT / ".local")
    return Path(base).expanduser().resolve() / "postgres"


def _fallback_base() -> Path:
    # As root with the checkout somewhere the postgres user cannot reach (e.g. under /root):
    # a stable per-checkout directory in /var/tmp instead.
    digest = hashlib.sha1(str(preferred_base()).encode()).hexdigest()[:10]
    return Path("/var/tmp") / f"graylane-postgres-{digest}"


def base_dir() -> Path:
    preferred = preferred_base()
    if not as_root() or _os_user_can_reach(preferred):
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


@contextlib.contextmanager
def server_lock() -> Iterator[None]:
    """Serialise start/stop of this checkout's server across processes (flock)."""
    lock = preferred_base() / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
