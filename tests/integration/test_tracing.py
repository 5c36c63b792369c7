"""One request from a confluent-kafka producer (what a Java or Go service would be)
carrying a W3C ``traceparent``, through the real ``graylane serve router`` and
``graylane serve worker`` processes on the real broker, yields one trace whose spans
come from three processes: the producer's, the router's and the worker's, each a
child of the hop before it, collected by an OTLP/HTTP receiver the test runs. A
streamed generation (the worker's continuous decode batch) is traced the same way."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from graylane import serde
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.v1 import inference_pb2
from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.stack import read_topic
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MODEL, VERSION = "traced", "v1"


@contextlib.contextmanager
def serving(
    name: str, argv: list[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "graylane.app.cli.main", "serve", name, *argv],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        proc.terminate()  # a clean stop flushes the spans still batched
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.span.name == name]


async def test_a_traceparent_from_a_confluent_producer_becomes_one_trace_over_three_processes(
    factory: KafkaFactory, tmp_path: Path
) -> None:
    settings = factory.settings
    kv_model = write_demo_gpt(tmp_path / "kv.onnx", "tiny", seed=1, kv_cache=True)
    with otlp_receiver() as receiver:
        env = {
            **os.environ,
            "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
            "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "GRAYLANE_PARTITIONS": str(settings.partitions),
            "PYTHONUNBUFFERED": "1",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        env.pop("OTEL_SDK_DISABLED", None)
        common = ["--metrics-port", "-1", "--log-format", "text"]
        router_log, worker_log = tmp_path / "router.log", tmp_path / "worker.log"
        with (
            serving("router", ["--model", f"{MODEL}={VERSION}", *common], env, router_log),
            serving(
                "worker",
                [
                    "--model",
                    MODEL,
                    "--version",
                    VERSION,
                    "--variant",
                    f"fp32={kv_model}",
                    *common,
                ],
                env,
                worker_log,
            ),
        ):
            await wait_until(
                lambda: (
                    "router serving" in router_log.read_text(errors="replace")
                    and f"serving {MODEL}/{VERSION}" in worker_log.read_text(errors="replace")
                ),
                timeout=120,
                what="router and worker serving",
            )
            forward = inference_pb2.InferenceRequest(
                request_id="traced-1", model=MODEL, routing_key="u1", token_ids=[5, 6, 7]
            )
            caller = await asyncio.to_thread(
                produce_traced, settings.bootstrap_servers, factory, receiver, forward
            )
            values = await read_topic(
                factory, factory.layout.results(MODEL), expect=1, timeout_s=60
            )
            [result] = [serde.decode(inference_pb2.InferenceResult, v) for v in values]
            assert result.request_id == "traced-1" and result.version == VERSION
            assert result.error_code == inference_pb2.ERROR_CODE_UNSPECIFIED, result.error_message
            generate = inference_pb2.InferenceRequest(
                request_id="traced-gen",
                model=MODEL,
                routing_key="u2",
                token_ids=[5, 6, 7],
                task=inference_pb2.GENERATE,
                generation=inference_pb2.GenerationParams(
                    max_new_tokens=6, stream=True, stream_every_tokens=2
                ),
            )
            streamer = await asyncio.to_thread(
                produce_traced, settings.bootstrap_servers, factory, receiver, generate
            )

            def whole_trace(trace_id: str, root: str) -> bool:
                spans = [s for s in receiver.received() if s.trace_id == trace_id]
                return bool(by_name(spans, "deliver")) and bool(by_name(spans, root))

            await wait_until(
                lambda: whole_trace(caller.trace_id, "graylane.worker request"),
                timeout=30,
                what="the worker's spans exported",
            )
            await wait_until(
                lambda: whole_trace(streamer.trace_id, "graylane.worker generation"),
                timeout=30,
                what="the generation's spans exported",
            )
            forwarded = await read_to_end(
                factory, factory.layout.version_requests(MODEL, VERSION), client_suffix="t"
            )

    spans = [s for s in receiver.received() if s.trace_id == caller.trace_id]
    pids = {s.resource.get("process.pid") for s in spans}
    assert len(pids) == 3, [(s.span.name, s.resource.get("service.name")) for s in spans]
    services = {s.resource.get("service.name") for s in spans}
    assert services == {"ci-producer", "graylane-router", "graylane-worker"}
    [produce] = by_name(spans, "ci produce")
    [routed] = by_name(spans, "graylane.router route")
    [served] = by_name(spans, "graylane.worker request")
    assert routed.parent_id == produce.span_id  # the producer's traceparent, continued
    [record] = [
        r
        for r in forwarded
        if serde.decode(inference_pb2.InferenceRequest, r.value).request_id == "traced-1"
    ]
    headers = dict(record.headers)
    assert headers["x-app"] == b"billing"  # the producer's own header travels on
    assert headers["traceparent"].decode().split("-")[1:3] == [caller.trace_id, routed.span_id]
    assert served.parent_id == routed.span_id  # the router forwarded its own context
    assert routed.attributes["graylane.version"] == VERSION
    assert routed.span.kind == SpanKind.CONSUMER.value + 1  # OTLP numbers kinds from 1
    assert served.attributes["graylane.model"] == MODEL
    assert served.attributes["graylane.version"] == VERSION
    assert served.attributes["graylane.variant"] == "fp32"
    assert served.attributes["graylane.batch_size"] == 1
    stages = {s.span.name: s for s in spans if s.parent_id == served.span_id}
    assert set(stages) == {"queue", "batch", "engine", "deliver"}
    assert stages["queue"].span.start_time_unix_nano >= served.span.start_time_unix_nano
    for earlier, later in (("queue", "batch"), ("batch", "engine"), ("engine", "deliver")):
        assert stages[earlier].span.end_time_unix_nano <= stages[later].span.start_time_unix_nano
    assert stages["deliver"].span.end_time_unix_nano <= served.span.end_time_unix_nano
    assert stages["engine"].span.end_time_unix_nano > stages["engine"].span.start_time_unix_nano

    # The streamed generation: one span of the decode batch, continuing its routed trace.
    spans = [s for s in receiver.received() if s.trace_id == streamer.trace_id]
    [routed] = by_name(spans, "graylane.router route")
    [generated] = by_name(spans, "graylane.worker generation")
    assert generated.parent_id == routed.span_id
    assert generated.resource.get("service.name") == "graylane-worker"
    for key, value in (
        ("graylane.model", MODEL),
        ("graylane.version", VERSION),
        ("graylane.variant", "fp32"),
        ("graylane.prompt_tokens", 3),
        ("graylane.generated_tokens", 6),
        ("graylane.finish_reason", "LENGTH"),
    ):
        assert generated.attributes[key] == value, key
    assert generated.attributes["graylane.ttft_ms"] > 0
    assert generated.attributes["graylane.stream_chunks"] >= 1
    stages = {s.span.name: s for s in spans if s.parent_id == generated.span_id}
    assert set(stages) == {"queue", "prefill", "decode", "deliver"}
    for earlier, later in (("queue", "prefill"), ("prefill", "decode"), ("decode", "deliver")):
        assert stages[earlier].span.end_time_unix_nano <= stages[later].span.start_time_unix_nano
    assert stages["deliver"].span.end_time_unix_nano <= generated.span.end_time_unix_nano


class Caller:
    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id


def produce_traced(
    bootstrap: str,
    factory: KafkaFactory,
    receiver: OtlpReceiver,
    request: inference_pb2.InferenceRequest,
) -> Caller:
    """What a JVM or Go service does: its own span, its traceparent on the record."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": "ci-producer", "process.pid": os.getpid()})
    )
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.endpoint)))
    tracer = provider.get_tracer("ci")
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    with tracer.start_as_current_span("ci produce", kind=SpanKind.PRODUCER) as span:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        producer.produce(
            factory.layout.ingress(MODEL),
            value=serde.encode(request),
            key=request.routing_key.encode(),
            headers=[(k, v.encode()) for k, v in carrier.items()] + [("x-app", b"billing")],
        )
        assert producer.flush(30) == 0
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    return Caller(trace_id)
