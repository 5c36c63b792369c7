"""The QoS controller's state and decisions (data only; the logic is in :mod:`.qos`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule

__all__ = ["Ceiling", "QosDecision", "QosDecisionKind", "QosState", "initial_qos_state"]


class QosDecisionKind(Enum):
    STEP_DOWN = "step_down"
    STEP_UP = "step_up"
    HOLD = "hold"
    SET = "set"


@dataclass(frozen=True)
class Ceiling:
    """Offered load (served + shed) at which ``variant`` last breached its SLO."""

    variant: str
    throughput_rps: float
    at_ms: int


@dataclass(frozen=True, kw_only=True)
class QosState:
    model: str
    version: str
    active_variant: str
    last_change_ms: int = 0
    breach_since_ms: int | None = None
    calm_since_ms: int | None = None
    ceilings: tuple[Ceiling, ...] = ()
    contention: float = 1.0
    """Smoothed share of its calibrated speed the active rung keeps in the stack
    (:mod:`~graylane.policy_engine.logic.contention`): it prices every rung's capacity."""

    def ceiling_of(self, variant: str) -> Ceiling | None:
        return next((c for c in self.ceilings if c.variant == variant), None)


@dataclass(frozen=True, kw_only=True)
class QosDecision:
    kind: QosDecisionKind
    rule: DecisionRule
    reason: str
    at_ms: int
    before: QosState
    after: QosState
    inputs: tuple[WindowStats, ...] = ()
    scale_hold: str = ""
    """The ``scale_hold`` input (replayed with the decision)."""

    @property
    def variant(self) -> str:
        """The variant to run after this decision."""
        return self.after.active_variant

    @property
    def changed(self) -> bool:
        return self.after.active_variant != self.before.active_variant


def initial_qos_state(policy: QosPolicy) -> QosState:
    """Start at the best quality, with no change on record (no dwell to wait out)."""
    return QosState(model=policy.model, version=policy.version, active_variant=policy.ladder[0])
