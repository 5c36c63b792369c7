"""Trace context across hops without a broker: header caps, W3C round trips, the
worker's spans (shadow copies linked, not children), export off by default, and log
lines with trace ids and milliseconds."""

from __future__ import annotations

import io
import json
import logging
import re

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from graylane import serde, tracing
from graylane.logs import LogFormat, configure_logging
from graylane.tracing import (
    GenerationHop,
    HeaderCaps,
    TracedRequest,
    WorkerHop,
    forward_headers,
    record_generation,
    record_worker_hop,
)
from graylane.v1 import inference_pb2

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def memory_tracer() -> tuple[InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def test_client_headers_travel_on_capped_in_count_and_bytes() -> None:
    many = [(f"h{i}", b"v" * 10) for i in range(40)]
    kept = forward_headers(many, HeaderCaps(count=16, total_bytes=4096), replace_trace=False)
    assert kept == many[:16]
    big = [("a", b"x" * 3000), ("b", b"y" * 3000), ("c", b"z")]
    assert [k for k, _ in forward_headers(big, replace_trace=False)] == ["a", "c"]
    assert forward_headers(None, replace_trace=False) == []
    assert forward_headers([("traceparent", PARENT.encode())], replace_trace=False) == [
        ("traceparent", PARENT.encode())
    ]  # not tracing here: the caller's context passes through untouched


def test_a_tracing_hop_replaces_the_callers_trace_headers_with_its_own() -> None:
    exporter, provider = memory_tracer()
    tracer = provider.get_tracer("t")
    parent = tracing.extract([("traceparent", PARENT.encode())])
    with tracer.start_as_current_span("hop", context=parent) as hop:
        out = forward_headers(
            [("TraceParent", b"00-junk"), ("x-app", b"billing")], replace_trace=True
        )
    names = [k for k, _ in out]
    assert names.count("traceparent") == 1 and "TraceParent" not in names and "x-app" in names
    sent = dict(out)["traceparent"].decode()
    assert sent.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert sent.split("-")[2] == format(hop.get_span_context().span_id, "016x")
    [finished] = exporter.get_finished_spans()
    assert finished.parent is not None and format(finished.parent.span_id, "016x") == (
        "b7ad6b7169203331"
    )


def test_broken_trace_headers_start_no_trace_and_never_raise() -> None:
    from opentelemetry import trace

    for headers in ([("traceparent", b"\xff\xfe")], [("traceparent", b"nonsense")], [], None):
        ctx = tracing.extract(headers)
        assert not trace.get_current_span(ctx).get_span_context().is_valid


def hop(batch_size: int) -> WorkerHop:
    base = 1_700_000_000_000_000_000
    return WorkerHop(
        dequeued_ns=base + 5_000_000,
        started_ns=base + 6_000_000,
        ran_ns=base + 9_000_000,
        sent_ns=base + 9_500_000,
        model="gpt",
        version="v2",
        variant="int8",
        batch_size=batch_size,
    )


def test_worker_spans_cover_queue_batch_engine_and_delivery() -> None:
    exporter, provider = memory_tracer()
    headers = [("traceparent", PARENT.encode())]
    opened = record_worker_hop(
        [
            TracedRequest(
                headers=headers, timestamp_ms=1_700_000_000_000, shadow=False, request_id="r1"
            ),
            TracedRequest(
                headers=headers, timestamp_ms=1_700_000_000_002, shadow=True, request_id="r2"
            ),
        ],
        hop(2),
        provider.get_tracer("w"),
    )
    assert len(opened) == 4  # deliver + request, per request: still open until the ack
    for s in opened:
        s.end()
    spans = exporter.get_finished_spans()
    requests = {s.attributes["graylane.request_id"]: s for s in spans if s.name.endswith("request")}
    primary, shadow = requests["r1"], requests["r2"]
    assert primary.kind is SpanKind.CONSUMER
    assert format(primary.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert primary.parent is not None and primary.links == ()
    for key, value in (
        ("graylane.model", "gpt"),
        ("graylane.version", "v2"),
        ("graylane.variant", "int8"),
    ):
        assert primary.attributes[key] == value
    assert primary.attributes["graylane.batch_size"] == 2
    assert primary.attributes["graylane.queue_wait_ms"] == 5.0
    # The shadow copy: a trace of its own, linked to the router's span.
    assert shadow.parent is None
    assert format(shadow.context.trace_id, "032x") != "0af7651916cd43dd8448eb211c80319c"
    [link] = shadow.links
    assert format(link.context.span_id, "016x") == "b7ad6b7169203331"
    children = [s for s in spans if s.parent and s.parent.span_id == primary.context.span_id]
    assert [s.name for s in sorted(children, key=lambda s: s.start_time or 0)] == [
        "queue",
        "batch",
        "engine",
        "deliver",
    ]


def test_export_is_off_without_otel_variables() -> None:
    assert tracing.configure_tracing("router", {}) is False
    assert tracing.configure_tracing("router", {"OTEL_TRACES_EXPORTER": "none"}) is False
    assert (
        tracing.configure_tracing(
            "router", {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}
        )
        is False
    )
    assert tracing.enabled() is False
    quiet = TracedRequest(headers=None, timestamp_ms=0, shadow=False, request_id="r")
    assert record_worker_hop([quiet], hop(1)) == []


def test_log_lines_carry_milliseconds_and_the_trace_id() -> None:
    _, provider = memory_tracer()
    stream = io.StringIO()
    handlers = [configure_logging("router", LogFormat.JSON, stream=stream)]
    text_stream = io.StringIO()
    try:
        with provider.get_tracer("t").start_as_current_span("s") as span:
            logging.getLogger("graylane.x").warning("inside")
        logging.getLogger("graylane.x").warning("outside")
        handlers.append(configure_logging("router", LogFormat.TEXT, stream=text_stream))
        with provider.get_tracer("t").start_as_current_span("s2") as span2:
            logging.getLogger("graylane.x").warning("inside text")
    finally:
        for handler in handlers:
            logging.getLogger().removeHandler(handler)
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", inside["time"])
    assert inside["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert inside["span_id"] == format(span.get_span_context().span_id, "016x")
    assert "trace_id" not in outside and "trace" not in outside
    line = text_stream.getvalue()
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00 WARNING router ", line)
    assert f"trace={format(span2.get_span_context().trace_id, '032x')} inside text" in line


async def test_the_sdk_carries_the_callers_trace_on_the_record() -> None:
    """No tracer set up in this process: the caller's own context (a service that
    extracted a traceparent) is what the record's header carries."""
    from opentelemetry import context as otel_context

    from graylane.client import GraylaneClient
    from graylane.settings import Settings
    from tests.support.memory_kafka import MemoryBroker, MemoryFactory

    factory = MemoryFactory(MemoryBroker(), Settings(topic_prefix="t", partitions=2))
    for spec in factory.layout.model_specs("gpt", ["v1"]):
        factory.broker.create_topic(spec.name, spec.partitions)
    async with GraylaneClient(factory) as client:
        token = otel_context.attach(tracing.extract([("traceparent", PARENT.encode())]))
        try:
            traced = await client.send(client.build_request("gpt", prompt="x"))
        finally:
            otel_context.detach(token)
        untraced = await client.send(client.build_request("gpt", prompt="y"))  # no trace
    records = {  # by request id: the two may land on either partition
        serde.decode(inference_pb2.InferenceRequest, r.value).request_id: r
        for r in factory.broker.records(factory.layout.ingress("gpt"))
    }
    assert dict(records[traced].headers)["traceparent"] == PARENT.encode()
    assert "traceparent" not in dict(records[untraced].headers or ())


async def test_the_gateway_continues_the_http_traceparent() -> None:
    import httpx

    from graylane.client import Result
    from graylane.services.gateway.catalog import ModelDirectory
    from graylane.services.gateway.logic.admission import KeyRing, parse_api_keys
    from graylane.services.gateway.service import Gateway, GatewayConfig
    from graylane.settings import Settings
    from tests.support.memory_kafka import MemoryBroker, MemoryFactory

    factory = MemoryFactory(MemoryBroker(), Settings(topic_prefix="t", partitions=2))
    key = "edge-key-0123456789abcdef"
    gateway = Gateway(
        factory, GatewayConfig(metrics_port=-1), KeyRing(parse_api_keys(f"{key}:infer:t"))
    )

    async def topics() -> set[str]:
        return {factory.layout.ingress("gpt")}

    gateway.directory = ModelDirectory(factory.layout, topics)
    carried: list[list[tuple[str, bytes]]] = []

    async def infer(model: str, **kwargs: object) -> Result:
        carried.append(tracing.inject())  # what the SDK's send would put on the record
        return Result(
            request_id=str(kwargs["request_id"]), model=model, version="v1", variant="fp32",
            ok=True, error_code="", error_message="", text="hi", finish_reason="EOS",
        )  # fmt: skip

    gateway.client.infer = infer  # type: ignore[method-assign]
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        answer = await http.post(
            "/v1/completions",
            json={"model": "gpt", "prompt": "x", "max_tokens": 1},
            headers={"Authorization": f"Bearer {key}", "traceparent": PARENT},
        )
    assert answer.status_code == 200, answer.text
    [headers] = carried
    assert dict(headers)["traceparent"].decode().split("-")[1] == PARENT.split("-")[1]


def generation_hop(**changes: object) -> GenerationHop:
    base = 1_700_000_000_000 * 1_000_000
    fields: dict[str, object] = {
        "dequeued_ns": base + 5_000_000,
        "first_token_ns": base + 9_000_000,
        "finished_ns": base + 30_000_000,
        "model": "gpt",
        "version": "v2",
        "variant": "fp32",
        "prompt_tokens": 7,
        "generated_tokens": 12,
        "ttft_ms": 9.0,
        "finish_reason": "LENGTH",
        "stream_chunks": 3,
    }
    fields.update(changes)
    return GenerationHop(**fields)  # type: ignore[arg-type]


def test_a_generation_span_continues_the_request_and_times_its_stages() -> None:
    exporter, provider = memory_tracer()
    request = TracedRequest(
        headers=[("traceparent", PARENT.encode())],
        timestamp_ms=1_700_000_000_000,
        shadow=False,
        request_id="g1",
    )
    opened = record_generation(request, generation_hop(), provider.get_tracer("w"))
    assert [s.name for s in opened] == ["deliver", "graylane.worker generation"]  # open
    for s in opened:
        s.end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["graylane.worker generation"]
    assert root.kind is SpanKind.CONSUMER
    assert format(root.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert root.parent is not None and format(root.parent.span_id, "016x") == "b7ad6b7169203331"
    assert dict(root.attributes or {}) == {
        "graylane.model": "gpt",
        "graylane.version": "v2",
        "graylane.variant": "fp32",
        "graylane.request_id": "g1",
        "graylane.shadow": False,
        "graylane.prompt_tokens": 7,
        "graylane.generated_tokens": 12,
        "graylane.ttft_ms": 9.0,
        "graylane.finish_reason": "LENGTH",
        "graylane.stream_chunks": 3,
        "graylane.queue_wait_ms": 5.0,
    }
    base = 1_700_000_000_000 * 1_000_000
    stages = {n: (spans[n].start_time - base, spans[n].end_time - base) for n in spans}
    assert stages["queue"] == (0, 5_000_000)
    assert stages["prefill"] == (5_000_000, 9_000_000)
    assert stages["decode"] == (9_000_000, 30_000_000)
    assert stages["deliver"][0] == 30_000_000
    for name in ("queue", "prefill", "decode", "deliver"):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == root.context.span_id


def test_a_failed_or_shadow_generation_says_so_in_its_span() -> None:
    exporter, provider = memory_tracer()
    shed = TracedRequest(
        headers=[("traceparent", PARENT.encode())], timestamp_ms=0, shadow=True, request_id="g2"
    )
    hop = generation_hop(dequeued_ns=0, first_token_ns=0, generated_tokens=0, error_code="SHED")
    for s in record_generation(shed, hop, provider.get_tracer("w")):
        s.end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["graylane.worker generation"]
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes is not None and root.attributes["graylane.error_code"] == "SHED"
    assert root.parent is None  # a shadow copy starts its own trace ...
    [link] = root.links  # ... linked to the router's span
    assert format(link.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert set(spans) == {"graylane.worker generation", "queue", "deliver"}  # no token: no stages
    assert record_generation(shed, hop) == []  # tracing off: nothing
