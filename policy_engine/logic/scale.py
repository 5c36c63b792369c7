"""Scale-out as a decision: how many worker replicas a model version should run (pure).

:func:`evaluate_scale` moves the desired replica count one step at a time:

- **Scale out (+1)** when QoS runs the quality floor and still breaches its
  SLO (the QoS controller's breach held for its sustain time:
  :attr:`ScaleSignals.floor_breach`); at once, without waiting for the ladder
  to reach its floor, when QoS breaches at an *overload* the floor cannot
  carry either (:func:`overload_beyond_floor`: the offered load is past the
  running rung's capacity, and past ``out_load_fraction`` of what the replicas
  would serve at the floor, counting the path's measured per-request
  overhead); or when the version's consumer lag
  kept growing for ``lag_growth_s`` (each evaluation's lag at least the
  previous one, and above where the growth started by ``min_lag_growth``).
  For a generative model the backlog is the lag *plus* the sequences waiting
  in the workers' decode loops (:attr:`ScaleSignals.backlog`): a worker takes
  records off its topic into its waiting list, so the lag alone stays low
  while the queue grows there.
  Bounded by ``max_replicas`` and the version topic's partition count (a
  consumer beyond the partitions would sit idle). No second step while the
  replicas asked for are not all serving yet, nor within ``out_dwell_s`` of
  the last change (a new worker needs time to warm up and join).
- **Scale in (-1)** after a cooldown of sustained low load: the throughput
  below ``in_load_fraction`` (0.5) of what one replica fewer can serve, with
  no breach, continuously for ``cooldown_s`` and at least ``cooldown_s``
  after the last change. A replica's capacity is the caller's (calibrated,
  :attr:`ScaleSignals.replica_capacity_rps`) or else the one learned while
  the version last was saturated (throughput / replicas while QoS breached
  or the lag grew, for the variant then running); unknown capacity never
  scales in, nor do sequences waiting for a decode row (one replica fewer
  would only lengthen that queue).
- QoS's breach (:attr:`ScaleSignals.breaching`) of a generative policy
  includes its TTFT/TPOT objectives and the waiting-sequences and KV-cache
  limits, so the floor breach and the overload follow those too.
- **Settled** (:func:`scale_unsettled`): every replica asked for serves and
  the last change is ``settle_s`` old. The QoS ladder steps back up only
  then (``evaluate_qos(..., scale_hold=...)``), so quality does not rise
  on capacity that has not arrived (or is about to leave).

Every decision is a function of (state, policy, signals, ``now_ms``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from graylane.rollouts.errors import InputMismatch, InvalidPolicy
from graylane.rollouts.vocabulary import DecisionRule

__all__ = [
    "LearnedCapacity",
    "ScaleDecision",
    "ScaleDecisionKind",
    "ScalePolicy",
    "ScaleReason",
    "ScaleSignals",
    "ScaleState",
    "evaluate_scale",
    "initial_scale_state",
    "overload_beyond_floor",
    "scale_unsettled",
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
    waiting_sequences: int = 0
    """Generations waiting for a decode row, summed over the workers (0 = none, or
    not a generative model)."""
    kv_cache_occupancy: float = 0.0
    """Mean KV-cache occupancy of the workers (0..1; reported, not a trigger here:
    QoS's breach carries its limit)."""

    @property
    def backlog(self) -> int:
        """Requests not being served yet: the topic's lag and the decode loops' waiting."""
        return self.lag + self.waiting_sequences


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


def overload_beyond_floor(signals: ScaleSignals, fraction: float) -> str | None:
    """Why the load needs another replica even at the quality floor; None if it does not.

    Only while QoS breaches at an offered load past the running rung's calibrated
    capacity (a load breach, proven by the measurements). The floor's capacity per
    replica in the stack is its engine time plus the path's per-request overhead
    (router, broker, client: what the calibrated engine figure leaves out), measured
    now as the served requests' time per replica minus the running rung's engine
    time. While the load is still rising the window's throughput lags it, so the
    overhead reads high and the floor low: an overload scales out early, never late.
    """
    replicas = max(signals.replicas, 1)
    engine, floor = signals.replica_capacity_rps, signals.floor_capacity_rps
    if not signals.breaching or engine <= 0.0 or floor <= 0.0:
        return None
    if signals.offered_rps < replicas * engine:
        return None
    served = signals.throughput_rps / replicas
    overhead_ms = max(0.0, 1000.0 / served - 1000.0 / engine) if served > 0 else 0.0
    at_floor = 1000.0 / (1000.0 / floor + overhead_ms)
    if signals.offered_rps <= fraction * replicas * at_floor:
        return None
    return (
        f"overload: offered {signals.offered_rps:.1f} rps > {replicas} x {engine:.1f} rps "
        f"running, and > {fraction:g} x {replicas} x {at_floor:.1f} rps at the floor "
        f"({floor:.1f} rps engine + {overhead_ms:.1f} ms path per request)"
    )


def scale_unsettled(state: ScaleState, policy: ScalePolicy, replicas: int, now_ms: int) -> str:
    """Why the scale is not settled yet ("" when it is): the QoS step-up waits on it.

    Not settled while the replicas serving differ from those asked for: fewer (a
    new one not serving yet) or more (one leaving: its partitions change hands)."""
    if replicas and replicas < state.desired:
        return f"{state.desired} replicas asked for, {replicas} serving"
    if replicas > state.desired:
        return f"{state.desired} replicas asked for, {replicas} still serving: one is leaving"
    since = now_ms - state.last_change_ms
    if state.last_change_ms and since < policy.settle_s * 1000:
        return f"replicas changed {since / 1000:g} s ago (settle {policy.settle_s:g} s)"
    return ""


def evaluate_scale(
    state: ScaleState, policy: ScalePolicy, signals: ScaleSignals, now_ms: int
) -> ScaleDecision:
    """One replica decision for (model, version) at ``now_ms``."""
    if (signals.model, signals.version) != (state.model, state.version):
        raise InputMismatch(
            f"signals of {signals.model}/{signals.version} for {state.model}/{state.version}"
        )
    lag_since, lag_at = _lag_tracking(state, signals, policy, now_ms)
    lag_held_ms = now_ms - lag_since if lag_since is not None else 0
    lag_growing = (
        lag_since is not None
        and lag_held_ms >= policy.lag_growth_s * 1000
        and signals.backlog - lag_at >= max(policy.min_lag_growth, 1)
    )
    capacity = _capacity(state, signals)
    low_since = _low_tracking(state, policy, signals, capacity, lag_growing, now_ms)
    saturated = signals.breaching or signals.floor_breach or lag_growing
    current = replace(
        state,
        lag_since_ms=lag_since,
        lag_at_since=lag_at,
        last_lag=signals.backlog,
        low_since_ms=low_since,
        capacities=_learn(state.capacities, signals, signals.replicas or state.desired, now_ms)
        if saturated
        else state.capacities,
    )
    since_change = now_ms - state.last_change_ms if state.last_change_ms else None
    figures = _figures(signals, state.desired, capacity)

    def decide(
        kind: ScaleDecisionKind,
        rule: DecisionRule,
        detail: str,
        after: ScaleState,
        reason: ScaleReason | None = None,
    ) -> ScaleDecision:
        return ScaleDecision(
            kind=kind,
            rule=rule,
            reason=reason,
            detail=detail,
            at_ms=now_ms,
            before=state,
            after=after,
            signals=signals,
        )

    if not policy.enabled:
        return decide(ScaleDecisionKind.HOLD, DecisionRule.DISABLED, "scaling disabled", current)
    wants_out: ScaleReason | None = None
    overload = overload_beyond_floor(signals, policy.out_load_fraction)
    if signals.floor_breach:
        wants_out, why = ScaleReason.FLOOR_BREACH, "breach at the quality floor"
    elif overload is not None:
        wants_out, why = ScaleReason.OVERLOAD, overload
    elif lag_growing:
        wants_out = ScaleReason.LAG_GROWING
        what = "lag + waiting" if signals.waiting_sequences else "lag"
        why = f"{what} grew {lag_at} -> {signals.backlog} over {lag_held_ms / 1000:g} s"
    if wants_out is not None:
        bound = policy.bound(signals.partitions)
        if state.desired >= bound:
            return decide(
                ScaleDecisionKind.HOLD,
                DecisionRule.SCALE_AT_MAX,
                f"{why}, but at the most replicas {bound} (max {policy.max_replicas}, "
                f"partitions {signals.partitions or '?'}): {figures}",
                current,
            )
        if signals.replicas and signals.replicas < state.desired:
            return decide(
                ScaleDecisionKind.HOLD,
                DecisionRule.SCALE_PENDING,
                f"{why}; waiting for the replicas asked for: {figures}",
                current,
            )
        if since_change is not None and since_change < policy.out_dwell_s * 1000:
            return decide(
                ScaleDecisionKind.HOLD,
                DecisionRule.MIN_DWELL,
                f"{why}, last change {since_change / 1000:g} s ago: {figures}",
                current,
            )
        after = replace(
            current,
            desired=state.desired + 1,
            last_change_ms=now_ms,
            lag_since_ms=None,
            lag_at_since=0,
            low_since_ms=None,
        )
        return decide(
            ScaleDecisionKind.SCALE_OUT,
            wants_out.rule,
            f"{state.desired} -> {state.desired + 1} replicas: {why}: {figures}",
            after,
            wants_out,
        )
    if low_since is not None:
        held = now_ms - low_since
        cooldown_ms = policy.cooldown_s * 1000
        waited = since_change is None or since_change >= cooldown_ms
        if held >= cooldown_ms and waited:
            after = replace(current, desired=state.desired - 1, last_change_ms=now_ms)
            after = replace(after, low_since_ms=None, lag_since_ms=None, lag_at_since=0)
            return decide(
                ScaleDecisionKind.SCALE_IN,
                DecisionRule.SCALE_LOW_LOAD,
                f"{state.desired} -> {state.desired - 1} replicas: low load for "
                f"{held / 1000:g} s: {figures}",
                after,
                ScaleReason.LOW_LOAD,
            )
        return decide(
            ScaleDecisionKind.HOLD,
            DecisionRule.SUSTAIN,
            f"low load for {held / 1000:g} s of the {policy.cooldown_s:g} s cooldown: {figures}",
            current,
        )
    return decide(ScaleDecisionKind.HOLD, DecisionRule.WITHIN_BAND, figures, current)


def _lag_tracking(
    state: ScaleState, signals: ScaleSignals, policy: ScalePolicy, now_ms: int
) -> tuple[int | None, int]:
    """(since when the backlog has not fallen, the backlog then); None when it fell or is
    zero."""
    backlog = signals.backlog
    if backlog <= 0 or (state.lag_since_ms is not None and backlog < state.last_lag):
        return None, 0
    if state.lag_since_ms is None:
        return now_ms, backlog
    return state.lag_since_ms, state.lag_at_since


def _capacity(state: ScaleState, signals: ScaleSignals) -> float:
    """Requests/s of one replica on the running variant; 0 when unknown."""
    if signals.replica_capacity_rps > 0:
        return signals.replica_capacity_rps
    known = state.capacity_of(signals.variant)
    return known.rps if known is not None else 0.0


def _low_tracking(
    state: ScaleState,
    policy: ScalePolicy,
    signals: ScaleSignals,
    capacity: float,
    lag_growing: bool,
    now_ms: int,
) -> int | None:
    fewer = state.desired - 1
    low = (
        fewer >= policy.min_replicas
        and capacity > 0.0
        and not (signals.breaching or signals.floor_breach or lag_growing)
        and signals.waiting_sequences == 0
        and signals.throughput_rps < policy.in_load_fraction * fewer * capacity
    )
    if not low:
        return None
    return now_ms if state.low_since_ms is None else state.low_since_ms


def _learn(
    known: tuple[LearnedCapacity, ...], signals: ScaleSignals, serving: int, now_ms: int
) -> tuple[LearnedCapacity, ...]:
    if not signals.variant or signals.throughput_rps <= 0.0 or serving <= 0:
        return known
    fresh = LearnedCapacity(signals.variant, signals.throughput_rps / serving, now_ms)
    return (*(c for c in known if c.variant != signals.variant), fresh)


def _figures(signals: ScaleSignals, desired: int, capacity: float) -> str:
    cap = f"{capacity:.1f} rps/replica" if capacity > 0 else "capacity unknown"
    return (
        f"{desired} desired, {signals.replicas or '?'} serving, "
        f"{signals.throughput_rps:.1f} rps on {signals.variant or '?'} ({cap}), lag {signals.lag}"
    ) + (
        f", waiting {signals.waiting_sequences}, KV {signals.kv_cache_occupancy:.2f}"
        if signals.waiting_sequences or signals.kv_cache_occupancy
        else ""
    )
