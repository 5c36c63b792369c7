"""Revert and cohort routing in the policy engine: one routing update each, rules never erased."""

from __future__ import annotations

import pytest

from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    CommandRejected,
    RolloutAudit,
    RolloutPublication,
    RoutingAudit,
    RoutingPublication,
)
from graylane.policy_engine.wire import command_from_pb, records_of
from graylane.rollouts.spec import RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionRule, ManualCommand, Phase
from graylane.routing.convert import route_config_to_pb, table_from_pb
from graylane.routing.table import (
    InvalidRouteRule,
    RouteConfig,
    RoutingRequest,
    RoutingRule,
    UnknownRouteRule,
    plan_of_table,
    route,
    route_table_for,
    stable_plan,
)
from graylane.serde import decode
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2, control_pb2, rollout_pb2

M = "m"
SPEC = RolloutSpec(
    rollout_id="r1",
    model=M,
    baseline="1.0.0",
    candidate="1.1.0",
    steps=(Step(10.0, 10, 1.0), Step(100.0, 0, 0.0)),
)
INTERNAL = RoutingRule("internal", (("tenant", "internal"),), "1.1.0")
CONFIG = RouteConfig(model=M, rules=(INTERNAL,), allow_pinning=True)


def tables(outs: list[object]) -> list[control_pb2.RoutingTable]:
    found = [o for o in outs if isinstance(o, RoutingPublication)]
    recs = records_of(found, TopicLayout(prefix="t"))  # type: ignore[arg-type]
    return [decode(control_pb2.RoutingTable, r.value) for r in recs]


def set_config(core: PolicyCore, config: RouteConfig, at: int, stable: str = "1.0.0") -> list:
    cmd = Command(
        kind=CommandKind.SET_ROUTE_CONFIG,
        model=M,
        route_config=config,
        target_version=stable,
        command_id="c-cfg",
    )
    return core.on_command(cmd, at)


def revert(core: PolicyCore, target: str, at: int) -> list:
    cmd = Command(kind=CommandKind.REVERT, model=M, target_version=target, command_id="c-rev")
    return core.on_command(cmd, at)


def test_route_config_rules() -> None:
    c = RouteConfig(model=M).with_rule(INTERNAL)
    replaced = c.with_rule(RoutingRule("internal", (("tenant", "beta"),), "1.0.0"))
    assert len(replaced.rules) == 1 and replaced.rules[0].version == "1.0.0"
    assert c.without_rule("internal").rules == ()
    with pytest.raises(UnknownRouteRule):
        c.without_rule("nope")
    for bad in (
        RoutingRule("", (("a", "b"),), "1.0.0"),
        RoutingRule("x", (), "1.0.0"),
        RoutingRule("x", (("a", "b"),), ""),
    ):
        with pytest.raises(InvalidRouteRule):
            c.with_rule(bad)


def test_rules_and_pins_survive_every_table_of_a_rollout() -> None:
    core = PolicyCore()
    first = tables(set_config(core, CONFIG, 1_000))
    assert len(first) == 1 and first[0].stable_version == "1.0.0" and first[0].allow_pinning
    assert [r.name for r in first[0].rules] == ["internal"]
    started = core.on_command(Command(kind=CommandKind.START, model=M, spec=SPEC), 2_000)
    manual = Command(
        kind=CommandKind.MANUAL, model=M, rollout_id="r1", manual=ManualCommand.PROMOTE
    )
    promoted = core.on_command(manual, 3_000)
    published = tables(started) + tables(promoted)
    assert len(published) == 2
    for t in published:
        assert [r.name for r in t.rules] == ["internal"] and t.allow_pinning
    assert published[-1].stable_version == "1.1.0"
    epochs = [t.epoch for t in first + published]
    assert epochs == sorted(epochs) and len(set(epochs)) == 3
    # the router honours the carried rule
    t = table_from_pb(published[0])
    signals = RoutingRequest(request_id="q", routing_key="k", tags={"tenant": "internal"})
    assert route(t, signals).version == "1.1.0"


def test_rule_change_during_a_rollout_keeps_its_weights() -> None:
    core = PolicyCore()
    start = core.on_command(Command(kind=CommandKind.START, model=M, spec=SPEC), 1_000)
    (during,) = tables(set_config(core, CONFIG, 2_000))
    (before,) = tables(start)
    assert during.epoch == before.epoch + 1
    assert [(r.version, r.weight_percent) for r in during.routes] == [
        (r.version, r.weight_percent) for r in before.routes
    ]
    # the rollout's next move outranks the rule change
    manual = Command(kind=CommandKind.MANUAL, model=M, rollout_id="r1", manual=ManualCommand.ABORT)
    (after,) = tables(core.on_command(manual, 3_000))
    assert after.epoch > during.epoch and [r.name for r in after.rules] == ["internal"]


def test_rules_are_restored_from_the_last_table() -> None:
    core = PolicyCore()
    (last,) = tables(set_config(core, CONFIG, 1_000))
    fresh = PolicyCore()
    fresh.restore([], {}, {}, tables={M: table_from_pb(last)})
    out = fresh.on_command(Command(kind=CommandKind.START, model=M, spec=SPEC), 2_000)
    (t,) = tables(out)
    assert t.epoch > last.epoch and [r.name for r in t.rules] == ["internal"]


def test_revert_after_a_promotion_is_one_audited_routing_update() -> None:
    core = PolicyCore()
    core.on_command(Command(kind=CommandKind.START, model=M, spec=SPEC), 1_000)
    manual = Command(
        kind=CommandKind.MANUAL, model=M, rollout_id="r1", manual=ManualCommand.PROMOTE
    )
    (promoted,) = tables(core.on_command(manual, 2_000))
    out = revert(core, "1.0.0", 3_000)
    (t,) = tables(out)
    assert t.stable_version == "1.0.0" and t.epoch == promoted.epoch + 1
    assert [(r.version, r.weight_percent) for r in t.routes] == [("1.0.0", 100.0)]
    (audit,) = [o for o in out if isinstance(o, RoutingAudit)]
    assert audit.rule is DecisionRule.STABLE_REVERTED and "from 1.1.0" in audit.reason
    rec = decode(audit_pb2.AuditRecord, records_of([audit], TopicLayout(prefix="t"))[0].value)
    assert rec.rule == "stable_reverted" and rec.command_id == "c-rev"


def test_revert_during_a_rollout_is_its_rollback() -> None:
    core = PolicyCore()
    core.on_command(Command(kind=CommandKind.START, model=M, spec=SPEC), 1_000)
    assert isinstance(revert(core, "0.9.0", 1_500)[0], CommandRejected)
    out = revert(core, "1.0.0", 2_000)
    (t,) = tables(out)
    assert [(r.version, r.weight_percent) for r in t.routes if r.weight_percent] == [
        ("1.0.0", 100.0)
    ]
    (audit,) = [o for o in out if isinstance(o, RolloutAudit)]
    assert audit.decision.rule is DecisionRule.MANUAL_ROLLBACK
    assert "revert to 1.0.0" in audit.decision.note
    ended = [o for o in out if isinstance(o, RolloutPublication)]
    assert ended[-1].state.phase is Phase.ROLLED_BACK


def test_commands_decode_from_the_wire() -> None:
    pb = rollout_pb2.RolloutCommand(
        kind=rollout_pb2.COMMAND_SET_ROUTE_CONFIG,
        model=M,
        route_config=route_config_to_pb(CONFIG),
        target_version="1.0.0",
    )
    cmd = command_from_pb(pb)
    assert isinstance(cmd, Command) and cmd.route_config == CONFIG
    pb.route_config.rules[0].version = ""
    assert isinstance(command_from_pb(pb), CommandRejected)
    rev = rollout_pb2.RolloutCommand(
        kind=rollout_pb2.COMMAND_REVERT, model=M, target_version="1.0.0"
    )
    cmd = command_from_pb(rev)
    assert isinstance(cmd, Command) and cmd.kind is CommandKind.REVERT


def test_plan_round_trips_through_a_table() -> None:
    plan = stable_plan(M, "1.0.0", 7)
    table = route_table_for(plan, config=CONFIG)
    assert plan_of_table(table) == plan and table.rules == (INTERNAL,)
