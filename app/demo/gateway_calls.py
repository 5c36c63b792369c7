"""Calls to the API gateway from the demo and the benchmarks: OpenAI completions over
keep-alive HTTP/1.1 on raw sockets (no HTTP library: the figures stay the gateway's).

:class:`GatewayPool` keeps idle connections and opens one when none is free; a
connection the gateway closed while idle is reopened once. :func:`completion_result`
turns an answer into the SDK's :class:`~graylane.client.Result`, so a monitor counts
gateway traffic like the SDK's (the served version and variant come from the
``x-graylane-version`` / ``x-graylane-variant`` headers).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from graylane.client import Result

__all__ = ["GatewayAnswer", "GatewayConnection", "GatewayPool", "completion_result"]


@dataclass(frozen=True)
class GatewayAnswer:
    status: int
    """0 when the connection failed."""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class GatewayConnection:
    """One keep-alive HTTP/1.1 connection; answers with a Content-Length."""

    def __init__(self, port: int, *, key: str = "", host: str = "127.0.0.1") -> None:
        self.host, self.port = host, port
        self._auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> GatewayAnswer:
        if self._writer is None or self._reader is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        self._writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n".encode()
            + self._auth
            + extra
            + b"\r\n"
            + body
        )
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        found: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                found[name.strip().lower()] = value.strip()
        data = await self._reader.readexactly(int(found.get("content-length", "0")))
        return GatewayAnswer(status, found, data)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._reader = None


class GatewayPool:
    """Idle connections to one gateway, reused by concurrent callers."""

    def __init__(self, port: int, *, key: str = "", host: str = "127.0.0.1") -> None:
        self.host, self.port, self.key = host, port, key
        self._idle: list[GatewayConnection] = []

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> GatewayAnswer:
        reused = bool(self._idle)
        conn = self._idle.pop() if reused else GatewayConnection(self.port, key=self.key)
        try:
            answer = await conn.request(method, path, body, headers)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            conn.close()
            if reused:  # the gateway closed an idle connection: once more on a new one
                return await self.request(method, path, body, headers)
            return GatewayAnswer(0)
        self._idle.append(conn)
        return answer

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def completion_result(
    answer: GatewayAnswer, *, request_id: str, model: str, latency_ms: float
) -> Result:
    """A ``/v1/completions`` answer as a :class:`~graylane.client.Result`."""
    ok = answer.status == 200
    code, message = "", ""
    if not ok:
        try:
            error = json.loads(answer.body)["error"]
            code, message = str(error.get("code") or "").upper(), str(error.get("message"))
        except (ValueError, KeyError, TypeError, AttributeError):
            code, message = "UNKNOWN", f"HTTP {answer.status}"
    return Result(
        request_id=request_id,
        model=model,
        version=answer.headers.get("x-graylane-version", ""),
        variant=answer.headers.get("x-graylane-variant", ""),
        ok=ok,
        error_code=code or ("" if ok else "UNKNOWN"),
        error_message=message,
        client_latency_ms=latency_ms,
    )
