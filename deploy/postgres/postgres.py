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
Modules: ``layout`` (port, URL, directories), ``binaries`` (find/install the server),
``server`` (initdb, start, stop, status); this file is the command line over them.

Environment: GRAYLANE_PG_PORT (55432), GRAYLANE_PG_BIN, GRAYLANE_LOCAL_DIR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a script (python deploy/postgres/postgres.py): import the package from the repo
    # root, not from this folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from graylane.deploy.postgres.layout import (
    PostgresLocalError,
    log_file,
    url,
)
from graylane.deploy.postgres.server import (
    start,
    status,
    stop,
    tail,
)

__all__ = [
    "main",
]


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
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
            print(tail(log_file(), args.lines))
    except PostgresLocalError as exc:
        print(f"[postgres] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
