"""Where the operator commands connect: a config file of named contexts, like kubeconfig.

The file (``$GRAYLANE_CONFIG``, else ``$XDG_CONFIG_HOME/graylane/config.yaml``, else
``~/.config/graylane/config.yaml``)::

    current-context: prod
    contexts:
      - name: prod
        address: cp.prod.example.com:443
        token-file: ~/.config/graylane/prod.token
        ca: ~/.config/graylane/prod-ca.pem     # present: connect with TLS
      - name: local
        address: 127.0.0.1:50051

Each setting is taken from the first that has it (:func:`resolve`):

1. the command's flags (``--addr``, ``--token-file``, ``--ca``);
2. the environment (``GRAYLANE_CP_ADDR``, ``GRAYLANE_TOKEN`` or ``GRAYLANE_TOKEN_FILE``;
   ``GRAYLANE_CP_TOKEN`` is still read);
3. the context named by ``--context`` (or ``GRAYLANE_CONTEXT``), else the file's
   ``current-context``;
4. the default address ``127.0.0.1:50051``, no token, plaintext.

A token is never needed on the command line: ``--token`` still works for one
release, with a note that it ends up in the shell's history.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = [
    "DEFAULT_ADDRESS",
    "ConfigError",
    "Connection",
    "ConnectionFlags",
    "Context",
    "ContextFile",
    "config_path",
    "register",
    "resolve",
]

DEFAULT_ADDRESS = "127.0.0.1:50051"


class ConfigError(ValueError):
    """The config file cannot be read, or names a context it does not hold."""


@dataclass(frozen=True, kw_only=True)
class Context:
    """One control plane to talk to, and how."""

    name: str
    address: str = ""
    token_file: Path | None = None
    ca: Path | None = None
    """A CA certificate (PEM): present, the connection uses TLS."""


@dataclass(frozen=True, kw_only=True)
class ContextFile:
    """The config file's contents: contexts by name and the current one."""

    contexts: tuple[Context, ...] = ()
    current: str = ""

    def get(self, name: str) -> Context:
        for context in self.contexts:
            if context.name == name:
                return context
        known = ", ".join(c.name for c in self.contexts) or "none"
        raise ConfigError(f"no context named {name!r} (contexts: {known})")

    def with_context(self, context: Context) -> ContextFile:
        """This file with ``context`` added, or replacing the one of the same name."""
        kept = tuple(c for c in self.contexts if c.name != context.name)
        return replace(self, contexts=(*kept, context))

    def use(self, name: str) -> ContextFile:
        self.get(name)
        return replace(self, current=name)

    @classmethod
    def load(cls, path: Path) -> ContextFile:
        """The file at ``path``; an absent file holds no contexts."""
        import yaml

        if not path.exists():
            return cls()
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("contexts", []), list):
            raise ConfigError(f"{path}: expected a mapping with a 'contexts' list")
        contexts = []
        for entry in raw.get("contexts", []):
            if not isinstance(entry, dict) or not entry.get("name"):
                raise ConfigError(f"{path}: every context needs a name")
            contexts.append(
                Context(
                    name=str(entry["name"]),
                    address=str(entry.get("address", "")),
                    token_file=_path(entry.get("token-file"), path.parent),
                    ca=_path(entry.get("ca"), path.parent),
                )
            )
        return cls(contexts=tuple(contexts), current=str(raw.get("current-context", "") or ""))

    def save(self, path: Path) -> None:
        import yaml

        entries = []
        for c in self.contexts:
            entry: dict[str, str] = {"name": c.name}
            if c.address:
                entry["address"] = c.address
            if c.token_file is not None:
                entry["token-file"] = str(c.token_file)
            if c.ca is not None:
                entry["ca"] = str(c.ca)
            entries.append(entry)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump(
            {"current-context": self.current, "contexts": entries}, sort_keys=False
        )
        path.write_text(text)


def _path(value: object, base: Path) -> Path | None:
    """A path from the file: ``~`` expanded, relative to the file's folder."""
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else base / path


def config_path(env: Mapping[str, str]) -> Path:
    if env.get("GRAYLANE_CONFIG"):
        return Path(env["GRAYLANE_CONFIG"]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "graylane" / "config.yaml"


@dataclass(frozen=True, kw_only=True)
class ConnectionFlags:
    """What the command line said (empty / ``None``: not given)."""

    address: str = ""
    token_file: Path | None = None
    token: str = ""
    """``--token``: deprecated, kept for one release."""
    ca: Path | None = None
    context: str = ""


@dataclass(frozen=True, kw_only=True)
class Connection:
    """Where one command connects, resolved."""

    address: str
    token: str = field(default="", repr=False)
    ca: Path | None = None
    context: str = ""
    """The context it came from, if any."""


def resolve(flags: ConnectionFlags, env: Mapping[str, str], config: ContextFile) -> Connection:
    """The connection of one command: flags, then environment, then context, then defaults."""
    name = flags.context or env.get("GRAYLANE_CONTEXT", "") or config.current
    context = config.get(name) if name else Context(name="")
    token_file = flags.token_file or _env_path(env, "GRAYLANE_TOKEN_FILE")
    if flags.token:
        token = flags.token
    elif token_file is not None:
        token = _read_token(token_file)
    elif env.get("GRAYLANE_TOKEN") or env.get("GRAYLANE_CP_TOKEN"):
        token = env.get("GRAYLANE_TOKEN") or env.get("GRAYLANE_CP_TOKEN", "")
    elif context.token_file is not None:
        token = _read_token(context.token_file)
    else:
        token = ""
    return Connection(
        address=flags.address
        or env.get("GRAYLANE_CP_ADDR", "")
        or context.address
        or DEFAULT_ADDRESS,
        token=token,
        ca=flags.ca or _env_path(env, "GRAYLANE_CP_CA") or context.ca,
        context=context.name,
    )


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    return Path(env[name]).expanduser() if env.get(name) else None


def _read_token(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror}") from None


def environment() -> Mapping[str, str]:
    """The process environment (the one place this module reads it)."""
    return os.environ


# -- ``graylane config``: the file's contexts ------------------------------------------------


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = sub.add_parser(
        "config", help="contexts of the config file: which control plane, token and CA"
    )
    csub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    get = csub.add_parser("get-contexts", help="the contexts, the current one starred")
    get.add_argument(
        "-o",
        "--output",
        choices=("table", "name"),
        default="table",
        help="table (default) or name: one context name per line",
    )
    get.set_defaults(handler=_get_contexts)
    use = csub.add_parser("use-context", help="make a context the current one")
    use.add_argument("name", help="a context's name")
    use.set_defaults(handler=_use_context)
    csub.add_parser("current-context", help="print the current context's name").set_defaults(
        handler=_current_context
    )
    put = csub.add_parser("set-context", help="add a context, or change one")
    put.add_argument("name", help="the context's name")
    put.add_argument("--addr", default="", help="control plane host:port")
    put.add_argument("--token-file", type=Path, help="file holding the bearer token")
    put.add_argument("--ca", type=Path, help="CA certificate (PEM): connect with TLS")
    put.add_argument("--use", action="store_true", help="also make it the current context")
    put.set_defaults(handler=_set_context)


def _load() -> tuple[Path, ContextFile]:
    path = config_path(environment())
    try:
        return path, ContextFile.load(path)
    except ConfigError as exc:
        raise SystemExit(f"graylane: {exc}") from None


def _get_contexts(args: argparse.Namespace) -> int:
    from graylane.app.cli.views import table

    path, config = _load()
    if args.output == "name":
        for c in config.contexts:
            print(c.name)
        return 0
    table(
        str(path),
        ("current", "name", "address", "token file", "ca"),
        [
            (
                "*" if c.name == config.current else "",
                c.name,
                c.address or DEFAULT_ADDRESS,
                c.token_file or "-",
                c.ca or "- (plaintext)",
            )
            for c in config.contexts
        ],
    )
    return 0


def _use_context(args: argparse.Namespace) -> int:
    path, config = _load()
    try:
        config = config.use(args.name)
    except ConfigError as exc:
        raise SystemExit(f"graylane: {exc}") from None
    config.save(path)
    print(f"switched to context {args.name!r}")
    return 0


def _current_context(args: argparse.Namespace) -> int:
    _, config = _load()
    if not config.current:
        print("graylane: no current context", file=sys.stderr)
        return 1
    print(config.current)
    return 0


def _set_context(args: argparse.Namespace) -> int:
    path, config = _load()
    try:
        old = config.get(args.name)
    except ConfigError:
        old = Context(name=args.name)
    context = Context(
        name=args.name,
        address=args.addr or old.address,
        token_file=args.token_file.expanduser().resolve() if args.token_file else old.token_file,
        ca=args.ca.expanduser().resolve() if args.ca else old.ca,
    )
    config = config.with_context(context)
    if args.use or not config.current:
        config = config.use(args.name)
    config.save(path)
    print(f"context {args.name!r} written to {path}")
    return 0
