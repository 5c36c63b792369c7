"""Prometheus metrics of the router and the workers (one registry per process)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class RouterMetrics:
    routed: Counter
    errors: Counter
    shadow_copies: Counter
    table_epoch: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> RouterMetrics:
        return cls(
            routed=Counter(
                "graylane_router_requests",
                "Requests forwarded",
                ["model", "version", "reason"],
                registry=registry,
            ),
            errors=Counter(
                "graylane_router_errors", "Requests rejected", ["model", "code"], registry=registry
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
        )


@dataclass(frozen=True)
class WorkerMetrics:
    requests: Counter
    errors: Counter
    batch_size: Histogram
    queue_wait_ms: Histogram
    compute_ms: Histogram
    active_variant: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> WorkerMetrics:
        labels = ["model", "version", "variant"]
        return cls(
            requests=Counter(
                "graylane_worker_requests", "Requests served", labels, registry=registry
            ),
            errors=Counter(
                "graylane_worker_errors", "Requests failed", [*labels, "code"], registry=registry
            ),
            batch_size=Histogram(
                "graylane_worker_batch_size",
                "Requests per engine call",
                labels,
                buckets=_BATCH_BUCKETS,
                registry=registry,
            ),
            queue_wait_ms=Histogram(
                "graylane_worker_queue_wait_ms",
                "Created-to-dequeued time per request",
                labels,
                buckets=_LATENCY_BUCKETS,
                registry=registry,
            ),
            compute_ms=Histogram(
                "graylane_worker_compute_ms",
                "Engine time per batch",
                labels,
                buckets=_LATENCY_BUCKETS,
                registry=registry,
            ),
            active_variant=Gauge(
                "graylane_worker_active_variant",
                "1 for the variant now serving",
                labels,
                registry=registry,
            ),
        )


def serve_metrics(registry: CollectorRegistry, port: int) -> int:
    """Expose ``registry`` on ``port`` (0 = do not serve); returns the port."""
    if port <= 0:
        return 0
    start_http_server(port, addr="127.0.0.1", registry=registry)
    return port
