"""Traces across every hop: W3C ``traceparent`` in, spans out, OpenTelemetry underneath.

=========  ==============================================================================
hop        span
=========  ==============================================================================
SDK        ``graylane.client send`` (PRODUCER): a child of the caller's current span, or
           a new trace; its context goes out in the record's ``traceparent`` header
gateway    ``graylane.gateway <endpoint>`` (SERVER): continues the HTTP ``traceparent``
router     ``graylane.router route`` (CONSUMER): continues the ingress record's header
           (any producer's: Java, Go, ...), forwards the record's headers (capped:
           :class:`HeaderCaps`) with its own ``traceparent`` to the version topic
worker     ``graylane.worker request`` per request, from the routed record's timestamp
           to the broker's ack of its answer, with children ``queue`` (in the version
           topic), ``batch`` (planned and admitted with the rest of its cycle),
           ``engine`` and ``deliver``; attributes ``graylane.model``, ``.version``,
           ``.variant``, ``.batch_size``. A shadow copy's span starts a trace of its
           own, *linked* to the router's span: it is never part of the caller's answer.
worker     ``graylane.worker generation`` per generation of the continuous decode batch
(decode)   (streamed or not), from the routed record's timestamp to the broker's ack of
           its final answer, with children ``queue`` (in the topic and waiting for a
           decode row), ``prefill`` (to the first token), ``decode`` (the other tokens)
           and ``deliver``; attributes ``graylane.model``, ``.version``, ``.variant``,
           ``.prompt_tokens``, ``.generated_tokens``, ``.ttft_ms``, ``.finish_reason``,
           ``.stream_chunks``; a generation answered with an error (shed, engine
           failure) has ``graylane.error_code`` and an error status. Shadow copies are
           linked, not continued, as above.
=========  ==============================================================================

Export is off by default. :func:`configure_tracing` (called by every ``graylane serve``
process) reads the standard OpenTelemetry variables: ``OTEL_TRACES_EXPORTER``
(``otlp``, ``console``, ``none``; ``otlp`` is implied by an
``OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT``), the OTLP/HTTP exporter's own
``OTEL_EXPORTER_OTLP_*``, ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*`` and ``OTEL_SDK_DISABLED``. With no exporter,
the API's no-op tracer is used and a hop costs one header copy.

Header values from clients are capped like every client-controlled input: at most
:attr:`HeaderCaps.count` headers and :attr:`HeaderCaps.total_bytes` bytes travel on
(the first ones that fit; the rest are dropped, never an error).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

__all__ = [
    "TRACE_HEADERS",
    "GenerationHop",
    "HeaderCaps",
    "TracedRequest",
    "WorkerHop",
    "annotate",
    "configure_tracing",
    "consumed",
    "current_trace_id",
    "enabled",
    "end_when_acknowledged",
    "extract",
    "forward_headers",
    "inject",
    "producing",
    "record_generation",
    "record_worker_hop",
    "serving",
    "span",
]

log = logging.getLogger(__name__)

TRACE_HEADERS = frozenset({"traceparent", "tracestate", "baggage"})
"""Headers the propagator writes: replaced, never forwarded from the caller, when tracing."""

_ENABLED = False


def enabled() -> bool:
    """Whether this process exports spans (:func:`configure_tracing` set one up)."""
    return _ENABLED


@dataclass(frozen=True, kw_only=True)
class HeaderCaps:
    """What a hop forwards of the headers a client set."""

    count: int = 16
    total_bytes: int = 4096
    """Keys and values together."""


def forward_headers(
    headers: Sequence[tuple[str, bytes | None]] | None,
    caps: HeaderCaps = HeaderCaps(),
    *,
    replace_trace: bool | None = None,
) -> list[tuple[str, bytes]]:
    """The headers to send on: the client's (capped), and this hop's trace context.

    ``replace_trace`` (default: :func:`enabled`): drop the client's trace headers and
    write the current span's instead; otherwise they travel on untouched.
    """
    replace = enabled() if replace_trace is None else replace_trace
    out: list[tuple[str, bytes]] = []
    if replace:
        out = inject()
    used = sum(len(k.encode()) + len(v) for k, v in out)
    for key, value in headers or ():
        if len(out) >= caps.count:
            break
        if not isinstance(key, str) or (replace and key.lower() in TRACE_HEADERS):
            continue
        data = value or b""
        size = len(key.encode("utf-8", "replace")) + len(data)
        if used + size > caps.total_bytes:
            continue
        out.append((key, bytes(data)))
        used += size
    return out


class _HeaderGetter(Getter[Sequence[tuple[str, bytes | None]]]):
    """Reads W3C headers from Kafka record headers (the first of a repeated key)."""

    def get(self, carrier: Sequence[tuple[str, bytes | None]], key: str) -> list[str] | None:
        for name, value in carrier:
            if isinstance(name, str) and name.lower() == key and value is not None:
                try:
                    return [value.decode("ascii")]
                except UnicodeDecodeError:
                    return None
        return None

    def keys(self, carrier: Sequence[tuple[str, bytes | None]]) -> list[str]:
        return [name for name, _ in carrier if isinstance(name, str)]


_GETTER = _HeaderGetter()


def extract(headers: Sequence[tuple[str, bytes | None]] | Mapping[str, str] | None) -> Context:
    """The trace context a record's headers (or an HTTP request's) carry; empty if none."""
    if not headers:
        return Context()
    if isinstance(headers, Mapping):
        return propagate.extract(headers, context=Context())
    return propagate.extract(headers, context=Context(), getter=_GETTER)


def inject(ctx: Context | None = None) -> list[tuple[str, bytes]]:
    """The current span's (or ``ctx``'s) trace headers, as Kafka record headers."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return [(k, v.encode("ascii")) for k, v in carrier.items()]


def current_trace_id() -> str:
    """The current span's trace id (32 hex digits), or ``""`` outside any span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


@contextmanager
def span(
    name: str,
    *,
    parent: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """A current span named ``name``: a child of ``parent`` (else of the current span)."""
    tracer = trace.get_tracer("graylane")
    with tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=dict(attributes or {})
    ) as current:
        yield current


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set attributes on the current span (nothing outside a span)."""
    trace.get_current_span().set_attributes(dict(attributes))


@contextmanager
def consumed(name: str, headers: Sequence[tuple[str, bytes | None]] | None) -> Iterator[None]:
    """A current CONSUMER span continuing the record's trace; nothing when tracing is off."""
    if not enabled():
        yield
        return
    with span(name, parent=extract(headers), kind=SpanKind.CONSUMER):
        yield


@contextmanager
def producing(name: str, attributes: Mapping[str, Any]) -> Iterator[list[tuple[str, bytes]]]:
    """A PRODUCER span under the caller's current one (or a new trace); yields the
    record headers that carry it. With no tracer set up, the caller's own context
    (if any) is what the headers carry."""
    with span(name, kind=SpanKind.PRODUCER, attributes=attributes):
        yield inject()


@contextmanager
def serving(name: str, headers: Mapping[str, str]) -> Iterator[None]:
    """A SERVER span continuing the HTTP caller's ``traceparent`` (or starting a trace)."""
    with span(name, parent=extract(headers), kind=SpanKind.SERVER):
        yield


@dataclass(frozen=True, kw_only=True)
class TracedRequest:
    """What the worker's span of one request needs from its record."""

    headers: Sequence[tuple[str, bytes | None]] | None
    timestamp_ms: int
    """The record's timestamp: when the router forwarded it (0: unknown)."""
    shadow: bool
    request_id: str


@dataclass(frozen=True, kw_only=True)
class WorkerHop:
    """When one batch passed each stage of a worker (``time.time_ns()`` values)."""

    dequeued_ns: int
    started_ns: int
    ran_ns: int
    sent_ns: int
    model: str
    version: str
    variant: str
    batch_size: int


def record_worker_hop(
    requests: Sequence[TracedRequest],
    hop: WorkerHop,
    tracer: trace.Tracer | None = None,
) -> list[Span]:
    """The worker's spans of one batch, already past ``sent``; the caller ends each
    (:meth:`Span.end`) when the broker acknowledged its answer.

    ``tracer``: the process's (default, when :func:`enabled`).
    """
    if tracer is None:
        if not enabled():
            return []
        tracer = trace.get_tracer("graylane.worker")
    spans: list[Span] = []
    attributes: dict[str, str | int | float | bool] = {
        "graylane.model": hop.model,
        "graylane.version": hop.version,
        "graylane.variant": hop.variant,
        "graylane.batch_size": hop.batch_size,
    }
    for request in requests:
        timestamp_ms, shadow = request.timestamp_ms, request.shadow
        routed = extract(request.headers)
        queued_ns = min(timestamp_ms * 1_000_000, hop.dequeued_ns) if timestamp_ms > 0 else 0
        queued_ns = queued_ns or hop.dequeued_ns
        routed_span = trace.get_current_span(routed).get_span_context()
        links = [Link(routed_span)] if shadow and routed_span.is_valid else []
        root = tracer.start_span(
            "graylane.worker request",
            context=Context() if shadow else routed,
            kind=SpanKind.CONSUMER,
            links=links,
            start_time=queued_ns,
            attributes={
                **attributes,
                "graylane.request_id": request.request_id[:256],
                "graylane.shadow": shadow,
                "graylane.queue_wait_ms": (hop.dequeued_ns - queued_ns) / 1e6,
            },
        )
        inside = trace.set_span_in_context(root)
        for name, start, end in (
            ("queue", queued_ns, hop.dequeued_ns),
            ("batch", hop.dequeued_ns, hop.started_ns),
            ("engine", hop.started_ns, hop.ran_ns),
        ):
            tracer.start_span(name, context=inside, start_time=start).end(end_time=end)
        deliver = tracer.start_span("deliver", context=inside, start_time=hop.ran_ns)
        spans += [deliver, root]
    return spans


@dataclass(frozen=True, kw_only=True)
class GenerationHop:
    """One generation's pass through a worker's continuous decode batch
    (``time.time_ns()`` values; 0: it never got there)."""

    dequeued_ns: int
    """When it got a decode row (or was answered without one)."""
    first_token_ns: int
    finished_ns: int
    """When its answer was ready to send."""
    model: str
    version: str
    variant: str
    prompt_tokens: int
    generated_tokens: int
    ttft_ms: float
    finish_reason: str
    stream_chunks: int = 0
    """Chunks streamed before the final answer."""
    error_code: str = ""
    """Set when it was answered with an error instead of a generation."""


def record_generation(
    request: TracedRequest, hop: GenerationHop, tracer: trace.Tracer | None = None
) -> list[Span]:
    """The worker's spans of one generation, already past ``finished``; the caller ends
    them (:func:`end_when_acknowledged`) when the broker acknowledged its answer.

    ``tracer``: the process's (default, when :func:`enabled`).
    """
    if tracer is None:
        if not enabled():
            return []
        tracer = trace.get_tracer("graylane.worker")
    routed = extract(request.headers)
    finished_ns = hop.finished_ns
    dequeued_ns = min(hop.dequeued_ns or finished_ns, finished_ns)
    queued_ns = request.timestamp_ms * 1_000_000 if request.timestamp_ms > 0 else dequeued_ns
    queued_ns = min(queued_ns, dequeued_ns)
    first_ns = min(max(hop.first_token_ns, dequeued_ns), finished_ns) if hop.first_token_ns else 0
    routed_span = trace.get_current_span(routed).get_span_context()
    links = [Link(routed_span)] if request.shadow and routed_span.is_valid else []
    attributes: dict[str, str | int | float | bool] = {
        "graylane.model": hop.model,
        "graylane.version": hop.version,
        "graylane.variant": hop.variant,
        "graylane.request_id": request.request_id[:256],
        "graylane.shadow": request.shadow,
        "graylane.prompt_tokens": hop.prompt_tokens,
        "graylane.generated_tokens": hop.generated_tokens,
        "graylane.ttft_ms": hop.ttft_ms,
        "graylane.finish_reason": hop.finish_reason,
        "graylane.stream_chunks": hop.stream_chunks,
        "graylane.queue_wait_ms": (dequeued_ns - queued_ns) / 1e6,
    }
    if hop.error_code:
        attributes["graylane.error_code"] = hop.error_code
    root = tracer.start_span(
        "graylane.worker generation",
        context=Context() if request.shadow else routed,
        kind=SpanKind.CONSUMER,
        links=links,
        start_time=queued_ns,
        attributes=attributes,
    )
    if hop.error_code:
        root.set_status(Status(StatusCode.ERROR, hop.error_code))
    inside = trace.set_span_in_context(root)
    stages = [("queue", queued_ns, dequeued_ns)]
    if first_ns:
        stages += [("prefill", dequeued_ns, first_ns), ("decode", first_ns, finished_ns)]
    for name, start, end in stages:
        tracer.start_span(name, context=inside, start_time=start).end(end_time=end)
    deliver = tracer.start_span("deliver", context=inside, start_time=finished_ns)
    return [deliver, root]


def end_when_acknowledged(spans: Sequence[Span], sends: Sequence[object]) -> None:
    """End ``spans`` once every future among ``sends`` is done (a failed send marks them)."""
    if not spans:
        return
    futures = [f for f in sends if asyncio.isfuture(f)]
    if not futures:
        for s in spans:
            s.end()
        return
    waiting = asyncio.gather(*futures, return_exceptions=True)

    def finish(done: asyncio.Future[list[object]]) -> None:
        failed = not done.cancelled() and any(isinstance(r, BaseException) for r in done.result())
        for s in spans:
            if failed or done.cancelled():
                s.set_status(Status(StatusCode.ERROR, "answer not acknowledged"))
            s.end()

    waiting.add_done_callback(finish)


def configure_tracing(service: str, env: Mapping[str, str] | None = None) -> bool:
    """Set up span export for this process from the ``OTEL_*`` variables; whether it did.

    Off unless ``OTEL_TRACES_EXPORTER`` names an exporter or an OTLP endpoint is set.
    """
    global _ENABLED
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n]
    if not names and (
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        names = ["otlp"]
    names = [n for n in names if n != "none"]
    if not names:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    defaults: dict[str, Any] = {"process.pid": os.getpid(), "graylane.service": service}
    if not env.get("OTEL_SERVICE_NAME"):
        defaults["service.name"] = f"graylane-{service}"
    provider = TracerProvider(resource=Resource.create(defaults))
    for name in names:
        exporter: SpanExporter
        if name == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol != "http/protobuf":
                log.warning("OTLP protocol %s is not installed; exporting http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        elif name == "console":
            exporter = ConsoleSpanExporter()
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER %r ignored", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _ENABLED = True
    return True
