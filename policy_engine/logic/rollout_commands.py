"""Manual commands of operators: pause, resume, promote, roll back, abort.

PAUSE freezes the weights (evaluations only HOLD); RESUME returns to the phase
paused from, keeping its step, timers and evidence (the candidate kept serving
at its weight meanwhile); PROMOTE and ROLLBACK act at once; ABORT ends the
rollout with the candidate at 0 % (before the start: with no routing at all).
A command the transition table does not allow raises ``InvalidTransition``;
a finished rollout raises ``RolloutFinished``.
"""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.logic.rollout_moves import check_rollout, transition
from graylane.policy_engine.logic.rollout_state import Decision, RolloutState, check_transition
from graylane.rollouts.errors import InvalidTransition
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import DecisionKind, ManualCommand, Phase

__all__ = ["apply_command"]


def apply_command(
    state: RolloutState,
    spec: RolloutSpec,
    command: ManualCommand,
    now_ms: int,
    *,
    note: str = "",
) -> Decision:
    """Apply an operator's command; ``note`` (who / why) goes into the reason."""
    check_rollout(state, spec)
    rule = command.rule
    suffix = f" ({note})" if note else ""
    kind = DecisionKind.MANUAL
    if command is ManualCommand.PAUSE:
        check_transition(state.phase, Phase.PAUSED)
        reason = (
            f"paused at {state.phase.value}, {spec.candidate} frozen at "
            f"{state.candidate_weight_percent:g}%{suffix}"
        )
        after = replace(
            state,
            phase=Phase.PAUSED,
            paused_from=state.phase,
            last_reason=reason,
            updated_ms=now_ms,
        )
        return Decision(
            kind=kind,
            rule=rule,
            reason=reason,
            at_ms=now_ms,
            before=state,
            after=after,
            command=command,
            note=note,
        )
    if command is ManualCommand.RESUME:
        if state.phase is not Phase.PAUSED or state.paused_from is None:
            raise InvalidTransition(f"cannot resume a rollout that is {state.phase.value}")
        check_transition(Phase.PAUSED, state.paused_from)
        reason = f"resumed {state.paused_from.value}{suffix}"
        after = replace(
            state, phase=state.paused_from, paused_from=None, last_reason=reason, updated_ms=now_ms
        )
        return Decision(
            kind=kind,
            rule=rule,
            reason=reason,
            at_ms=now_ms,
            before=state,
            after=after,
            command=command,
            note=note,
        )
    if command is ManualCommand.PROMOTE:
        target, weight = Phase.PROMOTED, 100.0
        reason = f"promoted {spec.candidate} to 100% and stable by command{suffix}"
    elif command is ManualCommand.ROLLBACK:
        target, weight = Phase.ROLLED_BACK, 0.0
        reason = f"rolled back {spec.candidate} to 0% by command{suffix}"
    else:
        target, weight = Phase.ABORTED, 0.0
        reason = f"aborted the rollout of {spec.candidate}; candidate at 0%{suffix}"
    if state.phase is Phase.PENDING:
        # Nothing was routed yet: end without a routing intent.
        check_transition(state.phase, target)
        after = replace(state, phase=target, last_reason=reason, updated_ms=now_ms)
        return Decision(
            kind=kind,
            rule=rule,
            reason=reason,
            at_ms=now_ms,
            before=state,
            after=after,
            command=command,
            note=note,
        )
    return transition(
        state,
        spec,
        now_ms,
        kind,
        rule,
        reason,
        phase=target,
        step_index=state.step_index,
        weight=weight,
        shadow_share=0.0,
        command=command,
        note=note,
    )
