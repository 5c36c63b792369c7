"""Prometheus metrics of every Graylane service (one registry and one port per process).

Catalogue: :mod:`graylane.metrics.dataplane` (gateway, router, worker),
:mod:`graylane.metrics.controlside` (policy engine, control plane, audit sink),
:mod:`graylane.metrics.gpu` (NVML), and ``graylane_build_info`` in
:mod:`graylane.metrics.units`. :func:`serve_observability` (in
:mod:`graylane.metrics.process`) serves ``/metrics``, ``/healthz`` and ``/readyz`` on one
address.

Room: the library. May import the library; no service.
"""

from __future__ import annotations

from graylane.metrics.catalogue import catalogue, series_names
from graylane.metrics.controlside import (
    AuditSinkMetrics,
    ControlPlaneMetrics,
    PolicyMetrics,
)
from graylane.metrics.dataplane import GatewayMetrics, RouterMetrics, WorkerMetrics
from graylane.metrics.gpu import NvmlCollector, load_nvml
from graylane.metrics.process import (
    CONTROL_CAUGHT_UP,
    ENGINE_UP,
    GROUP_JOINED,
    BuildLabels,
    MetricsAddress,
    Readiness,
    ServiceObservability,
    serve_observability,
)
from graylane.metrics.units import MillisecondHistogram, build_info

__all__ = [
    "CONTROL_CAUGHT_UP",
    "ENGINE_UP",
    "GROUP_JOINED",
    "AuditSinkMetrics",
    "BuildLabels",
    "ControlPlaneMetrics",
    "GatewayMetrics",
    "MetricsAddress",
    "MillisecondHistogram",
    "NvmlCollector",
    "PolicyMetrics",
    "Readiness",
    "RouterMetrics",
    "ServiceObservability",
    "WorkerMetrics",
    "build_info",
    "catalogue",
    "load_nvml",
    "series_names",
    "serve_observability",
]
