"""Routing plan: weights and shadow settings from a rollout's routing intent."""

from __future__ import annotations

import pytest

from graylane.policy_engine.logic.rollout import apply_command, start
from graylane.rollouts.spec import RolloutSpec, Strategy
from graylane.rollouts.vocabulary import ManualCommand
from graylane.routing.table import (
    BUCKETS,
    VersionWeight,
    route_table_for,
    split_plan,
    weights_for,
)

SPEC = RolloutSpec(rollout_id="r", model="m", baseline="v1", candidate="v2")


def test_weights_for() -> None:
    assert weights_for("v1", "v2", 5.0) == (VersionWeight("v1", 95.0), VersionWeight("v2", 5.0))
    assert weights_for("v1", "v2", 0.0)[1].weight_percent == 0.0
    with pytest.raises(ValueError):
        weights_for("v1", "v2", 101.0)
    with pytest.raises(ValueError):
        weights_for("v1", "v1", 5.0)


def test_canary_plan_and_router_table() -> None:
    d = start(SPEC, 0, epoch=3)
    assert d.routing is not None
    plan = d.routing
    assert plan.stable_version == "v1" and plan.epoch == 4
    assert plan.weight_of("v2") == 1.0 and plan.others() == (("v2", 1.0),)
    table = route_table_for(plan, reason=d.reason)
    assert table.weight_of("v2") == 1.0 and table.weight_of("v1") == 99.0
    assert table.epoch == 4 and table.rollout_id == "r"
    v2 = next(r for r in table.routes if r.version == "v2")
    assert v2.ranges[0].start == 0 and v2.ranges[0].end == BUCKETS // 100


def test_shadow_plan() -> None:
    d = start(
        RolloutSpec(
            rollout_id="r",
            model="m",
            baseline="v1",
            candidate="v2",
            strategy=Strategy.SHADOW_THEN_CANARY,
            shadow_share=0.25,
        ),
        0,
    )
    assert d.routing is not None
    plan = d.routing
    assert (plan.shadow_version, plan.shadow_share) == ("v2", 0.25)
    assert plan.others() == ()
    table = route_table_for(plan)
    assert table.shadow_version == "v2" and table.weight_of("v1") == 100.0


def test_promoted_and_rolled_back_plans() -> None:
    running = start(SPEC, 0).after
    promoted = apply_command(running, SPEC, ManualCommand.PROMOTE, 1).routing
    assert promoted is not None
    plan = promoted
    assert plan.stable_version == "v2" and plan.others() == ()
    assert route_table_for(plan).weight_of("v2") == 100.0
    rolled = apply_command(running, SPEC, ManualCommand.ROLLBACK, 1).routing
    assert rolled is not None
    assert route_table_for(rolled).weight_of("v1") == 100.0


def test_shadow_share_without_version_is_dropped() -> None:
    intent = split_plan(
        model="m",
        rollout_id="r",
        stable_version="v1",
        baseline="v1",
        candidate="v2",
        candidate_weight_percent=5.0,
        shadow_share=0.3,
    )
    assert intent.shadow_share == 0.0
