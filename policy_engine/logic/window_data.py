"""The policy engine's window data: a batch's telemetry sample and a window's stats.

See :mod:`graylane.policy_engine.logic.window` for how windows are summarized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from graylane.histogram import LatencyHistogram

__all__ = ["Lane", "TelemetrySample", "WindowKey", "WindowStats"]


class Lane(Enum):
    """Which traffic a stat describes: live requests or shadow copies."""

    LIVE = "live"
    SHADOW = "shadow"


@dataclass(frozen=True, kw_only=True)
class TelemetrySample:
    """The part of one ``BatchTelemetry`` record the policy engine needs."""

    model: str
    version: str
    variant: str
    worker_id: str
    completed_at_ms: int
    request_count: int
    error_count: int
    latency: LatencyHistogram
    queue_wait: LatencyHistogram = field(default_factory=LatencyHistogram)
    queue_wait_mean_ms: float = 0.0
    compute_ms: float = 0.0
    device_load: float = 0.0
    shadow_count: int = 0
    lag: int = 0
    started_at_ms: int = 0
    batch_size: int = 0
    batch_id: tuple[str, int, int] | None = None
    """(worker, partition, first offset): a re-sent batch carries the same id."""
    shed_count: int = 0
    """Requests the worker shed (answered SHED, not run) since its previous batch."""

    def __post_init__(self) -> None:
        counts = (self.request_count, self.error_count, self.shadow_count, self.shed_count)
        if min(counts) < 0:
            raise ValueError("telemetry counts must not be negative")
        if self.error_count > self.request_count:
            raise ValueError(
                f"{self.error_count} errors out of {self.request_count} requests is impossible"
            )
        if self.shadow_count > self.request_count:
            raise ValueError(
                f"{self.shadow_count} shadow requests out of {self.request_count} is impossible"
            )

    @property
    def key(self) -> WindowKey:
        return WindowKey(self.model, self.version, self.variant)

    @property
    def is_shadow(self) -> bool:
        """Every request of the batch was a shadow copy."""
        return self.request_count > 0 and self.shadow_count == self.request_count

    @property
    def lane(self) -> Lane:
        return Lane.SHADOW if self.is_shadow else Lane.LIVE

    @property
    def service_ms(self) -> float:
        """The batch's service time (see the module docstring); 0.0 when unknown."""
        wall = self.completed_at_ms - self.started_at_ms if self.started_at_ms > 0 else 0
        return max(float(wall), self.compute_ms, 0.0)


@dataclass(frozen=True, order=True)
class WindowKey:
    model: str
    version: str
    variant: str


@dataclass(frozen=True, kw_only=True)
class WindowStats:
    """Statistics of one (model, version, variant) over one window."""

    model: str
    version: str
    variant: str
    window_start_ms: int
    window_end_ms: int
    requests: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput_rps: float
    queue_wait_mean_ms: float = 0.0
    queue_wait_p99_ms: float = 0.0
    batches: int = 0
    device_load: float = 0.0
    lag: int = 0
    workers: int = 0
    """Distinct workers that reported a batch in the window (replicas serving)."""
    service_p50_ms: float = 0.0
    service_p95_ms: float = 0.0
    service_p99_ms: float = 0.0
    service: LatencyHistogram | None = field(default=None, hash=False, repr=False)
    """Service times of the window's requests; None when no batch carried one."""
    shed: int = 0
    """Requests shed (answered SHED, never run) in the window: not in ``requests``."""
    shed_rps: float = 0.0
    service_busy_ms: float = 0.0
    """Sum of the window's batch service times (each batch once): the workers' busy time."""
    service_requests: int = 0
    """Requests of the batches that carried a service time (``service_busy_ms``'s)."""
    step_offered_rps: float = 0.0
    """Offered load (served + shed) of the newest step alone: the window's average
    lags a jump in load by up to the window's length. A step whose telemetry is
    still in flight reads low, never high."""

    @property
    def service_per_request_ms(self) -> float:
        """Busy milliseconds per request served (0.0 when unknown)."""
        if self.service_requests <= 0 or self.service_busy_ms <= 0.0:
            return 0.0
        return self.service_busy_ms / self.service_requests

    @property
    def offered_rps(self) -> float:
        """Requests/s that arrived: served (``throughput_rps``) plus shed."""
        return self.throughput_rps + self.shed_rps

    @property
    def shed_fraction(self) -> float:
        """Share of the arrived requests that were shed."""
        arrived = self.requests + self.shed
        return self.shed / arrived if arrived else 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def key(self) -> WindowKey:
        return WindowKey(self.model, self.version, self.variant)

    @property
    def duration_ms(self) -> int:
        return self.window_end_ms - self.window_start_ms
