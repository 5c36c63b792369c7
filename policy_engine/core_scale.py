"""PolicyCore's replica controller: signals from the window and QoS, decisions out.

Split from :mod:`graylane.policy_engine.core`; like :mod:`~graylane.policy_engine.core_ops`
each function takes the core. Scaling is off unless the core's
:class:`~graylane.policy_engine.logic.scale.ScalePolicy` allows more than
``min_replicas``. Evaluated per (model, version) with live telemetry in the
window, a QoS policy or a scale state on record; a change is published on
``<p>.control.scale`` and audited (:class:`ScalePublication`, :class:`ScaleAudit`).
A replica's capacity is the core's calibrated figure, else the QoS policy's
calibrated capacity of the running variant (``rung_capacity_rps``) scaled by the
QoS state's contention factor (what it holds in the running stack), else learned.
The running variant is the one that served the window (QoS's active one when the
window mixes variants), and a breach is QoS's or the window's own: right after a
step down QoS's timers restart, while the window still shows the load that made
it step, so an overload the floor cannot carry scales out at the same tick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graylane.policy_engine.logic.contention import effective_capacity
from graylane.policy_engine.logic.qos import QosState, breach_rule
from graylane.policy_engine.logic.scale import (
    ScaleSignals,
    ScaleState,
    evaluate_scale,
    initial_scale_state,
    scale_unsettled,
)
from graylane.policy_engine.logic.window import WindowStats
from graylane.policy_engine.messages import Output, ScaleAudit, ScalePublication
from graylane.rollouts.qos_policy import QosPolicy

if TYPE_CHECKING:
    from graylane.policy_engine.core import PolicyCore

__all__ = ["evaluate_scaling", "restore_scale", "scale_hold"]


def scale_hold(core: PolicyCore, key: tuple[str, str], now_ms: int) -> str:
    """Why (model, version)'s replicas are not settled ("" when they are, or not scaled)."""
    state = core.scale_states.get(key)
    if state is None or not core.scale_policy.enabled:
        return ""
    stats = core.window.stats_by_version(key[0], key[1], now_ms)
    return scale_unsettled(state, core.scale_policy, stats.workers if stats else 0, now_ms)


def restore_scale(
    core: PolicyCore, key: tuple[str, str], desired: int, epoch: int, at_ms: int
) -> None:
    """Take a request read back from the scale topic (the newest epoch wins)."""
    if epoch < core.scale_epochs.get(key, 0):
        return
    core.scale_epochs[key] = epoch
    model, version = key
    core.scale_states[key] = ScaleState(
        model=model, version=version, desired=desired, last_change_ms=at_ms
    )


def _floor_breach(state: QosState, policy: QosPolicy, now_ms: int) -> bool:
    if state.active_variant not in policy.ladder or state.breach_since_ms is None:
        return False
    at_floor = policy.ladder.index(state.active_variant) >= policy.floor_index
    return at_floor and now_ms - state.breach_since_ms >= policy.sustain_s * 1000


def _signals(
    core: PolicyCore, key: tuple[str, str], stats: WindowStats | None, now_ms: int
) -> ScaleSignals:
    model, version = key
    qos_state, qos_policy = core.qos_states.get(key), core.qos_policies.get(key)
    floor_breach = breaching = False
    variant = stats.variant if stats is not None else ""
    floor_capacity: float | None = None
    if qos_state is not None and qos_policy is not None and qos_policy.enabled:
        floor_breach = _floor_breach(qos_state, qos_policy, now_ms)
        # the window's own breach too: a step down clears QoS's timers at once, while
        # the window still shows the load that made it step
        breaching = qos_state.breach_since_ms is not None or (
            stats is not None and breach_rule(stats, qos_policy) is not None
        )
        served_by = stats.variant if stats is not None else ""
        variant = served_by if served_by in qos_policy.ladder else qos_state.active_variant
        floor_variant = qos_policy.ladder[min(qos_policy.floor_index, len(qos_policy.ladder) - 1)]
        floor_capacity = _stack_capacity(qos_policy, qos_state, floor_variant)
    return ScaleSignals(
        model=model,
        version=version,
        floor_breach=floor_breach,
        breaching=breaching,
        throughput_rps=stats.throughput_rps if stats is not None else 0.0,
        offered_rps=max(stats.offered_rps, stats.step_offered_rps) if stats is not None else 0.0,
        floor_capacity_rps=floor_capacity or 0.0,
        lag=stats.lag if stats is not None else 0,
        replicas=stats.workers if stats is not None else 0,
        partitions=core.partitions.get(key, core.default_partitions),
        variant=variant,
        replica_capacity_rps=(
            core.replica_capacity.get((model, version, variant))
            or _stack_capacity(qos_policy, qos_state, variant)
            or 0.0
        ),
    )


def _stack_capacity(policy: QosPolicy | None, state: QosState | None, variant: str) -> float | None:
    """The QoS policy's calibrated capacity of ``variant`` as it holds here, by the QoS
    state's contention (measured on its active variant)."""
    calibrated = policy.capacity_of(variant) if policy is not None else None
    if calibrated is None or policy is None:
        return None
    if state is None:
        return calibrated
    return effective_capacity(
        calibrated, state.contention, policy.capacity_of(state.active_variant)
    )


def evaluate_scaling(core: PolicyCore, now_ms: int) -> list[Output]:
    """One replica decision per scaled version; outputs for the changes."""
    policy = core.scale_policy
    if not policy.enabled:
        return []
    live = core.window.keys()  # a SlidingWindow, not a dict
    keys = {(k.model, k.version) for k in live}
    keys |= set(core.qos_policies) | set(core.scale_states)
    out: list[Output] = []
    for key in sorted(keys):
        stats = core.window.stats_by_version(key[0], key[1], now_ms)
        signals = _signals(core, key, stats, now_ms)
        state = core.scale_states.get(key)
        if state is None:
            state = initial_scale_state(
                key[0], key[1], policy, replicas=signals.replicas, partitions=signals.partitions
            )
        decision = evaluate_scale(state, policy, signals, now_ms)
        core.scale_states[key] = decision.after
        if not decision.changed:
            continue
        epoch = core.scale_epochs.get(key, 0) + 1
        core.scale_epochs[key] = epoch
        out += [
            ScalePublication(decision=decision, epoch=epoch),
            ScaleAudit(decision=decision, epoch=epoch),
        ]
    return out
