"""Wire form of :class:`~graylane.policy_engine.logic.facts.RolloutFacts` in audit records.

A decision taken with liveness facts or step stats replays only with them, so
the audit record carries them: ``step_inputs`` (window stats, in
:mod:`graylane.policy_engine.convert`) and ``liveness`` (here).
"""

from __future__ import annotations

from graylane.policy_engine.logic.facts import LagSample, VersionLiveness
from graylane.v1 import audit_pb2

__all__ = ["liveness_from_pb", "liveness_to_pb"]


def liveness_to_pb(v: VersionLiveness) -> audit_pb2.VersionLiveness:
    pb = audit_pb2.VersionLiveness(
        version=v.version,
        routed_since_telemetry=v.routed_since_telemetry,
        lag=[
            audit_pb2.LagSample(at_unix_ms=s.at_ms, lag=s.lag, committed=s.committed) for s in v.lag
        ],
    )
    if v.first_routed_since_telemetry_ms is not None:
        pb.first_routed_since_telemetry_unix_ms = v.first_routed_since_telemetry_ms
    if v.last_telemetry_ms is not None:
        pb.last_telemetry_unix_ms = v.last_telemetry_ms
    return pb


def liveness_from_pb(pb: audit_pb2.VersionLiveness) -> VersionLiveness:
    return VersionLiveness(
        version=pb.version,
        routed_since_telemetry=pb.routed_since_telemetry,
        first_routed_since_telemetry_ms=(
            pb.first_routed_since_telemetry_unix_ms
            if pb.HasField("first_routed_since_telemetry_unix_ms")
            else None
        ),
        last_telemetry_ms=(
            pb.last_telemetry_unix_ms if pb.HasField("last_telemetry_unix_ms") else None
        ),
        lag=tuple(
            LagSample(s.at_unix_ms, s.lag, s.committed if s.HasField("committed") else None)
            for s in pb.lag
        ),
    )
