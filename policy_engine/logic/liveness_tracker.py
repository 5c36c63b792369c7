"""What the policy engine saw of each version's topic and telemetry (pure).

The adapter (``graylane.policy_engine.liveness_probe``) samples, per version
of an active rollout, the sum of the version topic's end offsets (what the
router sent it) and of the worker group's committed offsets (what a worker
consumed); the core notes each telemetry arrival. :meth:`LivenessTracker.facts`
turns that into the :class:`~.facts.VersionLiveness` the rollout rule judges.

Requests "routed since the last telemetry" count from the end offset seen when
the last telemetry arrived (or from the first sample, before any telemetry),
so records already in the topic before the rollout began never count.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from graylane.policy_engine.logic.facts import LagSample, VersionLiveness

__all__ = ["DEFAULT_LAG_HORIZON_MS", "LivenessTracker", "OffsetSample"]

DEFAULT_LAG_HORIZON_MS = 60_000
"""Lag samples older than this are dropped (the rule looks back T, by default 10 s)."""


@dataclass(frozen=True)
class OffsetSample:
    """One probe of a version topic: end offsets, the group's committed offsets and its lag,
    summed over partitions; ``committed`` is None when the group has committed nothing on
    some partition (its lag there counts from offset 0)."""

    at_ms: int
    end: int
    committed: int | None
    lag: int


@dataclass
class _Version:
    ref_end: int | None = None  # end offset when the last telemetry arrived
    latest_end: int | None = None
    first_routed_ms: int | None = None  # first sample above ref_end
    last_telemetry_ms: int | None = None
    lag: deque[LagSample] = field(default_factory=deque)


class LivenessTracker:
    """Per (model, version): routed-since-telemetry, telemetry last seen, lag samples."""

    def __init__(self, horizon_ms: int = DEFAULT_LAG_HORIZON_MS) -> None:
        if horizon_ms <= 0:
            raise ValueError(f"horizon {horizon_ms} ms must be positive")
        self.horizon_ms = horizon_ms
        self._versions: dict[tuple[str, str], _Version] = {}

    def on_telemetry(self, model: str, version: str, at_ms: int) -> None:
        """Telemetry of the version arrived at ``at_ms``: what was routed so far is answered."""
        v = self._versions.setdefault((model, version), _Version())
        v.last_telemetry_ms = max(v.last_telemetry_ms or at_ms, at_ms)
        v.ref_end = v.latest_end
        v.first_routed_ms = None

    def on_offsets(self, model: str, version: str, sample: OffsetSample) -> None:
        v = self._versions.setdefault((model, version), _Version())
        if v.lag and sample.at_ms < v.lag[-1].at_ms:
            return  # a late probe: samples stay in time order
        if v.ref_end is None:
            v.ref_end = sample.end
        elif sample.end > v.ref_end and v.first_routed_ms is None:
            v.first_routed_ms = sample.at_ms
        v.latest_end = sample.end
        v.lag.append(LagSample(sample.at_ms, sample.lag, sample.committed))
        while v.lag and sample.at_ms - v.lag[0].at_ms > self.horizon_ms:
            v.lag.popleft()

    def facts(self, model: str, version: str) -> VersionLiveness | None:
        """What is known of the version; None before any probe or telemetry."""
        v = self._versions.get((model, version))
        if v is None:
            return None
        routed = 0
        if v.ref_end is not None and v.latest_end is not None:
            routed = max(0, v.latest_end - v.ref_end)
        return VersionLiveness(
            version=version,
            routed_since_telemetry=routed,
            first_routed_since_telemetry_ms=v.first_routed_ms if routed else None,
            last_telemetry_ms=v.last_telemetry_ms,
            lag=tuple(v.lag),
        )

    def forget(self, model: str, keep: frozenset[str] = frozenset()) -> None:
        """Drop the model's versions except ``keep`` (a rollout ended)."""
        for key in [k for k in self._versions if k[0] == model and k[1] not in keep]:
            del self._versions[key]
