#!/usr/bin/env python3
"""Check the Prometheus rules with ``promtool`` (installed from Debian when missing).

Usage::

    python deploy/prometheus/prometheus.py check     # check the rules, run the rule tests
    python deploy/prometheus/prometheus.py promtool  # print the promtool path (installs it)

``promtool`` is taken from $GRAYLANE_PROMTOOL or PATH. When it is missing and we are root
on Debian/Ubuntu, the ``prometheus`` package is installed with apt-get (``apt-get update``
only when the first install attempt fails); a ``policy-rc.d`` that forbids service starts
is in place during the install so no Prometheus daemon is left running.
Importable (stdlib only): ``promtool()``, ``check()``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from graylane.errors import GraylaneError

__all__ = ["HERE", "RULES", "RULE_TESTS", "PrometheusToolError", "check", "main", "promtool"]

HERE = Path(__file__).resolve().parent
RULES = sorted((HERE / "rules").glob("*.yml"))
RULE_TESTS = sorted((HERE / "tests").glob("*.yml"))
_POLICY_RC = Path("/usr/sbin/policy-rc.d")


class PrometheusToolError(GraylaneError):
    """promtool is missing and cannot be installed, or a check failed."""


def _say(msg: str) -> None:
    print(f"[prometheus] {msg}", flush=True)


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["apt-get", *args]
    _say("$ " + " ".join(cmd))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)


def _install_with_apt() -> None:
    if not shutil.which("apt-get") or os.geteuid() != 0:
        raise PrometheusToolError(
            "promtool not found; install it with `sudo apt-get install -y prometheus` "
            "or set GRAYLANE_PROMTOOL=/path/to/promtool"
        )
    install = ("install", "-y", "-q", "--no-install-recommends", "prometheus")
    ours = not _POLICY_RC.exists()
    if ours:  # forbid the package's post-install from starting a daemon
        _POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        _POLICY_RC.chmod(0o755)
    try:
        res = _apt(*install)
        if res.returncode != 0:  # stale or missing package lists: refresh once
            _apt("update", "-q")
            res = _apt(*install)
    finally:
        if ours:
            _POLICY_RC.unlink(missing_ok=True)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-20:])
        raise PrometheusToolError(f"apt-get install prometheus failed:\n{tail}")


def promtool(install: bool = True) -> str:
    found = os.environ.get("GRAYLANE_PROMTOOL") or shutil.which("promtool")
    if not found and install:
        _install_with_apt()
        found = shutil.which("promtool")
    if not found:
        raise PrometheusToolError("promtool not found")
    return found


def check() -> None:
    """``promtool check rules`` and ``promtool test rules``; raises on a failure."""
    tool = promtool()
    for args in (
        ["check", "rules", *map(str, RULES)],
        ["test", "rules", *map(str, RULE_TESTS)],
    ):
        _say("$ promtool " + " ".join(args[:2]))
        res = subprocess.run([tool, *args], capture_output=True, text=True, check=False)
        print(res.stdout + res.stderr, end="", flush=True)
        if res.returncode != 0:
            raise PrometheusToolError(f"promtool {' '.join(args[:2])} failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["check", "promtool"], nargs="?", default="check")
    args = parser.parse_args(argv)
    try:
        if args.command == "promtool":
            print(promtool())
        else:
            check()
    except PrometheusToolError as exc:
        _say(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
