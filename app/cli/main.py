"""``graylane``: one entry point, one subcommand per job.

Each subcommand lives in its own module exposing ``register(subparsers)``; heavy
imports happen inside the handlers so ``graylane --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import sys
from collections.abc import Sequence

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

# Modules that add subcommands, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "graylane.app.cli.stack",
    "graylane.app.cli.services",
    "graylane.app.cli.scaler",
    "graylane.app.cli.demo",
    "graylane.app.cli.bench",
    "graylane.app.cli.policy",
    "graylane.app.cli.ops",
    "graylane.app.cli.audit_sink",
    "graylane.app.cli.deploy",
    "graylane.app.cli.build",
    "graylane.app.cli.capacity",
    "graylane.app.cli.capture",
    "graylane.app.cli.check",
    "graylane.app.cli.acls",
)


def _version() -> str:
    try:
        return importlib.metadata.version("graylane")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graylane",
        description="Gray releases and elastic precision QoS for inference over Kafka.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"graylane {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        result = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
