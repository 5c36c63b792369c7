"""The QoS controller: which precision variant a model version runs (pure).

A policy orders variants from quality to throughput (``ladder``, e.g.
``("fp32", "fp16", "int8")``). :func:`evaluate_qos` moves one rung at a time:

- **Breach** (step down, toward throughput): p99 > ``slo * (1 + step_down_margin)``
  (default 1.2 x SLO), or the mean queue wait > ``max_queue_wait_ms`` (when set),
  continuously for ``sustain_s`` (default 5 s).
  Also a breach: more than ``max_shed_fraction`` (2 %) of the arrived requests
  shed by admission control (which keeps the admitted p99 under the SLO).
  A breach at an offered load (served + shed; the window's or, when higher,
  its newest step's: the window's average lags a jump) at or above the active
  rung's capacity in the running stack (calibrated x contention) is an
  overload the measurements already prove: it steps down at once, without
  ``sustain_s`` (every second of waiting sheds or delays the excess).
- **Calm** (step up, toward quality), continuously for ``sustain_s``:
  - when the policy carries the calibrated capacity of the rung above
    (``rung_capacity_rps``): the offered load (served + shed) below
    ``up_capacity_fraction`` (0.7) of it *as it holds in the running stack*
    (calibrated, slowed by the time per request that the smoothed contention
    factor ``QosState.contention`` adds on the active rung:
    the contention factor, :func:`observed_factor` and :func:`effective_capacity`),
    and no breach. The p99 of the
    cheaper rung does not matter: at normal load it may never reach a
    latency threshold, and the capacity says whether the rung above copes.
    Stepping down on latency and up on load at 0.7 x capacity is the
    hysteresis band;
  - else (no calibration): p99 < ``slo * step_up_ratio`` (default 0.6 x SLO)
    and the mean queue wait below ``step_up_ratio x max_queue_wait_ms``.
- **Load ceiling** (hysteresis on load, not only on latency): a cheaper rung
  is of course faster, so its p99 alone would soon look calm and the
  controller would flap between rungs. When a rung breaches, the offered
  load (served + shed) at that moment is remembered as that rung's ceiling;
  stepping back up to it also needs the current offered load at most
  ``up_load_fraction`` (0.8) of its ceiling (served alone would be far too
  low a ceiling when admission control sheds most of the load; and the offered
  load is the window's or, when higher, its newest step's: at a jump the
  window's average still holds the load before it). A ceiling
  is forgotten after ``ceiling_ttl_s`` (600 s), so a breach caused by
  something other than load does not pin the quality down for ever. With a
  calibrated capacity of the breaching rung, a breach at an offered load
  below the step-up band (``up_capacity_fraction`` x its capacity in the
  stack) records no ceiling: that load is one the rung copes with, so the
  breach was not load (a start-up, a noisy neighbour) and the capacity check
  alone gates the way back up.
- **Generations** (a policy with a TTFT and/or TPOT objective,
  :attr:`QosPolicy.generative`): a breach is also the window's TTFT p99 or
  TPOT p99 over its objective x (1 + ``step_down_margin``); whole-request p99
  counts only when ``slo_p99_ms`` is stated (for a generation it is mostly the
  output length). The decode loop's load signals breach too: waiting
  sequences per worker over :func:`waiting_limit` (the queue one worker drains
  within the TTFT objective at the active rung's capacity in the running
  stack: measured capacity, not a constant) and KV-cache occupancy over
  :attr:`QosPolicy.kv_cache_limit`. Without calibration, calm is TTFT, TPOT,
  waiting and KV all under ``step_up_ratio`` of their limits. Every figure is
  reported against the Gateway API Inference Extension's defaults (queue
  depth 5, KV 0.8).
- **Dwell**: no change within ``min_dwell_s`` (default 30 s) of the last one.
- **Bounds**: never below ``quality_floor`` (the lowest-quality rung allowed;
  empty = the ladder's last), never above the first rung.
- **Quality cap** (``max_quality_drop``, :mod:`~graylane.policy_engine.logic.quality_cap`):
  never onto a rung whose measured quality drop exceeds the cap (nor, when the policy
  says so, an unmeasured one): the rung above the first refused one is a floor, held
  under the rule ``quality_cap`` with the refused rung's cost in the reason.
- **Stale input**: stats of a variant other than the active one (the window
  right after a switch) count as no data.
- **No data** (no stats, no requests and no sheds, or stale): HOLD, and *both* sustain
  timers restart: "continuously for sustain_s" needs continuous evidence.
- **Scale settling**: a caller that scales replicas passes ``scale_hold``
  (why the replicas are not settled, :func:`~graylane.policy_engine.logic.scale.scale_unsettled`);
  while it is non-empty a calm rung holds (``scale_unsettled``) instead of
  stepping up, and so does a breach at an offered load below the step-up band
  of the active rung's capacity (``up_capacity_fraction`` x calibrated x
  contention): the partition hand-over of a replica change pauses consumption
  for a moment and sheds what waited, which no precision change would help.
  A breach at a load the rung does not cope with is never held back by it.
- A variant outside the ladder is SET to the first rung, one below the floor
  is SET to the floor, at once (the policy changed under it).

**During a rollout** the candidate is compared like-for-like: the baseline
keeps its own QoS controller and the candidate *follows the baseline's
variant* (:func:`qos_during_rollout`) instead of running its own, so both
sides of every gate run the same precision and a precision change is never
mistaken for a regression (or hides one). When the candidate has no build of
that variant (or it is below the candidate's floor) it stays where it is and
the decision says the comparison is not like-for-like.

**Contention**: how much of its calibrated speed a rung keeps in the running stack.
``graylane calibrate`` measures the engine alone with the whole machine; in the
running stack the worker shares the CPU with the router, the policy engine,
other workers and the clients, so each request takes longer and a rung's real
capacity is lower. The *contention factor* of a window is

    calibrated service time per request / observed service time per request

of the active rung (``1000 / capacity_rps`` vs the window's busy time per
request, :attr:`WindowStats.service_per_request_ms`), bounded to
[``MIN_FACTOR``, ``MAX_FACTOR``] and smoothed over windows (exponentially,
weight ``SMOOTHING`` for the newest). The active rung's capacity here is its
calibrated one x the factor. Another rung's (:func:`effective_capacity` with
``measured_on_rps``) pays the same *time* per request that the factor adds
on the active rung -- the CPU the rest of the stack takes, the per-call costs
of a small batch -- not the same *share*: at low load an int8 rung may run at
half its calibrated speed while fp32, twice as slow, loses only a third. The
load at which QoS steps back up is then one the rung above can serve here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from graylane.policy_engine.logic.quality_cap import CappedFloor, capped_floor
from graylane.policy_engine.logic.window import ALL_VARIANTS, WindowStats
from graylane.rollouts.errors import InputMismatch
from graylane.rollouts.qos_policy import (
    INFERENCE_EXTENSION_KV_CACHE_OCCUPANCY,
    INFERENCE_EXTENSION_QUEUE_DEPTH,
    QosPolicy,
)
from graylane.rollouts.vocabulary import DecisionRule

__all__ = [
    "MAX_FACTOR",
    "MIN_FACTOR",
    "MIN_REQUESTS",
    "SMOOTHING",
    "Ceiling",
    "QosDecision",
    "QosDecisionKind",
    "QosState",
    "breach_rule",
    "effective_capacity",
    "evaluate_qos",
    "initial_qos_state",
    "observed_factor",
    "qos_during_rollout",
    "smoothed_factor",
    "waiting_limit",
]

MIN_FACTOR = 0.05
"""Never believe a rung keeps less than 5 % of its calibrated speed."""
MAX_FACTOR = 1.0
"""The stack never makes the engine faster than calibrated alone."""
SMOOTHING = 0.3
"""Weight of the newest window's factor in the running (exponential) mean."""
MIN_REQUESTS = 5
"""Windows with fewer served requests carry too little evidence to move the factor."""


def observed_factor(stats: WindowStats, calibrated_rps: float | None) -> float | None:
    """This window's factor for the rung it ran; None without the evidence."""
    per_request = stats.service_per_request_ms
    if (
        calibrated_rps is None
        or calibrated_rps <= 0.0
        or stats.requests < MIN_REQUESTS
        or per_request <= 0.0
    ):
        return None
    factor = (1000.0 / calibrated_rps) / per_request
    return min(MAX_FACTOR, max(MIN_FACTOR, factor)) if math.isfinite(factor) else None


def smoothed_factor(previous: float, observed: float | None) -> float:
    """The running factor after one window (unchanged without evidence)."""
    if observed is None:
        return previous
    mixed = SMOOTHING * observed + (1.0 - SMOOTHING) * previous
    return min(MAX_FACTOR, max(MIN_FACTOR, mixed))


def effective_capacity(
    calibrated_rps: float | None, factor: float, measured_on_rps: float | None = None
) -> float | None:
    """A rung's capacity in the running stack (None when unknown).

    ``factor`` was measured on the rung calibrated at ``measured_on_rps`` (default:
    this one, whose capacity is then calibrated x factor). The milliseconds it adds
    to each request there are added to each request of this rung.
    """
    if calibrated_rps is None:
        return None
    if calibrated_rps <= 0.0 or factor <= 0.0:
        return 0.0
    on = measured_on_rps if measured_on_rps is not None and measured_on_rps > 0 else calibrated_rps
    added_ms = (1000.0 / on) * (1.0 / factor - 1.0)
    return 1000.0 / (1000.0 / calibrated_rps + added_ms)


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
    (the contention factor: :func:`observed_factor`, :func:`effective_capacity`); it
    prices every rung's capacity."""

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


def qos_during_rollout(
    candidate: QosState,
    baseline: QosState,
    now_ms: int,
    candidate_policy: QosPolicy | None = None,
) -> QosDecision:
    """The candidate's variant while a rollout of its model runs: the baseline's.

    ``candidate_policy`` (when known) says which variants the candidate has;
    the baseline's own controller keeps running with :func:`evaluate_qos`.
    """
    if candidate.model != baseline.model:
        raise InputMismatch(f"candidate of {candidate.model} with baseline of {baseline.model}")
    target = baseline.active_variant
    cleared = replace(candidate, breach_since_ms=None, calm_since_ms=None)

    def decide(
        kind: QosDecisionKind, rule: DecisionRule, reason: str, after: QosState
    ) -> QosDecision:
        return QosDecision(
            kind=kind, rule=rule, reason=reason, at_ms=now_ms, before=candidate, after=after
        )

    if candidate.active_variant == target:
        return decide(
            QosDecisionKind.HOLD,
            DecisionRule.LIKE_FOR_LIKE,
            f"candidate runs {target} like the baseline",
            cleared,
        )
    if candidate_policy is not None:
        ladder = candidate_policy.ladder
        if target not in ladder or ladder.index(target) > capped_floor(candidate_policy).index:
            return decide(
                QosDecisionKind.HOLD,
                DecisionRule.LIKE_FOR_LIKE_UNAVAILABLE,
                f"baseline runs {target}, which the candidate cannot run; candidate stays on "
                f"{candidate.active_variant}: the comparison is not like-for-like",
                cleared,
            )
    after = replace(cleared, active_variant=target, last_change_ms=now_ms)
    return decide(
        QosDecisionKind.SET,
        DecisionRule.FOLLOW_BASELINE,
        f"{candidate.active_variant} -> {target}: the candidate follows the baseline's variant",
        after,
    )


def evaluate_qos(
    state: QosState,
    policy: QosPolicy,
    stats: WindowStats | None,
    now_ms: int,
    *,
    scale_hold: str = "",
) -> QosDecision:
    """One QoS decision for (model, version) from the window at ``now_ms``.

    ``scale_hold`` non-empty: the replicas are not settled, hold any step up.
    """
    if (state.model, state.version) != (policy.model, policy.version):
        raise InputMismatch(
            f"QoS state of {state.model}/{state.version} with policy of "
            f"{policy.model}/{policy.version}"
        )
    if stats is not None and (stats.model, stats.version) != (policy.model, policy.version):
        raise InputMismatch(
            f"stats of {stats.model}/{stats.version} for {policy.model}/{policy.version}"
        )
    inputs = (stats,) if stats is not None else ()
    pruned = replace(state, ceilings=_live_ceilings(state, policy, now_ms))

    def decide(
        kind: QosDecisionKind, rule: DecisionRule, reason: str, after: QosState
    ) -> QosDecision:
        return QosDecision(
            kind=kind,
            rule=rule,
            reason=reason,
            at_ms=now_ms,
            before=state,
            after=after,
            inputs=inputs,
            scale_hold=scale_hold,
        )

    def hold(rule: DecisionRule, reason: str, after: QosState) -> QosDecision:
        return decide(QosDecisionKind.HOLD, rule, reason, after)

    def move(
        kind: QosDecisionKind, rule: DecisionRule, reason: str, variant: str, base: QosState
    ) -> QosDecision:
        after = replace(
            base,
            active_variant=variant,
            last_change_ms=now_ms,
            breach_since_ms=None,
            calm_since_ms=None,
        )
        return decide(kind, rule, f"{state.active_variant} -> {variant}: {reason}", after)

    cleared = replace(pruned, breach_since_ms=None, calm_since_ms=None)
    if not policy.enabled:
        return hold(DecisionRule.DISABLED, "QoS policy disabled", cleared)
    ladder, active = policy.ladder, state.active_variant
    if active not in ladder:
        return move(
            QosDecisionKind.SET,
            DecisionRule.NOT_IN_LADDER,
            f"{active} is not on the ladder",
            ladder[0],
            cleared,
        )
    capped = capped_floor(policy)
    index, floor = ladder.index(active), capped.index
    if index > floor:
        floor_variant = ladder[floor]
        return move(
            QosDecisionKind.SET,
            _floor_rule(capped),
            f"below the quality floor {floor_variant}{_cap_note(capped)}",
            floor_variant,
            cleared,
        )
    if stats is None or (stats.requests == 0 and stats.shed == 0):
        return hold(DecisionRule.NO_DATA, "no data: sustain timers restart", cleared)
    if stats.variant not in (active, ALL_VARIANTS):
        return hold(
            DecisionRule.STALE_VARIANT, f"stats are of {stats.variant}, {active} is active", cleared
        )

    up_target = ladder[index - 1] if index > 0 else None
    contention = smoothed_factor(
        state.contention, observed_factor(stats, policy.capacity_of(active))
    )
    breach_why = breach_rule(stats, policy, active, contention)
    calm = breach_why is None and _calm(stats, policy, active, up_target, contention)
    breach_since = _since(state.breach_since_ms, now_ms) if breach_why is not None else None
    calm_since = _since(state.calm_since_ms, now_ms) if calm else None
    current = replace(
        pruned, breach_since_ms=breach_since, calm_since_ms=calm_since, contention=contention
    )
    since_change = now_ms - state.last_change_ms
    dwell_ms = policy.min_dwell_s * 1000
    figures = _figures(stats, policy, active, contention)
    if breach_why is not None:
        held = now_ms - _since(breach_since, now_ms)
        own_now = effective_capacity(policy.capacity_of(active), contention)
        offered_now = max(stats.offered_rps, stats.step_offered_rps)
        if (
            scale_hold
            and own_now is not None
            and offered_now < policy.up_capacity_fraction * own_now
        ):
            return hold(
                DecisionRule.SCALE_UNSETTLED,
                f"breach at {offered_now:.1f} rps, below {active}'s capacity "
                f"{own_now:.1f} rps, while the replicas settle ({scale_hold}): "
                f"the hand-over, not the load: {figures}",
                current,
            )
        overloaded = own_now is not None and offered_now >= own_now
        if held < policy.sustain_s * 1000 and not overloaded:
            return hold(
                DecisionRule.SUSTAIN,
                f"breach for {held / 1000:g} s of {policy.sustain_s:g} s: {figures}",
                current,
            )
        if index >= floor:
            return hold(
                _floor_rule(capped),
                f"breach at the quality floor {active}{_cap_note(capped)}: {figures}",
                current,
            )
        if since_change < dwell_ms:
            return hold(
                DecisionRule.MIN_DWELL,
                f"breach, last change {since_change / 1000:g} s ago: {figures}",
                current,
            )
        others = tuple(c for c in current.ceilings if c.variant != active)
        own = effective_capacity(policy.capacity_of(active), contention)
        if own is not None and offered_now < policy.up_capacity_fraction * own:
            # Below the load the rung copes with here: not a load breach, no ceiling.
            note = (
                f"no ceiling: {offered_now:.1f} rps < {policy.up_capacity_fraction:g} x "
                f"{active}'s capacity {own:.1f} rps"
            )
            with_ceiling = replace(current, ceilings=others)
        else:
            note = f"ceiling of {active} at {offered_now:.1f} rps"
            ceiling = Ceiling(active, offered_now, now_ms)
            with_ceiling = replace(current, ceilings=(*others, ceiling))
        return move(
            QosDecisionKind.STEP_DOWN,
            breach_why,
            f"sustained {held / 1000:g} s: {figures}; {note}",
            ladder[index + 1],
            with_ceiling,
        )
    if calm:
        held = now_ms - _since(calm_since, now_ms)
        if held < policy.sustain_s * 1000:
            return hold(
                DecisionRule.SUSTAIN,
                f"calm for {held / 1000:g} s of {policy.sustain_s:g} s: {figures}",
                current,
            )
        if index == 0:
            return hold(DecisionRule.TOP_RUNG, f"calm at the top rung {active}: {figures}", current)
        if since_change < dwell_ms:
            return hold(
                DecisionRule.MIN_DWELL,
                f"calm, last change {since_change / 1000:g} s ago: {figures}",
                current,
            )
        target = ladder[index - 1]
        if scale_hold:
            return hold(
                DecisionRule.SCALE_UNSETTLED,
                f"calm, but the replicas are not settled ({scale_hold}): {figures}",
                current,
            )
        known = current.ceiling_of(target)
        if known is not None and stats.offered_rps > known.throughput_rps * policy.up_load_fraction:
            return hold(
                DecisionRule.LOAD_CEILING,
                f"calm, but {stats.offered_rps:.1f} rps > {policy.up_load_fraction:g} x "
                f"{target}'s ceiling {known.throughput_rps:.1f} rps: {figures}",
                current,
            )
        calibrated = policy.capacity_of(target)
        rule = DecisionRule.GENERATION_CALM if policy.generative else DecisionRule.P99_CALM
        why = figures
        if calibrated is not None:
            rule = DecisionRule.LOAD_CALM
            here = effective_capacity(calibrated, contention, policy.capacity_of(active))
            why = (
                f"offered {stats.offered_rps:.1f} rps < {policy.up_capacity_fraction:g} x "
                f"{target}'s capacity {here or 0.0:.1f} rps here ({calibrated:.1f} "
                f"calibrated, contention {contention:.2f} measured on {active}); {figures}"
            )
        return move(
            QosDecisionKind.STEP_UP, rule, f"sustained {held / 1000:g} s: {why}", target, current
        )
    return hold(DecisionRule.WITHIN_BAND, f"within the band: {figures}", current)


def _floor_rule(capped: CappedFloor) -> DecisionRule:
    return DecisionRule.QUALITY_CAP if capped.by_cap else DecisionRule.QUALITY_FLOOR


def _cap_note(capped: CappedFloor) -> str:
    """`` (q4_0 costs 0.144 > cap 0.050)`` when the cap set the floor."""
    return f" ({capped.refused.describe()})" if capped.refused is not None else ""


def _since(started_ms: int | None, now_ms: int) -> int:
    return now_ms if started_ms is None else started_ms


def _live_ceilings(state: QosState, policy: QosPolicy, now_ms: int) -> tuple[Ceiling, ...]:
    ttl_ms = policy.ceiling_ttl_s * 1000
    return tuple(c for c in state.ceilings if now_ms - c.at_ms < ttl_ms)


def breach_rule(
    stats: WindowStats, policy: QosPolicy, variant: str = "", contention: float = 1.0
) -> DecisionRule | None:
    """The rule that breaches, or None when none does.

    ``variant`` (default: the window's) and ``contention`` price the rung's capacity
    for the waiting-sequences limit of a generative policy (:func:`waiting_limit`).
    """
    margin = 1.0 + policy.step_down_margin
    if policy.slo_p99_ms > 0.0 and stats.p99_ms > policy.down_threshold_ms:
        return DecisionRule.P99_BREACH
    gen = stats.generation if policy.generative else None
    if gen is not None:
        if policy.slo_ttft_p99_ms > 0.0 and gen.ttft_p99_ms > policy.slo_ttft_p99_ms * margin:
            return DecisionRule.TTFT_BREACH
        if policy.slo_tpot_p99_ms > 0.0 and gen.tpot_p99_ms > policy.slo_tpot_p99_ms * margin:
            return DecisionRule.TPOT_BREACH
    if policy.max_queue_wait_ms > 0.0 and stats.queue_wait_mean_ms > policy.max_queue_wait_ms:
        return DecisionRule.QUEUE_WAIT_BREACH
    if stats.shed and stats.shed_fraction > policy.max_shed_fraction:
        return DecisionRule.SHED_BREACH
    if gen is not None:
        if gen.waiting_sequences / max(stats.workers, 1) > waiting_limit(
            policy, variant or stats.variant, contention
        ):
            return DecisionRule.WAITING_BREACH
        if gen.kv_cache_occupancy > policy.kv_cache_limit:
            return DecisionRule.KV_CACHE_BREACH
    return None


def waiting_limit(policy: QosPolicy, variant: str, contention: float = 1.0) -> float:
    """Waiting sequences per worker that breach on ``variant``.

    ``max_waiting_sequences`` when set; else, with a TTFT objective and a calibrated
    capacity (generations/s of one worker), the sequences that worker drains within
    the objective at its capacity in the running stack (``contention``): a sequence
    that waits behind them gets its first token late. At least one. Otherwise the
    Inference Extension's default queue depth.
    """
    if policy.max_waiting_sequences > 0.0:
        return policy.max_waiting_sequences
    capacity = effective_capacity(policy.capacity_of(variant), contention)
    if policy.slo_ttft_p99_ms > 0.0 and capacity:
        return max(1.0, capacity * policy.slo_ttft_p99_ms / 1000.0)
    return float(INFERENCE_EXTENSION_QUEUE_DEPTH)


def _calm(
    stats: WindowStats, policy: QosPolicy, active: str, target: str | None, contention: float
) -> bool:
    """Calm toward ``target`` (the rung above; None at the top: latency only); a
    calibrated capacity counts as it holds here (``contention`` measured on ``active``)."""
    calibrated = policy.capacity_of(target) if target is not None else None
    capacity = effective_capacity(calibrated, contention, policy.capacity_of(active))
    if capacity is not None:
        return stats.offered_rps < policy.up_capacity_fraction * capacity
    ratio = policy.step_up_ratio
    queue_ok = (
        policy.max_queue_wait_ms <= 0.0
        or stats.queue_wait_mean_ms < policy.max_queue_wait_ms * ratio
    )
    p99_ok = policy.slo_p99_ms <= 0.0 or stats.p99_ms < policy.up_threshold_ms
    if not policy.generative:
        return p99_ok and queue_ok
    gen = stats.generation
    if gen is None:
        return False  # no generation figures: no evidence the rung above copes
    return (
        p99_ok
        and queue_ok
        and (policy.slo_ttft_p99_ms <= 0.0 or gen.ttft_p99_ms < policy.slo_ttft_p99_ms * ratio)
        and (policy.slo_tpot_p99_ms <= 0.0 or gen.tpot_p99_ms < policy.slo_tpot_p99_ms * ratio)
        and gen.waiting_sequences / max(stats.workers, 1)
        <= ratio * waiting_limit(policy, active, contention)
        and gen.kv_cache_occupancy < ratio * policy.kv_cache_limit
    )


def _figures(stats: WindowStats, policy: QosPolicy, active: str, contention: float) -> str:
    if policy.slo_p99_ms > 0.0:
        text = (
            f"p99 {stats.p99_ms:.1f} ms (SLO {policy.slo_p99_ms:g}, "
            f"down > {policy.down_threshold_ms:g}, "
            f"up < {policy.up_threshold_ms:g}), {stats.throughput_rps:.1f} rps served"
        )
    else:
        text = f"p99 {stats.p99_ms:.1f} ms (not judged), {stats.throughput_rps:.1f} rps served"
    gen = stats.generation if policy.generative else None
    if policy.generative and gen is None:
        text += ", no generation figures"
    if gen is not None:
        margin = 1.0 + policy.step_down_margin
        for name, value, slo in (
            ("TTFT", gen.ttft_p99_ms, policy.slo_ttft_p99_ms),
            ("TPOT", gen.tpot_p99_ms, policy.slo_tpot_p99_ms),
        ):
            if slo > 0.0:
                text += f", {name} p99 {value:.1f} ms (SLO {slo:g}, down > {slo * margin:g})"
        per_worker = gen.waiting_sequences / max(stats.workers, 1)
        text += (
            f", waiting {per_worker:.1f}/worker (limit "
            f"{waiting_limit(policy, active, contention):.1f}; Inference Extension "
            f"{INFERENCE_EXTENSION_QUEUE_DEPTH}), KV {gen.kv_cache_occupancy:.2f} (limit "
            f"{policy.kv_cache_limit:g}; Inference Extension "
            f"{INFERENCE_EXTENSION_KV_CACHE_OCCUPANCY:g})"
        )
    if stats.shed:
        text += f", shed {stats.shed_fraction:.1%} (max {policy.max_shed_fraction:.1%})"
    if policy.max_queue_wait_ms > 0.0:
        text += f", queue wait {stats.queue_wait_mean_ms:.1f} ms (max {policy.max_queue_wait_ms:g})"
    return text
