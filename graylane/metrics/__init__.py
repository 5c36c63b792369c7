"""Prometheus metrics of every Graylane service (one registry and one port per process).

Catalogue: :mod:`graylane.metrics.dataplane` (router, worker),
:mod:`graylane.metrics.controlside` (policy engine, control plane, audit sink),
:mod:`graylane.metrics.gpu` (NVML), and ``graylane_build_info`` in
:mod:`graylane.metrics.units`. :func:`serve_observability` serves ``/metrics``,
``/healthz`` and ``/readyz`` on one address.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server

from graylane.metrics.catalogue import catalogue, series_names
from graylane.metrics.controlside import (
    AuditSinkMetrics,
    ControlPlaneMetrics,
    PolicyMetrics,
    RolloutRole,
)
from graylane.metrics.dataplane import RouterMetrics, WorkerMetrics
from graylane.metrics.gpu import NvmlCollector, load_nvml
from graylane.metrics.http import (
    MetricsAddress,
    ObservabilityServer,
    Readiness,
    serve_observability,
)
from graylane.metrics.units import MillisecondHistogram, build_info

__all__ = [
    "AuditSinkMetrics",
    "ControlPlaneMetrics",
    "MetricsAddress",
    "MillisecondHistogram",
    "NvmlCollector",
    "ObservabilityServer",
    "PolicyMetrics",
    "Readiness",
    "RolloutRole",
    "RouterMetrics",
    "WorkerMetrics",
    "build_info",
    "catalogue",
    "load_nvml",
    "series_names",
    "serve_metrics",
    "serve_observability",
]


def serve_metrics(registry: CollectorRegistry, port: int) -> int:
    """Expose ``registry`` on 127.0.0.1:``port`` (0 = do not serve); returns the port.

    Kept for current callers; new code uses :func:`serve_observability`.
    """
    if port <= 0:
        return 0
    start_http_server(port, addr="127.0.0.1", registry=registry)
    return port
