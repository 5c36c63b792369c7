#!/usr/bin/env python3
"""Local single-node Apache Kafka broker (KRaft, no Docker) for Graylane tests and demos.

Usage::

    python deploy/kafka/kafka.py fetch     # download the broker jars once (Maven Central)
    python deploy/kafka/kafka.py start     # format storage once, start in background, wait ready
    python deploy/kafka/kafka.py status    # "Apache Kafka 4.0.1 running on 127.0.0.1:9092 (pid N)"
    python deploy/kafka/kafka.py stop      # SIGTERM, wait up to 30 s, then SIGKILL
    python deploy/kafka/kafka.py logs [-n 50] [-f]
    python deploy/kafka/kafka.py reset     # stop and delete the broker data (topics, offsets)

From Python (stdlib only), from the modules that hold each step::

    from graylane.deploy.kafka import broker, process
    broker.start()           # -> "127.0.0.1:9092"; no-op when already running
    process.bootstrap()      # -> "127.0.0.1:9092"
    process.is_running()
    broker.stop()

Layout:
  * jars:  ${GRAYLANE_CACHE_DIR:-~/.cache/graylane}/kafka-<version>/libs   (shared between clones)
  * state: ${GRAYLANE_LOCAL_DIR:-<repo>/.local}/kafka/{config,data,logs,kafka.pid}

Modules: ``layout`` (versions, paths, ports), ``probe`` (raw wire-protocol readiness probe),
``maven`` (jar download), ``process`` (pid file, liveness), ``secure`` (secured mode),
``broker`` (start/stop/status);
this file is the command line over them.

Environment: GRAYLANE_KAFKA_PORT (9092), GRAYLANE_KAFKA_CONTROLLER_PORT (port + 1000),
GRAYLANE_CACHE_DIR, GRAYLANE_LOCAL_DIR, JAVA_HOME (else `java` from PATH), MVN (else `mvn`),
GRAYLANE_KAFKA_SECURE=1 (SASL/PLAIN logins per role + StandardAuthorizer, see ``secure``).
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a script (python deploy/kafka/kafka.py): import the package from the repo root,
    # not from this folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from graylane.deploy.kafka.broker import (
    logs,
    reset,
    start,
    status,
    stop,
)
from graylane.deploy.kafka.layout import (
    HOST,
    KAFKA_VERSION,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    KafkaLocalError,
    libs_dir,
    say,
)
from graylane.deploy.kafka.maven import fetch, is_fetched
from graylane.deploy.kafka.probe import (
    ClusterMetadata,
)
from graylane.deploy.kafka.probe import probe as _probe
from graylane.deploy.kafka.process import (
    bootstrap,
    bootstrap_port,
)

__all__ = [
    "main",
    "probe",
]


def probe(host: str = HOST, port: int | None = None, timeout: float = 5.0) -> ClusterMetadata:
    """Probe a broker (default: the running local one) over the raw wire protocol."""
    return _probe(host, port if port is not None else bootstrap_port(), timeout)


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="kafka.py", description=f"Local Apache Kafka {KAFKA_VERSION} broker (KRaft, no Docker)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download the broker jars into the cache (once)")
    p_fetch.add_argument("--force", action="store_true", help="download again")
    p_start = sub.add_parser("start", help="start in the background and wait until it answers")
    p_start.add_argument("--port", type=int, default=None, help="default $GRAYLANE_KAFKA_PORT/9092")
    p_start.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    p_stop = sub.add_parser("stop", help="SIGTERM, wait for a clean shutdown, then SIGKILL")
    p_stop.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S)
    sub.add_parser("status", help="exit 0 when running and answering, else 1")
    sub.add_parser("bootstrap", help="print bootstrap.servers")
    p_logs = sub.add_parser("logs", help="tail the broker log")
    p_logs.add_argument("-n", "--lines", type=int, default=50)
    p_logs.add_argument("-f", "--follow", action="store_true")
    sub.add_parser("reset", help="stop and delete the broker data")
    args = parser.parse_args(argv)

    try:
        if args.command == "fetch":
            if not args.force and is_fetched():
                say(f"fetch: already complete in {libs_dir()}")
            else:
                fetch(force=args.force)
        elif args.command == "start":
            start(port=args.port, timeout=args.timeout)
        elif args.command == "stop":
            stop(timeout=args.timeout)
        elif args.command == "status":
            ok, line = status()
            print(line)
            return 0 if ok else 1
        elif args.command == "bootstrap":
            print(bootstrap())
        elif args.command == "logs":
            logs(args.lines, args.follow)
        elif args.command == "reset":
            reset()
    except KafkaLocalError as exc:
        print(f"[kafka] ERROR: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            return 0
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
