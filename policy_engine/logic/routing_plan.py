"""A model's traffic split as the policy engine decides it: per-version weights, shadow.

Only weights and shadow settings are decided here; turning weights into sticky
bucket ranges is the router's business (``graylane.routing``), reached through
:func:`route_table_for`. During a rollout the baseline stays the stable
version and the candidate is the weighted one, so the candidate's bucket range
grows from bucket 0 as its weight rises and a user who reached it stays. After
a promotion the candidate is the stable version and takes every bucket.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from graylane.routing import RouteTable, RoutingRule, table_for_weights
from graylane.routing.cohorts import RouteConfig

__all__ = [
    "RoutingPlan",
    "VersionWeight",
    "plan_of_table",
    "route_table_for",
    "split_plan",
    "stable_plan",
    "weights_for",
]


@dataclass(frozen=True)
class VersionWeight:
    version: str
    weight_percent: float


@dataclass(frozen=True, kw_only=True)
class RoutingPlan:
    """The routing of one model as the policy engine wants it."""

    model: str
    rollout_id: str
    stable_version: str
    weights: tuple[VersionWeight, ...]
    shadow_version: str | None = None
    shadow_share: float = 0.0
    epoch: int = 0

    @property
    def candidate_weight_percent(self) -> float:
        """The weight of a rollout's candidate (the second version of its split), else 0."""
        return self.weights[1].weight_percent if len(self.weights) > 1 else 0.0

    def weight_of(self, version: str) -> float:
        return sum(w.weight_percent for w in self.weights if w.version == version)

    def others(self) -> tuple[tuple[str, float], ...]:
        """Positive weights of the versions other than the stable one (the router's input)."""
        return tuple(
            (w.version, w.weight_percent)
            for w in self.weights
            if w.version != self.stable_version and w.weight_percent > 0.0
        )


def weights_for(
    baseline: str, candidate: str, candidate_percent: float
) -> tuple[VersionWeight, VersionWeight]:
    """``(baseline, 100 - p)`` and ``(candidate, p)``, in that order; zeros are kept."""
    if baseline == candidate:
        raise ValueError(f"baseline and candidate are the same version {baseline!r}")
    if not (math.isfinite(candidate_percent) and 0.0 <= candidate_percent <= 100.0):
        raise ValueError(f"candidate weight {candidate_percent}% is outside 0..100")
    return (
        VersionWeight(baseline, 100.0 - candidate_percent),
        VersionWeight(candidate, candidate_percent),
    )


def split_plan(
    *,
    model: str,
    rollout_id: str,
    stable_version: str,
    baseline: str,
    candidate: str,
    candidate_weight_percent: float,
    shadow_version: str | None = None,
    shadow_share: float = 0.0,
    epoch: int = 0,
) -> RoutingPlan:
    """A rollout's split: ``candidate_weight_percent`` to the candidate, the rest to the
    baseline; a shadow share counts only with a shadow version and the other way round."""
    return RoutingPlan(
        model=model,
        rollout_id=rollout_id,
        stable_version=stable_version,
        weights=weights_for(baseline, candidate, candidate_weight_percent),
        shadow_version=shadow_version if shadow_share > 0.0 else None,
        shadow_share=shadow_share if shadow_version else 0.0,
        epoch=epoch,
    )


def stable_plan(model: str, version: str, epoch: int) -> RoutingPlan:
    """Every request to ``version`` (a revert, or cohort rules before any rollout)."""
    return RoutingPlan(
        model=model,
        rollout_id="",
        stable_version=version,
        weights=(VersionWeight(version, 100.0),),
        epoch=epoch,
    )


def plan_of_table(table: RouteTable) -> RoutingPlan:
    """The weights and shadow settings of a published table (after a restart)."""
    return RoutingPlan(
        model=table.model,
        rollout_id=table.rollout_id,
        stable_version=table.stable_version,
        weights=tuple(VersionWeight(r.version, r.weight_percent) for r in table.routes),
        shadow_version=table.shadow_version,
        shadow_share=table.shadow_share,
        epoch=table.epoch,
    )


def route_table_for(
    plan: RoutingPlan,
    *,
    rules: Sequence[RoutingRule] = (),
    allow_pinning: bool = False,
    reason: str = "",
    config: RouteConfig | None = None,
) -> RouteTable:
    """The router's table for ``plan`` (bucket ranges computed by ``graylane.routing``).

    ``config`` (the model's cohort routing) supplies rules and pinning when given.
    """
    if config is not None:
        rules, allow_pinning = config.rules, config.allow_pinning
    return table_for_weights(
        model=plan.model,
        stable_version=plan.stable_version,
        weights=plan.others(),
        rules=rules,
        shadow_version=plan.shadow_version,
        shadow_share=plan.shadow_share,
        epoch=plan.epoch,
        allow_pinning=allow_pinning,
        rollout_id=plan.rollout_id,
        reason=reason,
    )
