"""Metrics of the control side: policy engine, control plane and audit sink."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from graylane.metrics.units import SECONDS_BUCKETS

__all__ = ["AuditSinkMetrics", "ControlPlaneMetrics", "PolicyMetrics", "RolloutRole"]


TICK_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.35,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
)
"""A tick is sub-millisecond for a few keys and seconds for thousands: fine buckets for both."""


class RolloutRole(Enum):
    BASELINE = "baseline"
    CANDIDATE = "candidate"


@dataclass(frozen=True)
class PolicyMetrics:
    decisions: Counter
    rollout_phase: Gauge
    rollout_step: Gauge
    rollout_role: Gauge
    routing_epoch: Gauge
    desired_replicas: Gauge
    qos_variant_index: Gauge
    qos_at_floor: Gauge
    qos_breaching: Gauge
    qos_slo_p99: Gauge
    qos_slo_ttft_p99: Gauge
    qos_slo_tpot_p99: Gauge
    skipped_records: Counter
    decision_errors: Counter
    tick_seconds: Histogram
    liveness_probe_seconds: Histogram
    telemetry_records: Counter
    telemetry_delay_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> PolicyMetrics:
        mv = ["model", "version"]
        return cls(
            decisions=Counter(
                "graylane_policy_decisions",
                "Decisions taken, by kind (advance, hold, rollback, step_down, ...) and rule",
                ["model", "kind", "rule"],
                registry=registry,
            ),
            rollout_phase=Gauge(
                "graylane_rollout_phase",
                "1 for the phase the rollout of a candidate version is in, 0 for the others",
                [*mv, "phase"],
                registry=registry,
            ),
            rollout_step=Gauge(
                "graylane_rollout_step",
                "Index of the rollout's current step (0 = first)",
                mv,
                registry=registry,
            ),
            rollout_role=Gauge(
                "graylane_rollout_role",
                "1 while a version is the baseline or the candidate of an active rollout",
                [*mv, "role"],
                registry=registry,
            ),
            routing_epoch=Gauge(
                "graylane_policy_routing_epoch",
                "Epoch of the routing table last published",
                ["model"],
                registry=registry,
            ),
            desired_replicas=Gauge(
                "graylane_desired_replicas",
                "Worker replicas the policy engine asks for, per version",
                mv,
                registry=registry,
            ),
            qos_variant_index=Gauge(
                "graylane_qos_variant_index",
                "Position of the chosen variant on the QoS ladder (0 = best quality)",
                mv,
                registry=registry,
            ),
            qos_at_floor=Gauge(
                "graylane_qos_at_floor",
                "1 when QoS has stepped down to its quality floor",
                mv,
                registry=registry,
            ),
            qos_breaching=Gauge(
                "graylane_qos_breaching",
                "1 while the observed p99 breaches the QoS SLO",
                mv,
                registry=registry,
            ),
            qos_slo_p99=Gauge(
                "graylane_qos_slo_p99_seconds",
                "The QoS policy's p99 latency objective",
                mv,
                registry=registry,
            ),
            qos_slo_ttft_p99=Gauge(
                "graylane_qos_slo_ttft_p99_seconds",
                "The QoS policy's p99 time-to-first-token objective (generative models)",
                mv,
                registry=registry,
            ),
            qos_slo_tpot_p99=Gauge(
                "graylane_qos_slo_tpot_p99_seconds",
                "The QoS policy's p99 time-per-output-token objective (generative models)",
                mv,
                registry=registry,
            ),
            skipped_records=Counter(
                "graylane_policy_skipped_records",
                "Undecodable or invalid records the policy engine skipped, by source and reason",
                ["source", "reason"],
                registry=registry,
            ),
            decision_errors=Counter(
                "graylane_policy_decision_errors",
                "Decisions that failed and were skipped for one rollout or QoS key",
                ["model", "kind"],
                registry=registry,
            ),
            tick_seconds=Histogram(
                "graylane_policy_tick_seconds",
                "One decision tick: metric gates read, rollouts, QoS and scale judged over "
                "every key, and the outputs published",
                buckets=TICK_BUCKETS,
                registry=registry,
            ),
            liveness_probe_seconds=Histogram(
                "graylane_policy_liveness_probe_seconds",
                "One liveness sample of every probed version (end offsets of its topic, its "
                "worker group's committed offsets), read beside the decision tick",
                buckets=TICK_BUCKETS,
                registry=registry,
            ),
            telemetry_records=Counter(
                "graylane_policy_telemetry_records",
                "Telemetry records taken by the policy engine (skipped ones included)",
                registry=registry,
            ),
            telemetry_delay_seconds=Histogram(
                "graylane_policy_telemetry_delay_seconds",
                "How long after it was written a telemetry record reached the policy engine's "
                "core: how far behind the engine reads",
                buckets=(*TICK_BUCKETS, 20.0, 30.0, 60.0),
                registry=registry,
            ),
        )

    def set_phase(self, model: str, version: str, phase: str, phases: Iterable[str]) -> None:
        """Mark ``phase`` 1 and every other of ``phases`` 0 (a Prometheus state set)."""
        for name in phases:
            self.rollout_phase.labels(model, version, name).set(1 if name == phase else 0)

    def set_roles(self, model: str, baseline: str, candidate: str, active: bool) -> None:
        self.rollout_role.labels(model, baseline, RolloutRole.BASELINE.value).set(int(active))
        self.rollout_role.labels(model, candidate, RolloutRole.CANDIDATE.value).set(int(active))


@dataclass(frozen=True)
class ControlPlaneMetrics:
    rpcs: Counter
    rpc_seconds: Histogram
    watch_streams: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ControlPlaneMetrics:
        return cls(
            rpcs=Counter(
                "graylane_controlplane_rpcs",
                "gRPC calls handled, by method and status code",
                ["method", "code"],
                registry=registry,
            ),
            rpc_seconds=Histogram(
                "graylane_controlplane_rpc_seconds",
                "gRPC handling time",
                ["method"],
                buckets=SECONDS_BUCKETS,
                registry=registry,
            ),
            watch_streams=Gauge(
                "graylane_controlplane_watch_streams",
                "Open Watch streams",
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class AuditSinkMetrics:
    records: Counter
    duplicates: Counter
    last_record: Gauge
    write_seconds: Histogram
    consumer_lag: Gauge
    skipped: Counter
    restarts: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> AuditSinkMetrics:
        return cls(
            records=Counter(
                "graylane_audit_records",
                "Audit records copied into SQL, by decision kind",
                ["model", "kind"],
                registry=registry,
            ),
            duplicates=Counter(
                "graylane_audit_duplicates",
                "Audit records read again and skipped (already stored)",
                registry=registry,
            ),
            last_record=Gauge(
                "graylane_audit_last_record_timestamp_seconds",
                "Creation time of the newest stored audit record",
                ["model"],
                registry=registry,
            ),
            write_seconds=Histogram(
                "graylane_audit_write_seconds",
                "Time to store one batch of audit records",
                buckets=SECONDS_BUCKETS,
                registry=registry,
            ),
            consumer_lag=Gauge(
                "graylane_audit_consumer_lag_messages",
                "Records not yet copied, per topic",
                ["topic"],
                registry=registry,
            ),
            skipped=Counter(
                "graylane_audit_skipped_records",
                "Records the audit sink could not decode or store and skipped, by topic and reason",
                ["topic", "reason"],
                registry=registry,
            ),
            restarts=Counter(
                "graylane_audit_sink_restarts",
                "Audit sink restarts after a database or broker error, by error type",
                ["error"],
                registry=registry,
            ),
        )
