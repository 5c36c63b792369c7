"""Bucket layouts, the millisecond adapter and ``graylane_build_info``."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge, Histogram

__all__ = [
    "BATCH_BUCKETS",
    "SECONDS_BUCKETS",
    "TOKEN_SECONDS_BUCKETS",
    "MillisecondHistogram",
    "build_info",
]

SECONDS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
TOKEN_SECONDS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
)
"""Time per output token: finer where decode steps live (a few ms to ~100 ms)."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class _MillisecondChild:
    child: Histogram

    def observe(self, ms: float) -> None:
        self.child.observe(ms / 1000.0)


@dataclass(frozen=True)
class MillisecondHistogram:
    """A ``*_seconds`` histogram that callers feed in milliseconds (the services' unit)."""

    histogram: Histogram

    def labels(self, *values: str) -> _MillisecondChild:
        return _MillisecondChild(self.histogram.labels(*values))

    @classmethod
    def create(
        cls,
        name: str,
        doc: str,
        labels: list[str],
        registry: CollectorRegistry,
        buckets: tuple[float, ...] = SECONDS_BUCKETS,
    ) -> MillisecondHistogram:
        if not name.endswith("_seconds"):
            raise ValueError(f"{name}: a duration metric is named in seconds")
        return cls(Histogram(name, doc, labels, buckets=buckets, registry=registry))


def build_info(
    registry: CollectorRegistry,
    *,
    service: str,
    version: str,
    git_sha: str,
    build_time: str = "unknown",
) -> Gauge:
    """``graylane_build_info{service,version,git_sha,build_time} 1`` for one process."""
    gauge = Gauge(
        "graylane_build_info",
        "Always 1; labels name the running build",
        ["service", "version", "git_sha", "build_time"],
        registry=registry,
    )
    gauge.labels(service, version, git_sha, build_time).set(1)
    return gauge
