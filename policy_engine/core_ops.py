"""PolicyCore's operator routing commands and precision acknowledgements.

Split from :mod:`graylane.policy_engine.core` to keep it short; each function
takes the core and returns the outputs to publish, like the core's methods.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from graylane.policy_engine.logic.precision_ack import AckVerdict, judge_switch
from graylane.policy_engine.logic.routing_plan import RoutingPlan, stable_plan
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    CommandRejected,
    Output,
    PrecisionAck,
    RoutingAudit,
    RoutingPublication,
)
from graylane.rollouts.vocabulary import DecisionRule, ManualCommand

if TYPE_CHECKING:
    from graylane.policy_engine.core import PolicyCore

__all__ = ["check_acks", "revert", "set_route_config"]


def revert(core: PolicyCore, cmd: Command, now_ms: int) -> list[Output]:
    """Route 100 % to ``cmd.target_version`` in one routing update.

    During a rollout that is its rollback (the baseline is the stable
    version), recorded as a manual rollback with the operator's note.
    """
    target = cmd.target_version
    if not target:
        return [CommandRejected(command=cmd, reason="revert names no version", at_ms=now_ms)]
    active = core.rollouts.get(cmd.model)
    if active is not None:
        if target != active.spec.baseline:
            reason = (
                f"rollout {active.spec.rollout_id} is active: a revert returns to its "
                f"baseline {active.spec.baseline}, not {target}"
            )
            return [CommandRejected(command=cmd, reason=reason, at_ms=now_ms)]
        note = f"revert to {target}" + (f": {cmd.note}" if cmd.note else "")
        rollback = replace(
            cmd,
            kind=CommandKind.MANUAL,
            manual=ManualCommand.ROLLBACK,
            rollout_id=active.spec.rollout_id,
            note=note,
        )
        return core._manual(rollback, now_ms)
    last = core.plans.get(cmd.model)
    was = f" from {last.stable_version}" if last is not None else ""
    reason = f"reverted {cmd.model} to {target}{was}: 100% to {target}"
    if cmd.note:
        reason += f" ({cmd.note})"
    plan = stable_plan(cmd.model, target, core.routing_epochs.get(cmd.model, 0) + 1)
    return routing_change(core, cmd, plan, DecisionRule.STABLE_REVERTED, reason, now_ms)


def set_route_config(core: PolicyCore, cmd: Command, now_ms: int) -> list[Output]:
    """Take the model's cohort rules and republish its current table with them."""
    config = cmd.route_config
    if config is None or config.model != cmd.model:
        return [CommandRejected(command=cmd, reason="no route config", at_ms=now_ms)]
    last = core.plans.get(cmd.model)
    if last is None and not cmd.target_version:
        reason = f"{cmd.model} has no routing table yet and the command names no stable version"
        return [CommandRejected(command=cmd, reason=reason, at_ms=now_ms)]
    core.route_configs[cmd.model] = config
    epoch = core.routing_epochs.get(cmd.model, 0) + 1
    plan = (
        replace(last, epoch=epoch)
        if last is not None
        else stable_plan(cmd.model, cmd.target_version, epoch)
    )
    rules = ", ".join(
        f"{r.name}: {','.join(f'{k}={v}' for k, v in r.match_tags)} -> {r.version}"
        for r in config.rules
    )
    reason = (
        f"cohort routing of {cmd.model}: rules [{rules or 'none'}], "
        f"pins {'allowed' if config.allow_pinning else 'refused'}"
    )
    return routing_change(core, cmd, plan, DecisionRule.ROUTE_CONFIG_SET, reason, now_ms)


def routing_change(
    core: PolicyCore, cmd: Command, plan: RoutingPlan, rule: DecisionRule, reason: str, now_ms: int
) -> list[Output]:
    core.note_routing_epoch(plan.model, plan.epoch)
    core.plans[plan.model] = plan
    return [
        RoutingPublication(
            plan=plan, reason=reason, at_ms=now_ms, config=core.route_configs.get(plan.model)
        ),
        RoutingAudit(
            model=plan.model,
            version=plan.stable_version,
            rule=rule,
            reason=reason,
            epoch=plan.epoch,
            at_ms=now_ms,
            command_id=cmd.command_id,
            actor=cmd.issued_by,
        ),
    ]


def check_acks(core: PolicyCore, now_ms: int) -> list[Output]:
    """Confirm switches the workers followed; audit ``precision_refused`` for the others.

    A refused switch puts the QoS state back on the variant actually served,
    so the controller no longer believes in a switch that did not happen.
    """
    out: list[Output] = []
    for key in sorted(core.pending_switches):
        switch = core.pending_switches[key]
        served = core.served_at.get(key, {})
        verdict, variant = judge_switch(switch, served, now_ms, core.ack_bound_ms)
        if verdict is AckVerdict.PENDING:
            continue
        del core.pending_switches[key]
        model, version = key
        if verdict is AckVerdict.CONFIRMED:
            rule = DecisionRule.PRECISION_CONFIRMED
            reason = f"{model} {version} serves {variant} (switch at epoch {switch.epoch})"
        else:
            rule = DecisionRule.PRECISION_REFUSED
            reason = (
                f"{model} {version} did not follow the switch to {switch.variant} within "
                f"{core.ack_bound_ms / 1000:g} s; its workers still serve {variant}"
            )
            state = core.qos_states.get(key)
            if state is not None:
                core.qos_states[key] = replace(state, active_variant=variant)
        out.append(
            PrecisionAck(
                model=model,
                version=version,
                variant=switch.variant,
                served=variant,
                rule=rule,
                reason=reason,
                epoch=switch.epoch,
                at_ms=now_ms,
            )
        )
    return out
