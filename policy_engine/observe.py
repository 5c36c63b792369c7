"""What the policy engine's outputs say, as metrics (decisions, rollout phase/step/roles, QoS,
desired replicas)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from graylane.metrics import PolicyMetrics
from graylane.policy_engine.logic.qos import QosState
from graylane.policy_engine.logic.scale import ScaleState
from graylane.policy_engine.messages import (
    CommandRejected,
    Output,
    PrecisionPublication,
    QosAudit,
    QosPolicySet,
    RolloutAudit,
    RolloutPublication,
    RoutingPublication,
    ScaleAudit,
    ScalePublication,
)
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule, Phase

__all__ = ["PolicyObserver"]

_PHASES = tuple(p.value for p in Phase)
_ACTIVE = {Phase.PENDING, Phase.SHADOWING, Phase.PROGRESSING, Phase.AB_HOLDING, Phase.PAUSED}


@dataclass
class PolicyObserver:
    """Feed it every batch of outputs the engine publishes."""

    metrics: PolicyMetrics
    _policies: dict[tuple[str, str], QosPolicy] = field(default_factory=dict)

    def observe(self, outputs: Iterable[Output]) -> None:
        for out in outputs:
            self._one(out)

    def _one(self, out: Output) -> None:
        m = self.metrics
        if isinstance(out, RolloutAudit):
            rd = out.decision
            m.decisions.labels(out.spec.model, rd.kind.value, str(rd.rule)).inc()
        elif isinstance(out, RolloutPublication):
            state, spec = out.state, out.spec
            m.set_phase(spec.model, spec.candidate, state.phase.value, _PHASES)
            m.rollout_step.labels(spec.model, spec.candidate).set(state.step_index)
            m.set_roles(spec.model, spec.baseline, spec.candidate, state.phase in _ACTIVE)
        elif isinstance(out, RoutingPublication):
            m.routing_epoch.labels(out.plan.model).set(out.plan.epoch)
        elif isinstance(out, QosAudit):
            qd = out.decision
            m.decisions.labels(qd.after.model, qd.kind.value, str(qd.rule)).inc()
            self._qos(qd.after)
        elif isinstance(out, PrecisionPublication):
            self._qos(out.decision.after)
        elif isinstance(out, QosPolicySet):
            policy = out.policy
            self._policies[(policy.model, policy.version)] = policy
            m.qos_slo_p99.labels(policy.model, policy.version).set(policy.slo_p99_ms / 1000.0)
            self._qos(out.after)
        elif isinstance(out, ScalePublication):
            after = out.decision.after
            m.desired_replicas.labels(after.model, after.version).set(after.desired)
        elif isinstance(out, ScaleAudit):
            d = out.decision
            m.decisions.labels(d.after.model, d.kind.value, str(d.rule)).inc()
        elif isinstance(out, CommandRejected):
            m.decisions.labels(
                out.command.model, "rejected", str(DecisionRule.COMMAND_REJECTED)
            ).inc()

    def desired_replicas(self, states: Iterable[ScaleState]) -> None:
        """Every scaled version's desired replicas (also those restored or not yet changed)."""
        for state in states:
            self.metrics.desired_replicas.labels(state.model, state.version).set(state.desired)

    def _qos(self, state: QosState) -> None:
        labels = (state.model, state.version)
        m = self.metrics
        m.qos_breaching.labels(*labels).set(int(state.breach_since_ms is not None))
        policy = self._policies.get(labels)
        if policy is None or state.active_variant not in policy.ladder:
            return
        floor = policy.quality_floor or policy.ladder[-1]
        m.qos_variant_index.labels(*labels).set(policy.ladder.index(state.active_variant))
        m.qos_at_floor.labels(*labels).set(int(state.active_variant == floor))
