"""gRPC plumbing of the operator commands: channel, token metadata, one call."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["call", "stubs"]


def stubs(args: argparse.Namespace) -> tuple[Any, Any]:
    import grpc

    from graylane.v1 import controlplane_pb2_grpc as rpc

    if args.ca is not None:
        channel = grpc.secure_channel(
            args.addr, grpc.ssl_channel_credentials(root_certificates=args.ca.read_bytes())
        )
    else:
        channel = grpc.insecure_channel(args.addr)
    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
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
