"""What one worker counts and exports (no decision depends on it): its metrics, its
consumer lag, and the readiness conditions it is judged by."""

from __future__ import annotations

import time
from collections.abc import Sequence

from graylane.artifacts.signing import RefusedArtifact
from graylane.engine_worker.backend import BatchReport
from graylane.engine_worker.config import WorkerConfig
from graylane.errors import ErrorCode
from graylane.kafka.reading import consumer_lag
from graylane.kafka.seam import BatchConsumer
from graylane.metrics.dataplane import WorkerMetrics
from graylane.metrics.gpu import NvmlCollector, load_nvml
from graylane.metrics.process import (
    CONTROL_CAUGHT_UP,
    ENGINE_UP,
    GROUP_JOINED,
    Readiness,
    ServiceObservability,
)
from graylane.settings import Settings
from graylane.v1 import inference_pb2

__all__ = ["WorkerObserver"]


class WorkerObserver:
    """Counts what one worker serves and exports it; no decision depends on it."""

    def __init__(self, config: WorkerConfig) -> None:
        self._config = config
        conditions: tuple[str, ...] = (GROUP_JOINED, CONTROL_CAUGHT_UP)
        if config.endpoints:  # ready only while the active variant's engine answers
            conditions = (*conditions, ENGINE_UP)
        self.observability = ServiceObservability("worker", readiness=Readiness(conditions))
        self.registry = self.observability.registry
        self.metrics = WorkerMetrics.create(self.registry)
        self.count_refused(config.refused_artifacts)
        self._lag_checked = 0.0
        self.lag = 0
        """Records not yet consumed on the version topic at the last check (for telemetry)."""

    def count_refused(self, refused: Sequence[RefusedArtifact]) -> None:
        """Count artifacts refused for their signature, at start or on a reload."""
        for artifact in refused:
            self.metrics.artifact_verification_failures.labels(
                self._config.model, self._config.version, artifact.reason.value
            ).inc()

    def count_error(self, variant: str, code: ErrorCode, n: int = 1) -> None:
        """Count ``n`` answers of error ``code`` (named only here, on the metric label)."""
        cfg = self._config
        self.metrics.errors.labels(cfg.model, cfg.version, variant, code.name).inc(n)
        if code is ErrorCode.DEADLINE_EXCEEDED:
            self.metrics.shed.labels(cfg.model, cfg.version, variant, "deadline").inc(n)

    async def observe_lag(self, consumer: BatchConsumer, every_s: float = 1.0) -> None:
        """Consumer lag per version topic, at most once per ``every_s``; readiness on assignment."""
        if time.monotonic() - self._lag_checked < every_s:
            return
        self._lag_checked = time.monotonic()
        self.observability.note_assignment(consumer.assignment())
        lags = await consumer_lag(consumer)
        self.lag = sum(lags.values())
        for topic, lag in lags.items():
            self.metrics.consumer_lag.labels(self._config.model, self._config.version, topic).set(
                lag
            )

    def start(self, settings: Settings) -> None:
        cfg = self._config
        self.registry.register(NvmlCollector(cfg.model, cfg.version, load_nvml()))
        self.observability.start(
            settings.metrics_address(cfg.metrics_port), settings.build_labels()
        )

    def record(self, report: BatchReport, variant: str) -> None:
        labels = (self._config.model, self._config.version, variant)
        for code, n in report.error_codes.items():
            self.count_error(variant, code, n)
        for job in report.answers:
            if job.result is not None:
                when = job.result.timing
                self.metrics.queue_wait_ms.labels(*labels).observe(when.queue_wait_ms)
                self.metrics.e2e_latency_ms.labels(*labels).observe(when.total_ms)
                self.metrics.service_ms.labels(*labels).observe(
                    max(0, when.completed_at_unix_ms - when.dequeued_at_unix_ms)
                )
                if job.result.task == inference_pb2.GENERATE:
                    self.metrics.generation(labels, job.result)
        self.metrics.requests.labels(*labels).inc(report.served)
        self.metrics.batch_size.labels(*labels).observe(report.telemetry.batch_size)
        self.metrics.compute_ms.labels(*labels).observe(report.telemetry.compute_ms)
        if report.telemetry.HasField("generation"):
            generation = report.telemetry.generation
            self.metrics.kv_cache_occupancy.labels(*labels).set(generation.kv_cache_occupancy)
            self.metrics.waiting_sequences.labels(*labels).set(generation.waiting_sequences)
