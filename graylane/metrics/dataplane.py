"""Metrics of the data plane: the API gateway, the router and the engine workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from graylane.metrics.units import BATCH_BUCKETS, TOKEN_SECONDS_BUCKETS, MillisecondHistogram
from graylane.v1 import inference_pb2

__all__ = ["GatewayMetrics", "RouterMetrics", "TableAges", "WorkerMetrics", "finish_label"]

WORKER_LABELS = ["model", "version", "variant"]


@dataclass(eq=False)
class TableAges(Collector):
    """``graylane_router_table_age_seconds{model}``: now minus when a table was last applied."""

    clock: Callable[[], float] = time.time
    _applied: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def applied(self, model: str, at: float | None = None) -> None:
        with self._lock:
            self._applied[model] = self.clock() if at is None else at

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "graylane_router_table_age_seconds",
            "Seconds since the router applied its routing table",
            labels=["model"],
        )
        now = self.clock()
        with self._lock:
            for model, at in sorted(self._applied.items()):
                family.add_metric([model], max(0.0, now - at))
        yield family


@dataclass(frozen=True)
class RouterMetrics:
    routed: Counter
    errors: Counter
    shadow_copies: Counter
    table_epoch: Gauge
    shed: Counter
    weight: Gauge
    table_ages: TableAges
    _weighted: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def create(
        cls, registry: CollectorRegistry, clock: Callable[[], float] = time.time
    ) -> RouterMetrics:
        ages = TableAges(clock)
        registry.register(ages)
        return cls(
            routed=Counter(
                "graylane_router_requests",
                "Requests forwarded, by chosen version and reason",
                ["model", "version", "reason"],
                registry=registry,
            ),
            errors=Counter(
                "graylane_router_errors",
                "Requests rejected by the router, by error code",
                ["model", "code"],
                registry=registry,
            ),
            shadow_copies=Counter(
                "graylane_router_shadow_copies",
                "Shadow copies sent",
                ["model", "version"],
                registry=registry,
            ),
            table_epoch=Gauge(
                "graylane_router_table_epoch",
                "Epoch of the applied routing table",
                ["model"],
                registry=registry,
            ),
            shed=Counter(
                "graylane_router_shed",
                "Requests dropped by the router without forwarding (load shedding)",
                ["model", "reason"],
                registry=registry,
            ),
            weight=Gauge(
                "graylane_router_weight_ratio",
                "Share of traffic (0..1) the applied routing table gives each version",
                ["model", "version"],
                registry=registry,
            ),
            table_ages=ages,
        )

    def no_table(self, model: str, stable: str) -> None:
        """Before any table: every request goes to the stable version."""
        self.weight.labels(model, stable).set(1.0)
        self._weighted.setdefault(model, set()).add(stable)

    def table_applied(self, model: str, epoch: int, weights: Mapping[str, float]) -> None:
        """Record a newly applied table: its epoch, per-version weights, and its age (0).

        A version the new table leaves out drops to weight 0.
        """
        self.table_epoch.labels(model).set(epoch)
        known = self._weighted.setdefault(model, set())
        for version in known - set(weights):
            self.weight.labels(model, version).set(0.0)
        for version, weight in weights.items():
            self.weight.labels(model, version).set(weight)
        known.update(weights)
        self.table_ages.applied(model)


@dataclass(frozen=True)
class WorkerMetrics:
    """Per worker process; ``queue_wait_ms``/``compute_ms`` take ms, export seconds."""

    requests: Counter
    errors: Counter
    batch_size: Histogram
    queue_wait_ms: MillisecondHistogram
    compute_ms: MillisecondHistogram
    active_variant: Gauge
    e2e_latency_ms: MillisecondHistogram
    service_ms: MillisecondHistogram
    shed: Counter
    consumer_lag: Gauge
    ttft_ms: MillisecondHistogram
    tpot_ms: MillisecondHistogram
    prompt_tokens: Counter
    generated_tokens: Counter
    finish: Counter
    kv_cache_occupancy: Gauge
    waiting_sequences: Gauge
    artifact_verification_failures: Counter

    def generation(
        self, labels: tuple[str, str, str], result: inference_pb2.InferenceResult
    ) -> None:
        """Count one generation's answer: its TTFT/TPOT (when known), tokens and ending."""
        when = result.timing
        if when.ttft_ms > 0.0:
            self.ttft_ms.labels(*labels).observe(when.ttft_ms)
        if when.tpot_ms > 0.0:
            self.tpot_ms.labels(*labels).observe(when.tpot_ms)
        self.prompt_tokens.labels(*labels).inc(max(0, result.usage.prompt_tokens))
        self.generated_tokens.labels(*labels).inc(max(0, result.usage.completion_tokens))
        self.finish.labels(*labels, finish_label(result.finish_reason)).inc()

    @classmethod
    def create(cls, registry: CollectorRegistry) -> WorkerMetrics:
        labels = WORKER_LABELS
        return cls(
            requests=Counter(
                "graylane_worker_requests", "Requests served", labels, registry=registry
            ),
            errors=Counter(
                "graylane_worker_errors",
                "Requests failed, by error code",
                [*labels, "code"],
                registry=registry,
            ),
            batch_size=Histogram(
                "graylane_worker_batch_size",
                "Requests per engine call",
                labels,
                buckets=BATCH_BUCKETS,
                registry=registry,
            ),
            queue_wait_ms=MillisecondHistogram.create(
                "graylane_worker_queue_wait_seconds",
                "Request creation to dequeue by the worker",
                labels,
                registry,
            ),
            compute_ms=MillisecondHistogram.create(
                "graylane_worker_compute_seconds", "Engine time per batch", labels, registry
            ),
            active_variant=Gauge(
                "graylane_worker_active_variant",
                "1 for the variant now serving",
                labels,
                registry=registry,
            ),
            e2e_latency_ms=MillisecondHistogram.create(
                "graylane_e2e_latency_seconds",
                "Request creation to result produced, per model/version/variant",
                labels,
                registry,
            ),
            service_ms=MillisecondHistogram.create(
                "graylane_worker_service_seconds",
                "Dequeue to result produced per request (service time)",
                labels,
                registry,
            ),
            shed=Counter(
                "graylane_worker_shed",
                "Requests dropped unserved (deadline passed, queue over its limit; "
                "priority: to keep more urgent requests on time)",
                [*labels, "reason"],
                registry=registry,
            ),
            consumer_lag=Gauge(
                "graylane_worker_consumer_lag_messages",
                "Records not yet consumed on the version topic (sum over assigned partitions)",
                ["model", "version", "topic"],
                registry=registry,
            ),
            ttft_ms=MillisecondHistogram.create(
                "graylane_time_to_first_token_seconds",
                "GENERATE: request creation to its first token",
                labels,
                registry,
            ),
            tpot_ms=MillisecondHistogram.create(
                "graylane_time_per_output_token_seconds",
                "GENERATE: per request, the mean time per output token after the first",
                labels,
                registry,
                buckets=TOKEN_SECONDS_BUCKETS,
            ),
            prompt_tokens=Counter(
                "graylane_prompt_tokens",
                "GENERATE: prompt tokens of the generations answered",
                labels,
                registry=registry,
            ),
            generated_tokens=Counter(
                "graylane_generated_tokens",
                "GENERATE: tokens generated in the answers",
                labels,
                registry=registry,
            ),
            finish=Counter(
                "graylane_generation_finish",
                "GENERATE: generations answered, by why they ended (eos, stop, length, ...)",
                [*labels, "reason"],
                registry=registry,
            ),
            kv_cache_occupancy=Gauge(
                "graylane_worker_kv_cache_occupancy_ratio",
                "GENERATE: KV-cache positions reserved over the decode loop's budget, 0..1",
                labels,
                registry=registry,
            ),
            waiting_sequences=Gauge(
                "graylane_worker_waiting_sequences",
                "GENERATE: sequences waiting for a decode row",
                labels,
                registry=registry,
            ),
            artifact_verification_failures=Counter(
                "graylane_artifact_verification_failures",
                "Artifacts refused at load because their signature did not verify, by reason "
                "(unsigned, untrusted_key, tampered, malformed)",
                ["model", "version", "reason"],
                registry=registry,
            ),
        )


def finish_label(reason: int) -> str:
    """The ``reason`` label of ``graylane_generation_finish``: the wire enum's name, lower
    case (``eos``, ``stop``, ``length``, ``max_sequence``, ``cancelled``, ``failed``)."""
    try:
        name = inference_pb2.FinishReason.Name(reason)
    except ValueError:
        return "unknown"
    return "unspecified" if reason == 0 else name.lower()


@dataclass(frozen=True)
class GatewayMetrics:
    """Per gateway replica; ``endpoint`` is a fixed name (``chat``, ``completions``,
    ``models``, ``v2_infer``, ...), never a path a client chose."""

    requests: Counter
    latency_ms: MillisecondHistogram
    ttft_ms: MillisecondHistogram
    in_flight: Gauge
    streams_open: Gauge
    refused: Counter
    cancelled: Counter
    unclaimed_replies: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> GatewayMetrics:
        return cls(
            requests=Counter(
                "graylane_gateway_requests",
                "HTTP calls answered, by endpoint and status code",
                ["endpoint", "status"],
                registry=registry,
            ),
            latency_ms=MillisecondHistogram.create(
                "graylane_gateway_latency_seconds",
                "Call received to answer complete (a stream: to its last event)",
                ["endpoint"],
                registry,
            ),
            ttft_ms=MillisecondHistogram.create(
                "graylane_gateway_ttft_seconds",
                "Streamed generations: call received to the first event with text",
                ["endpoint"],
                registry,
            ),
            in_flight=Gauge(
                "graylane_gateway_in_flight",
                "Inference calls this replica is running",
                registry=registry,
            ),
            streams_open=Gauge(
                "graylane_gateway_streams_open",
                "Server-sent event streams this replica is sending (streamed generations)",
                registry=registry,
            ),
            refused=Counter(
                "graylane_gateway_refused",
                "Calls refused at the edge, by reason (auth, rate_limit, overload, size, ...)",
                ["reason"],
                registry=registry,
            ),
            cancelled=Counter(
                "graylane_gateway_cancelled",
                "Generations cancelled because the caller went away",
                ["endpoint"],
                registry=registry,
            ),
            unclaimed_replies=Counter(
                "graylane_gateway_unclaimed_replies",
                "Results on the reply topic no call waited for (late, or not this replica's "
                "requests): dropped, never queued",
                registry=registry,
            ),
        )
