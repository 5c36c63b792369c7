"""Metrics of the Kafka seam itself: faults a consume loop lived through."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

__all__ = ["KafkaMetrics"]


@dataclass(frozen=True)
class KafkaMetrics:
    faults: Counter
    """``graylane_kafka_faults_total{service, kind}``: a batch abandoned or retried."""

    @classmethod
    def create(cls, registry: CollectorRegistry) -> KafkaMetrics:
        return cls(
            faults=Counter(
                "graylane_kafka_faults",
                "Kafka errors a consume loop survived (rebalance, outage, missing topic)",
                ["service", "kind"],
                registry=registry,
            )
        )
