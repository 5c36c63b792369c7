"""Start-up safety and request limits of the control plane (pure, no gRPC).

The control plane steers production traffic, so it refuses to start with a
placeholder or short token, or listening beyond loopback in plaintext unless
``--insecure`` says so on purpose; and it caps what one call can ask for.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from graylane.errors import GraylaneError
from graylane.services.controlplane.auth import TokenTable
from graylane.services.controlplane.logic.rules import InvalidArgument

__all__ = [
    "ApiLimits",
    "UnsafeConfig",
    "WatchSlots",
    "check_limit",
    "check_startup",
    "is_loopback",
]


class UnsafeConfig(GraylaneError, ValueError):
    """The control plane refuses to start with this configuration."""


@dataclass(frozen=True, kw_only=True)
class ApiLimits:
    """Caps on list/log sizes and on concurrent Watch streams."""

    max_list_limit: int = 1000
    max_audit_limit: int = 10_000
    max_watch_streams: int = 64

    def __post_init__(self) -> None:
        if min(self.max_list_limit, self.max_audit_limit, self.max_watch_streams) < 1:
            raise ValueError("control-plane limits must be >= 1")


def check_limit(requested: int, *, default: int, maximum: int, what: str) -> int:
    """The row count to use: ``default`` for 0; a negative or too large value is refused."""
    if requested < 0:
        raise InvalidArgument(f"limit must be >= 0 (0 = default {default}), got {requested}")
    if requested > maximum:
        raise InvalidArgument(
            f"limit {requested} is above the maximum of {maximum} {what} per call; "
            "page by time range or ask for fewer"
        )
    return min(requested or default, maximum)


class WatchSlots:
    """Counts open Watch streams against a cap (single event loop: no lock)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.open = 0

    def acquire(self) -> bool:
        if self.open >= self.capacity:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open = max(0, self.open - 1)


def is_loopback(host: str) -> bool:
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: may resolve to anything


def check_startup(
    *,
    tokens: TokenTable,
    host: str,
    tls_cert: Path | None,
    tls_key: Path | None,
    insecure: bool,
) -> None:
    """Raise :class:`UnsafeConfig` for weak tokens or a plaintext non-loopback bind."""
    weak = tokens.weak_tokens()
    if weak:
        raise UnsafeConfig(
            "refusing to start with weak control-plane tokens ("
            + "; ".join(weak)
            + "): use random tokens of 16+ characters, e.g. `openssl rand -hex 16`"
        )
    if (tls_cert is None) != (tls_key is None):
        raise UnsafeConfig("TLS needs both a certificate and a key file (or neither)")
    if tls_cert is None and not is_loopback(host) and not insecure:
        raise UnsafeConfig(
            f"refusing to listen on {host!r} without TLS: tokens would cross the network in "
            "clear; give --tls-cert/--tls-key, bind 127.0.0.1, or pass --insecure on purpose"
        )
