"""Builders of policy-engine window fixtures: a `WindowStats` described by its p99 and
load, and a `TelemetrySample` of one batch. Model "m" throughout."""

from __future__ import annotations

from dataclasses import replace

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.window import TelemetrySample, WindowStats


def window_stats(
    p99_ms: float = 100.0,
    *,
    variant: str = "fp32",
    version: str = "v1",
    throughput_rps: float = 50.0,
    requests: int = 500,
    errors: int = 0,
    queue_wait_mean_ms: float = 0.0,
    p50_ms: float | None = None,
    p95_ms: float | None = None,
    mean_ms: float | None = None,
    window_start_ms: int = 0,
    window_end_ms: int = 10_000,
) -> WindowStats:
    """A window of model "m" described by its p99: p50 and mean default to p99 / 3,
    p95 to p99 / 1.5."""
    return WindowStats(
        p50_ms=p99_ms / 3 if p50_ms is None else p50_ms,
        model="m",
        version=version,
        variant=variant,
        window_start_ms=window_start_ms,
        window_end_ms=window_end_ms,
        requests=requests,
        p95_ms=p99_ms / 1.5 if p95_ms is None else p95_ms,
        errors=errors,
        p99_ms=p99_ms,
        mean_ms=p99_ms / 3 if mean_ms is None else mean_ms,
        throughput_rps=throughput_rps,
        queue_wait_mean_ms=queue_wait_mean_ms,
    )


def served_window(
    p99_ms: float = 100.0,
    *,
    variant: str,
    served_rps: float,
    shed_rps: float = 0.0,
    per_request_ms: float | None = None,
    seconds: float = 4.0,
) -> WindowStats:
    """A ``seconds`` window that served ``served_rps`` (one request at least) and shed
    ``shed_rps``; with ``per_request_ms``, its batches kept the workers busy that many
    milliseconds a request (no service time otherwise)."""
    requests = max(1, round(served_rps * seconds))
    window = window_stats(
        p99_ms,
        variant=variant,
        throughput_rps=served_rps,
        requests=requests,
        window_end_ms=round(seconds * 1000),
    )
    return replace(
        window,
        shed=round(shed_rps * seconds),
        shed_rps=shed_rps,
        service_busy_ms=0.0 if per_request_ms is None else per_request_ms * requests,
        service_requests=0 if per_request_ms is None else requests,
    )


def telemetry(
    *,
    completed_at_ms: int,
    request_count: int,
    latency: LatencyHistogram | None = None,
    shed_count: int = 0,
    started_at_ms: int = 0,
    batch_size: int = 0,
    worker_id: str = "w1",
) -> TelemetrySample:
    """One fp32 batch of model "m" v1 with no errors; an empty latency histogram unless given."""
    return TelemetrySample(
        latency=LatencyHistogram() if latency is None else latency,
        model="m",
        version="v1",
        variant="fp32",
        worker_id=worker_id,
        completed_at_ms=completed_at_ms,
        request_count=request_count,
        error_count=0,
        shed_count=shed_count,
        started_at_ms=started_at_ms,
        batch_size=batch_size,
    )
