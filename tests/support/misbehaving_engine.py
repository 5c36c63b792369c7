"""An HTTP server on loopback that misbehaves like a broken engine server would.

For fault tests of the engine-server backend: each call's ``model`` names what the
server does (answer an OpenAI stream, send garbage, cut the stream, answer 4xx/5xx,
hold the stream open until the caller hangs up). It generates nothing: tests of what
an engine answers use the real llama.cpp server (:mod:`tests.support.llamacpp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = ["MisbehavingEngine", "misbehaving_engine"]

PIECES = ("The", " capital", " is", " Paris", ".")


def _event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(text: str, finish: str | None = None) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


@dataclass
class MisbehavingEngine:
    port: int = 0
    calls: list[dict[str, object]] = field(default_factory=list)
    """The bodies of the calls it got."""
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a caller closed a held stream."""
    held: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a stream is being held open."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if not await self._answer(method, path, body, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(
        self,
        method: str,
        path: str,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; False when the connection is to close."""
        if method == "GET":
            payload = b"{}" if path == "/health" else b'{"data": [{"id": "ok"}]}'
            writer.write(self._head(200, "application/json", len(payload)) + payload)
            await writer.drain()
            return True
        call = json.loads(body)
        self.calls.append(call)
        kind = str(call.get("model"))
        if kind in ("400", "500", "503", "429", "context"):
            status = 400 if kind == "context" else int(kind)
            error = {"code": status, "message": f"engine says {kind}", "type": "server_error"}
            if kind == "context":
                error = {
                    "code": 400,
                    "message": "the request exceeds the available context size",
                    "type": "exceed_context_size_error",
                }
            payload = json.dumps({"error": error}).encode()
            writer.write(self._head(status, "application/json", len(payload)) + payload)
            await writer.drain()
            return True
        writer.write(self._head(200, "text/event-stream", None))
        writer.write(_event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        if kind == "garbage":
            writer.write(b"data: {this is not json\n\n")
        elif kind == "error-event":
            writer.write(_event(_chunk(PIECES[0])))
            writer.write(_event({"error": {"code": 500, "message": "the engine broke"}}))
        elif kind == "cut":
            for piece in PIECES[:2]:
                writer.write(_event(_chunk(piece)))
            await writer.drain()
            return False  # closed without the end of the stream
        elif kind == "hold":
            writer.write(_event(_chunk(PIECES[0])))
            await writer.drain()
            self.held.set()
            with contextlib.suppress(ConnectionError):
                await reader.read()  # until the caller closes
            self.hung_up.set()
            return False
        else:
            for piece in PIECES:
                writer.write(_event(_chunk(piece)))
                await writer.drain()
                await asyncio.sleep(0.002)
            writer.write(_event(_chunk("", "stop")))
            writer.write(
                _event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}})
            )
            writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        return False

    @staticmethod
    def _head(status: int, media: str, length: int | None) -> bytes:
        reason = {200: "OK", 400: "Bad Request", 429: "Too Many Requests"}.get(status, "Error")
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {media}"]
        lines.append(f"Content-Length: {length}" if length is not None else "Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


@contextlib.asynccontextmanager
async def misbehaving_engine() -> AsyncIterator[MisbehavingEngine]:
    engine = MisbehavingEngine()
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    try:
        yield engine
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)
