"""Finding (or, as root on Debian/Ubuntu, installing) the PostgreSQL server binaries."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from graylane.deploy.postgres.layout import (
    PostgresLocalError,
    as_root,
    say,
)

__all__ = ["bin_dir", "find_bin_dir", "server_version"]


# ------------------------------------------------------------------------------- binaries
def _bin_dir_ok(d: Path) -> bool:
    return all((d / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres", "psql"))


def _version_key(p: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", p.parent.name)) or (0,)


def find_bin_dir() -> Path | None:
    """$GRAYLANE_PG_BIN, else next to initdb on PATH, else the newest /usr/lib/postgresql/*/bin."""
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
    if not as_root():
        raise PostgresLocalError(
            "PostgreSQL server binaries (initdb, pg_ctl) not found; install them with\n"
            "    sudo apt-get install -y postgresql\n"
            "or set GRAYLANE_PG_BIN=/path/to/postgres/bin"
        )
    say("initdb/pg_ctl not found: installing the Debian package `postgresql` (apt-get)")
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
        say("$ " + " ".join(cmd))
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
            raise PostgresLocalError(f"`{' '.join(cmd)}` failed (exit {res.returncode}):\n{tail}")
    say(f"installed postgresql in {time.monotonic() - t0:.0f} s")


def bin_dir(install: bool = True) -> Path:
    """The server binaries; installs them with apt-get (as root) when missing and allowed."""
    d = find_bin_dir()
    if d is None and install:
        _install_with_apt()
        d = find_bin_dir()
    if d is None:
        raise PostgresLocalError("PostgreSQL server binaries not found (initdb, pg_ctl)")
    return d


def server_version(bins: Path | None = None) -> str:
    """The `postgres --version` number, or "?"."""
    bins = bins or find_bin_dir()
    if bins is None:
        return "?"
    out = subprocess.run(
        [str(bins / "postgres"), "--version"], capture_output=True, text=True, check=False
    ).stdout
    m = re.search(r"(\d+(?:\.\d+)*)", out)
    return m.group(1) if m else "?"
