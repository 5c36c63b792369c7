"""The worker's metrics, readiness and consumer lag (the Prometheus side of one worker)."""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer

from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.results import BatchReport
from graylane.kafka.reading import consumer_lag
from graylane.metrics import NvmlCollector, ServiceObservability, WorkerMetrics, load_nvml
from graylane.settings import Settings

__all__ = ["WorkerObserver"]


class WorkerObserver:
    """Counts what one worker serves and exports it; no decision depends on it."""

    def __init__(self, config: WorkerConfig) -> None:
        self._config = config
        self.observability = ServiceObservability("worker")
        self.registry = self.observability.registry
        self.metrics = WorkerMetrics.create(self.registry)
        self._lag_checked = 0.0
        self.lag = 0
        """Records not yet consumed on the version topic at the last check (for telemetry)."""

    def count_error(self, variant: str, code: str, n: int = 1) -> None:
        self.metrics.errors.labels(self._config.model, self._config.version, variant, code).inc(n)
        if code == "DEADLINE_EXCEEDED":
            self.metrics.shed.labels(
                self._config.model, self._config.version, variant, "deadline"
            ).inc(n)

    async def observe_lag(self, consumer: AIOKafkaConsumer, every_s: float = 1.0) -> None:
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
        for answer in report.answers:
            if answer.result is not None:
                when = answer.result.timing
                self.metrics.queue_wait_ms.labels(*labels).observe(when.queue_wait_ms)
                self.metrics.e2e_latency_ms.labels(*labels).observe(when.total_ms)
                self.metrics.service_ms.labels(*labels).observe(
                    max(0, when.completed_at_unix_ms - when.dequeued_at_unix_ms)
                )
        self.metrics.requests.labels(*labels).inc(report.served)
        self.metrics.batch_size.labels(*labels).observe(report.telemetry.batch_size)
        self.metrics.compute_ms.labels(*labels).observe(report.telemetry.compute_ms)
