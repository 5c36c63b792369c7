"""Bearer-token authentication and role checks for the control plane's gRPC API.

Clients send ``authorization: Bearer <token>`` in the call metadata. Tokens map to
a role: ``read_only`` may call the methods in :data:`READ_ONLY_METHODS`,
``operator`` may call everything. A missing or unknown token is
UNAUTHENTICATED; a read-only token on a mutating method is PERMISSION_DENIED.
Methods not listed as read-only need an operator (deny by default).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from graylane.errors import ErrorCode, GraylaneError
from graylane.services.controlplane.wire import grpc_status

__all__ = [
    "MIN_TOKEN_LENGTH",
    "PLACEHOLDER_TOKENS",
    "READ_ONLY_METHODS",
    "ApiRole",
    "AuthError",
    "AuthInterceptor",
    "Principal",
    "TokenTable",
    "parse_tokens",
]

_SERVICE = "/graylane.v1."
READ_ONLY_METHODS: frozenset[str] = frozenset(
    _SERVICE + m
    for m in (
        "ModelRegistry/ListModels",
        "ModelRegistry/ListVersions",
        "Rollouts/Get",
        "Rollouts/List",
        "Rollouts/Watch",
        "Rollouts/Diff",
        "Rollouts/History",
        "Qos/GetPolicy",
        "Routing/GetConfig",
        "Audit/Query",
    )
)


MIN_TOKEN_LENGTH = 16
# Example values from docs and compose files that must never guard a real server.
PLACEHOLDER_TOKENS: frozenset[str] = frozenset({"change-me", "changeme"})


class AuthError(GraylaneError, ValueError):
    """The token configuration cannot be read."""


class ApiRole(Enum):
    """What a bearer token may do on the control-plane API."""

    READ_ONLY = "read_only"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the name recorded as ``created_by`` / ``issued_by``."""

    name: str
    role: ApiRole

    def may_call(self, method: str) -> bool:
        return self.role is ApiRole.OPERATOR or method in READ_ONLY_METHODS


def parse_tokens(text: str) -> dict[str, Principal]:
    """``token:role[:name]`` entries separated by commas or new lines (``#`` comments).

    Without a name the principal is ``<role>-<first 8 hex of sha256(token)>``, so
    logs and records never hold a token.
    """
    table: dict[str, Principal] = {}
    for raw in text.replace(",", "\n").splitlines():
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise AuthError(f"token entry {entry[:6]}... must be TOKEN:ROLE or TOKEN:ROLE:NAME")
        token, role_text = parts[0], parts[1].strip().lower().replace("-", "_")
        try:
            role = ApiRole(role_text)
        except ValueError:
            raise AuthError(
                f"unknown role {parts[1]!r}; "
                f"use {ApiRole.OPERATOR.value} or {ApiRole.READ_ONLY.value}"
            ) from None
        digest = hashlib.sha256(token.encode()).hexdigest()[:8]
        name = (
            parts[2].strip() if len(parts) == 3 and parts[2].strip() else f"{role.value}-{digest}"
        )
        table[token] = Principal(name, role)
    return table


class TokenTable:
    """Configured tokens; lookups compare in constant time."""

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        if not tokens:
            raise AuthError(
                "no tokens configured; set GRAYLANE_CP_TOKENS (e.g. 'ops-token:operator,"
                "viewer-token:read_only') or pass --tokens-file"
            )
        self._tokens = dict(tokens)

    @classmethod
    def from_sources(cls, env_value: str | None, file: Path | None) -> TokenTable:
        text = env_value or ""
        if file is not None:
            try:
                text += "\n" + file.read_text()
            except OSError as exc:
                raise AuthError(f"cannot read tokens file {file}: {exc}") from None
        return cls(parse_tokens(text))

    def weak_tokens(self) -> list[str]:
        """Why each weak token is weak, naming its principal (never the token)."""
        weak = []
        for token, principal in self._tokens.items():
            if token.strip().lower() in PLACEHOLDER_TOKENS:
                weak.append(f"{principal.name}: the placeholder {token!r}")
            elif len(token) < MIN_TOKEN_LENGTH:
                weak.append(
                    f"{principal.name}: {len(token)} characters, fewer than {MIN_TOKEN_LENGTH}"
                )
        return weak

    def lookup(self, token: str) -> Principal | None:
        found: Principal | None = None
        for known, principal in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found

    def principal_of(self, metadata: Sequence[tuple[str, Any]] | None) -> Principal | None:
        for key, value in metadata or ():
            if key.lower() != "authorization":
                continue
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return self.lookup(token.strip())
        return None


def _deny(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that fails the call at once."""

    async def unary(_request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    async def streaming(_request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    deserializer = handler.request_deserializer
    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, deserializer, serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, deserializer, serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, deserializer, serializer)
    return grpc.unary_unary_rpc_method_handler(unary, deserializer, serializer)


OPEN_PREFIX = "/grpc.health.v1.Health/"
"""Methods anyone may call: the standard gRPC health service (it reveals nothing else)."""


class AuthInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Rejects calls without a valid token, and read-only tokens on mutating methods."""

    def __init__(self, tokens: TokenTable) -> None:
        self._tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if method.startswith(OPEN_PREFIX):
            return handler  # health probes (kubelet, load balancers) carry no token
        principal = self._tokens.principal_of(handler_call_details.invocation_metadata)
        if principal is None:
            return _deny(
                handler,
                grpc_status(ErrorCode.UNAUTHENTICATED),
                "missing or unknown bearer token; send 'authorization: Bearer <token>' "
                "(graylane --token or GRAYLANE_CP_TOKEN)",
            )
        if not principal.may_call(method):
            return _deny(
                handler,
                grpc_status(ErrorCode.PERMISSION_DENIED),
                f"{principal.name} is {principal.role.value}; {method} needs an operator token",
            )
        return handler
