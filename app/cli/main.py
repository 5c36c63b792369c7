"""``graylane``: one entry point; servers under ``graylane serve``, the rest beside it.

Each subcommand lives in its own module exposing ``register(subparsers)``; heavy
imports happen inside the handlers so ``graylane --help`` stays fast.

The servers (``serve router|worker|gateway|policy|controlplane|audit-sink``) used to
be top-level commands: those spellings still parse for one release (unlisted in
``--help``), and running one prints a note on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from typing import Any, cast

__all__ = [
    "COMMAND_MODULES",
    "LEGACY_SERVER_COMMANDS",
    "SERVER_REGISTRARS",
    "build_parser",
    "main",
    "serve_argv",
    "version",
]

# Modules that add client and tool subcommands, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "graylane.app.cli.stack",
    "graylane.app.cli.scaler",
    "graylane.app.cli.demo",
    "graylane.app.cli.bench",
    "graylane.app.cli.load",
    "graylane.app.cli.models",
    "graylane.app.cli.rollouts",
    "graylane.app.cli.qos",
    "graylane.app.cli.routes",
    "graylane.app.cli.audit",
    "graylane.app.cli.releases",
    "graylane.app.cli.contexts",
    "graylane.app.cli.deploy",
    "graylane.app.cli.build",
    "graylane.app.cli.eval",
    "graylane.app.cli.artifacts",
    "graylane.app.cli.capacity",
    "graylane.app.cli.capture",
    "graylane.app.cli.check",
    "graylane.app.cli.acls",
    "graylane.app.cli.completion",
)

# ``module:function`` adding the servers under ``graylane serve``.
SERVER_REGISTRARS: tuple[str, ...] = (
    "graylane.app.cli.services:register",
    "graylane.app.cli.policy:register",
    "graylane.app.cli.controlplane:register_server",
    "graylane.app.cli.audit_sink:register",
)

LEGACY_SERVER_COMMANDS = frozenset(
    {"router", "worker", "gateway", "policy", "controlplane", "audit-sink"}
)
"""Top-level spellings of the servers, kept for one release."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("graylane")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _PrintVersion(argparse.Action):
    """``--version``: read the build only when asked (it may run git)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from graylane.running_build import running_build

        build = running_build()
        print(
            f"graylane {version()}\ncommit {build.git_sha}\n"
            f"built {build.build_time} ({build.source.value})"
        )
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graylane",
        description="Gray releases and elastic precision QoS for inference over Kafka.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--version",
        action=_PrintVersion,
        nargs=0,
        help="print the version, the git commit and the build time",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser("serve", help="run a server: router, worker, gateway, policy, ...")
    serve_sub = serve.add_subparsers(dest="server", metavar="SERVER", required=True)
    for target in SERVER_REGISTRARS:
        path, _, function = target.partition(":")
        register = getattr(importlib.import_module(path), function)
        register(serve_sub)
        register(cast(Any, _OldSpellings(sub)))
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(sub)
    return parser


class _OldSpellings:
    """Adds a server again at the top level, unlisted, marked as the old spelling."""

    def __init__(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        self._sub = sub

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.pop("help", None)  # no help: argparse leaves it out of the command list
        parser = self._sub.add_parser(name, **kwargs)
        parser.set_defaults(old_spelling=name)
        return parser


def serve_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` of a server in today's spelling: ``["router", ...]`` -> ``["serve", "router",
    ...]``."""
    args = list(argv)
    return ["serve", *args] if args and args[0] in LEGACY_SERVER_COMMANDS else args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    old = getattr(args, "old_spelling", None)
    if old is not None:
        print(
            f"graylane: `graylane {old}` is deprecated: use `graylane serve {old}`",
            file=sys.stderr,
        )
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
