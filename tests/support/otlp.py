"""A tiny OTLP/HTTP trace receiver for tests: what every process exported, by resource."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass(frozen=True)
class ReceivedSpan:
    span: trace_pb2.Span
    resource: dict[str, Any]

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def attributes(self) -> dict[str, Any]:
        return {a.key: _value(a.value) for a in self.span.attributes}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class OtlpReceiver:
    endpoint: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP (protobuf) endpoint on a free loopback port: ``/v1/traces``."""
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            with receiver.lock:
                for resource_spans in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                    for scope in resource_spans.scope_spans:
                        receiver.spans += [ReceivedSpan(s, resource) for s in scope.spans]
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
