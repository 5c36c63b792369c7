"""Metrics of the Kafka seam itself: faults a consume loop lived through, batches in flight."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["KafkaMetrics"]


@dataclass(frozen=True)
class KafkaMetrics:
    faults: Counter
    """``graylane_kafka_faults_total{service, kind}``: a batch abandoned or retried."""
    in_flight: Gauge
    """``graylane_kafka_in_flight_cycles{service}``: cycles a pipelined consume loop has
    handled and not yet committed (their sends, or an older cycle's, unacknowledged)."""

    @classmethod
    def create(cls, registry: CollectorRegistry) -> KafkaMetrics:
        return cls(
            faults=Counter(
                "graylane_kafka_faults",
                "Kafka errors a consume loop survived (rebalance, outage, missing topic)",
                ["service", "kind"],
                registry=registry,
            ),
            in_flight=Gauge(
                "graylane_kafka_in_flight_cycles",
                "Batches a pipelined consume loop handled and has not committed yet",
                ["service"],
                registry=registry,
            ),
        )
