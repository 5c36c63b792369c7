"""Building blocks of rollout decisions shared by evaluation and manual commands."""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.facts import RolloutFacts
from graylane.policy_engine.logic.rollout_state import (
    Decision,
    RolloutState,
    RoutingIntent,
    StepEvidence,
    check_transition,
)
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.errors import InputMismatch, RolloutFinished
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, ManualCommand, Phase

__all__ = ["check_rollout", "pending_state", "routing_of", "transition"]


def pending_state(spec: RolloutSpec, now_ms: int, *, epoch: int = 0) -> RolloutState:
    """The state of a rollout that exists but has not started."""
    return RolloutState(
        rollout_id=spec.rollout_id,
        model=spec.model,
        phase=Phase.PENDING,
        phase_started_ms=now_ms,
        step_started_ms=now_ms,
        epoch=epoch,
        updated_ms=now_ms,
        last_reason="created",
    )


def routing_of(spec: RolloutSpec, state: RolloutState) -> RoutingIntent:
    """The traffic split ``state`` stands for."""
    promoted = state.phase is Phase.PROMOTED
    shadowing = state.shadow_share > 0.0
    return RoutingIntent(
        model=spec.model,
        rollout_id=spec.rollout_id,
        stable_version=spec.candidate if promoted else spec.baseline,
        baseline=spec.baseline,
        candidate=spec.candidate,
        candidate_weight_percent=state.candidate_weight_percent,
        shadow_version=spec.candidate if shadowing else None,
        shadow_share=state.shadow_share,
        epoch=state.epoch,
    )


def check_rollout(state: RolloutState, spec: RolloutSpec) -> None:
    """Raise unless ``state`` belongs to ``spec`` and is still open."""
    if state.rollout_id != spec.rollout_id:
        raise InputMismatch(f"state of {state.rollout_id!r} with spec of {spec.rollout_id!r}")
    if state.terminal:
        raise RolloutFinished(f"rollout {state.rollout_id!r} is {state.phase.value}")


def transition(
    state: RolloutState,
    spec: RolloutSpec,
    now_ms: int,
    kind: DecisionKind,
    rule: DecisionRule,
    reason: str,
    *,
    phase: Phase,
    step_index: int,
    weight: float,
    shadow_share: float,
    before: RolloutState | None = None,
    inputs: tuple[WindowStats, ...] = (),
    agreement: AgreementStats | None = None,
    command: ManualCommand | None = None,
    note: str = "",
    facts: RolloutFacts | None = None,
) -> Decision:
    """Move to ``phase`` with a new traffic split: one routing intent, the next epoch.

    The step's timers, evidence and failure streak start over (a rollback
    keeps its failure count on record). ``before`` is the state the decision
    started from when it differs from ``state`` (evidence added on the way).
    """
    check_transition(state.phase, phase)
    after = replace(
        state,
        phase=phase,
        step_index=step_index,
        candidate_weight_percent=weight,
        shadow_share=shadow_share,
        phase_started_ms=now_ms if phase is not state.phase else state.phase_started_ms,
        step_started_ms=now_ms,
        consecutive_failures=0 if phase is not Phase.ROLLED_BACK else state.consecutive_failures,
        failure_window_end_ms=0,
        paused_from=None,
        last_reason=reason,
        epoch=state.epoch + 1,
        updated_ms=now_ms,
        evidence=StepEvidence(),
    )
    return Decision(
        kind=kind,
        rule=rule,
        reason=reason,
        at_ms=now_ms,
        before=before if before is not None else state,
        after=after,
        routing=routing_of(spec, after),
        inputs=inputs,
        agreement=agreement,
        command=command,
        note=note,
        facts=facts,
    )
