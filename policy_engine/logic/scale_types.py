"""The replica controller's policy, inputs, state and decisions (data; logic in :mod:`.scale`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from graylane.rollouts.errors import InvalidPolicy
from graylane.rollouts.vocabulary import DecisionRule

__all__ = [
    "LearnedCapacity",
    "ScaleDecision",
    "ScaleDecisionKind",
    "ScalePolicy",
    "ScaleReason",
    "ScaleSignals",
    "ScaleState",
    "initial_scale_state",
]


class ScaleDecisionKind(Enum):
    SCALE_OUT = "scale_out"
    SCALE_IN = "scale_in"
    HOLD = "hold"


class ScaleReason(Enum):
    """Why the desired replicas changed (the wire's ``ScaleReason``)."""

    FLOOR_BREACH = "floor_breach"
    LAG_GROWING = "lag_growing"
    LOW_LOAD = "low_load"
    OVERLOAD = "overload"

    @property
    def rule(self) -> DecisionRule:
        return _REASON_RULE[self]


_REASON_RULE = {
    ScaleReason.FLOOR_BREACH: DecisionRule.SCALE_FLOOR_BREACH,
    ScaleReason.LAG_GROWING: DecisionRule.SCALE_LAG_GROWING,
    ScaleReason.LOW_LOAD: DecisionRule.SCALE_LOW_LOAD,
    ScaleReason.OVERLOAD: DecisionRule.SCALE_OVERLOAD,
}


@dataclass(frozen=True, kw_only=True)
class ScalePolicy:
    """Bounds and timings of the replica controller (one per engine, or per version)."""

    min_replicas: int = 1
    max_replicas: int = 1
    """1 = never scale out (the default: nothing obeys a request unless deployed to)."""
    lag_growth_s: float = 10.0
    min_lag_growth: int = 1
    out_dwell_s: float = 15.0
    cooldown_s: float = 30.0
    in_load_fraction: float = 0.5
    settle_s: float = 10.0
    out_load_fraction: float = 0.7
    """An overload scales out at once when the offered load is past this share of
    what the replicas serve at the quality floor (QoS's ``up_capacity_fraction``:
    the load a rung copes with)."""

    def __post_init__(self) -> None:
        problems = []
        if self.min_replicas < 1:
            problems.append(f"min_replicas {self.min_replicas} < 1")
        if self.max_replicas < self.min_replicas:
            problems.append(f"max_replicas {self.max_replicas} < min_replicas {self.min_replicas}")
        if self.min_lag_growth < 0:
            problems.append(f"min_lag_growth {self.min_lag_growth} < 0")
        for name in ("lag_growth_s", "out_dwell_s", "cooldown_s", "settle_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                problems.append(f"{name} {value} is out of range")
        for name in ("in_load_fraction", "out_load_fraction"):
            if not 0.0 < getattr(self, name) <= 1.0:
                problems.append(f"{name} {getattr(self, name)} is out of range")
        if problems:
            raise InvalidPolicy("scale policy: " + "; ".join(problems))

    @property
    def enabled(self) -> bool:
        return self.max_replicas > self.min_replicas

    def bound(self, partitions: int) -> int:
        """The most replicas allowed: ``max_replicas``, at most ``partitions`` (if known)."""
        return min(self.max_replicas, partitions) if partitions > 0 else self.max_replicas


@dataclass(frozen=True, kw_only=True)
class ScaleSignals:
    """What the replica controller sees of one model version at one evaluation."""

    model: str
    version: str
    floor_breach: bool = False
    """QoS runs its quality floor and has breached for its sustain time."""
    breaching: bool = False
    """QoS sees a breach now (at any rung): never scale in then."""
    throughput_rps: float = 0.0
    lag: int = 0
    replicas: int = 0
    """Workers seen in the window's telemetry (0 = unknown)."""
    partitions: int = 0
    """Partitions of the version's request topic (0 = unknown)."""
    variant: str = ""
    replica_capacity_rps: float = 0.0
    """Calibrated requests/s of one replica on ``variant`` (0 = unknown: learned)."""
    offered_rps: float = 0.0
    """Requests/s that arrived (served + shed; the newest step's when higher)."""
    floor_capacity_rps: float = 0.0
    """Calibrated requests/s of one replica on the QoS ladder's quality floor, as it
    holds in the running stack (0 = unknown, or no ladder)."""


@dataclass(frozen=True)
class LearnedCapacity:
    """Requests/s one replica served on ``variant`` when it last needed help."""

    variant: str
    rps: float
    at_ms: int


@dataclass(frozen=True, kw_only=True)
class ScaleState:
    model: str
    version: str
    desired: int
    last_change_ms: int = 0
    lag_since_ms: int | None = None
    lag_at_since: int = 0
    last_lag: int = 0
    low_since_ms: int | None = None
    capacities: tuple[LearnedCapacity, ...] = ()

    def capacity_of(self, variant: str) -> LearnedCapacity | None:
        return next((c for c in self.capacities if c.variant == variant), None)


@dataclass(frozen=True, kw_only=True)
class ScaleDecision:
    kind: ScaleDecisionKind
    rule: DecisionRule
    reason: ScaleReason | None
    detail: str
    at_ms: int
    before: ScaleState
    after: ScaleState
    signals: ScaleSignals

    @property
    def desired(self) -> int:
        return self.after.desired

    @property
    def changed(self) -> bool:
        return self.after.desired != self.before.desired


def initial_scale_state(
    model: str, version: str, policy: ScalePolicy, replicas: int = 0, partitions: int = 0
) -> ScaleState:
    """Start from what serves now (at least ``min_replicas``), with no change on record."""
    desired = min(max(replicas, policy.min_replicas), max(policy.bound(partitions), 1))
    return ScaleState(model=model, version=version, desired=desired)
