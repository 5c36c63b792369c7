"""Every metric family name Graylane exports, as Prometheus sees it (for rules and dashboards)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from graylane.metrics.controlside import AuditSinkMetrics, ControlPlaneMetrics, PolicyMetrics
from graylane.metrics.dataplane import GatewayMetrics, RouterMetrics, WorkerMetrics
from graylane.metrics.gpu import GPU_METRIC_NAMES
from graylane.metrics.kafka import KafkaMetrics
from graylane.metrics.units import build_info

__all__ = ["catalogue", "series_names"]

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def catalogue() -> dict[str, str]:
    """Family name -> type (``counter``, ``gauge``, ``histogram``) over every service."""
    registry = CollectorRegistry()
    for metrics in (
        GatewayMetrics,
        RouterMetrics,
        WorkerMetrics,
        PolicyMetrics,
        ControlPlaneMetrics,
    ):
        metrics.create(registry)
    AuditSinkMetrics.create(registry)
    KafkaMetrics.create(registry)
    build_info(registry, service="catalogue", version="0", git_sha="0")
    found = {family.name: family.type for family in registry.collect()}
    found.update(dict.fromkeys(GPU_METRIC_NAMES, "gauge"))
    return found


def series_names() -> frozenset[str]:
    """Every series name a PromQL expression may use (``_total``, ``_bucket`` ... included)."""
    names: set[str] = set()
    for family, kind in catalogue().items():
        if kind == "counter":
            names.add(family + "_total")
        else:
            names.add(family)
        names.update(family + s for s in _SUFFIXES.get(kind, ()) if s != "_total")
    return frozenset(names)
