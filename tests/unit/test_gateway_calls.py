"""The demo's and the bench's gateway calls: keep-alive HTTP/1.1 on raw sockets, and
answers counted as SDK results."""

from __future__ import annotations

import asyncio
import json

from graylane.app.demo.gateway_calls import GatewayAnswer, GatewayPool, completion_result


async def test_a_pool_reuses_connections_and_reopens_one_the_server_closed() -> None:
    connections = 0
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(
                v
                for k, _, v in (line.partition(b": ") for line in head.split(b"\r\n"))
                if k.lower() == b"content-length"
            )
        )
        requests.append(head.split(b"\r\n")[0] + b" " + await reader.readexactly(length))
        body = b'{"ok":true}'
        writer.write(
            b"HTTP/1.1 200 OK\r\nx-graylane-version: v2\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        await writer.drain()
        writer.close()  # the server hangs up after each answer

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = GatewayPool(port, key="k")
    first = await pool.request("POST", "/v1/completions", b"{}")
    second = await pool.request("POST", "/v1/completions", b'{"a":1}')
    pool.close()
    server.close()
    await server.wait_closed()
    assert first.status == second.status == 200 and second.body == b'{"ok":true}'
    assert first.headers["x-graylane-version"] == "v2"
    assert connections == 2  # the idle one was closed by the server: reopened once
    assert requests == [
        b"POST /v1/completions HTTP/1.1 {}",
        b'POST /v1/completions HTTP/1.1 {"a":1}',
    ]


def test_answers_become_results_with_the_served_version_and_errors() -> None:
    served = completion_result(
        GatewayAnswer(200, {"x-graylane-version": "1.1.0", "x-graylane-variant": "int8"}),
        request_id="r",
        model="m",
        latency_ms=12.5,
    )
    assert served.ok and (served.version, served.variant) == ("1.1.0", "int8")
    assert served.client_latency_ms == 12.5
    shed = completion_result(
        GatewayAnswer(503, {}, json.dumps({"error": {"code": "shed", "message": "late"}}).encode()),
        request_id="r",
        model="m",
        latency_ms=1.0,
    )
    assert not shed.ok and shed.error_code == "SHED" and shed.error_message == "late"
    lost = completion_result(GatewayAnswer(0), request_id="r", model="m", latency_ms=1.0)
    assert not lost.ok and lost.error_code == "UNKNOWN"
