"""Calling the control plane over gRPC: the connection flags, the channel, one call.

Every operator command but the servers and the Kafka readers (``audit replay|verify``,
``traffic replay``) connects wherever the flags, the environment or the config file's
context say (:mod:`graylane.app.cli.contexts`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TypeAlias

from graylane.app.cli.contexts import (
    ConfigError,
    Connection,
    ConnectionFlags,
    ContextFile,
    config_path,
    environment,
    resolve,
)

__all__ = ["Sub", "call", "client_args", "connection", "stubs"]

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The sub-command parsers a module's ``register`` adds to."""


class _DeprecatedToken(argparse.Action):
    """``--token``: still read for one release, with a note (it lands in shell history)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            "graylane: --token is deprecated (it ends up in the shell's history); use "
            "--token-file, GRAYLANE_TOKEN or a context's token-file",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def client_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(
        "connection", "default: the config file's current context (graylane config --help)"
    )
    group.add_argument(
        "--context", default="", help="a context of the config file (GRAYLANE_CONTEXT)"
    )
    group.add_argument(
        "--addr", default="", help="control plane host:port (GRAYLANE_CP_ADDR; 127.0.0.1:50051)"
    )
    group.add_argument(
        "--token-file",
        type=Path,
        help="file holding the bearer token (GRAYLANE_TOKEN_FILE, or the token in GRAYLANE_TOKEN)",
    )
    group.add_argument(
        "--token", default="", action=_DeprecatedToken, help="deprecated: use --token-file"
    )
    group.add_argument("--ca", type=Path, help="CA certificate (PEM): connect with TLS")
    return parser


def connection(args: argparse.Namespace) -> Connection:
    """Where this command connects: flags, environment, config file context, defaults."""
    env = environment()
    flags = ConnectionFlags(
        address=getattr(args, "addr", "") or "",
        token_file=getattr(args, "token_file", None),
        token=getattr(args, "token", "") or "",
        ca=getattr(args, "ca", None),
        context=getattr(args, "context", "") or "",
    )
    try:
        return resolve(flags, env, ContextFile.load(config_path(env)))
    except ConfigError as exc:
        raise SystemExit(f"graylane: {exc}") from None


def stubs(args: argparse.Namespace) -> tuple[Any, Any]:
    import grpc

    from graylane.v1 import controlplane_pb2_grpc as rpc

    conn = connection(args)
    if conn.ca is not None:
        channel = grpc.secure_channel(
            conn.address, grpc.ssl_channel_credentials(root_certificates=conn.ca.read_bytes())
        )
    else:
        channel = grpc.insecure_channel(conn.address)
    metadata = (("authorization", f"Bearer {conn.token}"),) if conn.token else ()
    return rpc, (channel, metadata)


def call(
    args: argparse.Namespace,
    stub_name: str,
    method: str,
    request: Any,
    *,
    tolerate: tuple[str, ...] = (),
) -> Any:
    """One call; a status code named in ``tolerate`` (e.g. ``ALREADY_EXISTS``) returns None."""
    import grpc

    rpc, (channel, metadata) = stubs(args)
    stub = getattr(rpc, f"{stub_name}Stub")(channel)
    try:
        return getattr(stub, method)(request, metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        if exc.code().name in tolerate:
            return None
        raise SystemExit(f"{method}: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()
