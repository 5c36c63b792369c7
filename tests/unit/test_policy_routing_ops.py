"""Revert and cohort routing in the policy engine: one routing update each, rules never erased."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.window import TelemetrySample
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    CommandRejected,
    RolloutAudit,
    RolloutPublication,
    RoutingAudit,
    RoutingPublication,
)
from graylane.policy_engine.state import Routing
from graylane.policy_engine.wire import command_from_pb, records_of
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, ManualCommand, Phase
from graylane.routing.convert import route_config_to_pb, table_from_pb
from graylane.routing.table import (
    InvalidRouteRule,
    RoutingRequest,
    RoutingRule,
    UnknownRouteRule,
    check_rules,
    plan_of_table,
    route,
    route_table_for,
    split_plan,
    stable_plan,
    with_rule,
    without_rule,
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
RULES = (INTERNAL,)


def tables(outs: list[object]) -> list[control_pb2.RoutingTable]:
    found = [o for o in outs if isinstance(o, RoutingPublication)]
    recs = records_of(found, TopicLayout(prefix="t"))  # type: ignore[arg-type]
    return [decode(control_pb2.RoutingTable, r.value) for r in recs]


def set_config(
    core: PolicyCore,
    rules: tuple[RoutingRule, ...],
    at: int,
    stable: str = "1.0.0",
    allow_pinning: bool = True,
) -> list:
    cmd = Command(
        kind=CommandKind.SET_ROUTE_CONFIG,
        model=M,
        rules=rules,
        allow_pinning=allow_pinning,
        target_version=stable,
        command_id="c-cfg",
    )
    return core.on_command(cmd, at)


def revert(core: PolicyCore, target: str, at: int) -> list:
    cmd = Command(kind=CommandKind.REVERT, model=M, target_version=target, command_id="c-rev")
    return core.on_command(cmd, at)


BAD_RULES = (
    RoutingRule("", (("a", "b"),), "1.0.0"),
    RoutingRule("x", (), "1.0.0"),
    RoutingRule("x", (("a", "b"),), ""),
)


def test_route_rules() -> None:
    rules = with_rule((), INTERNAL)
    replaced = with_rule(rules, RoutingRule("internal", (("tenant", "beta"),), "1.0.0"))
    assert len(replaced) == 1 and replaced[0].version == "1.0.0"
    other = RoutingRule("other", (("tenant", "x"),), "1.0.0")
    assert with_rule((*replaced, other), INTERNAL) == (INTERNAL, other)  # in place
    assert without_rule(rules, "internal", model=M) == ()
    with pytest.raises(UnknownRouteRule):
        without_rule(rules, "nope", model=M)
    for bad in BAD_RULES:
        with pytest.raises(InvalidRouteRule):
            with_rule(rules, bad)
    with pytest.raises(InvalidRouteRule, match="repeat"):
        check_rules(M, (INTERNAL, INTERNAL))


def test_plan_rules() -> None:
    plan = stable_plan(M, "1.0.0", 1).with_rule(INTERNAL)
    assert plan.rules == (INTERNAL,) and not plan.allow_pinning
    assert plan.with_pinning(True).allow_pinning
    assert plan.without_rule("internal").rules == ()
    with pytest.raises(UnknownRouteRule):
        plan.without_rule("nope")
    for bad in BAD_RULES:
        with pytest.raises(InvalidRouteRule):
            plan.with_rule(bad)
    with pytest.raises(InvalidRouteRule, match="repeat"):
        plan.with_cohort((INTERNAL, INTERNAL), False)


def test_rules_and_pins_survive_every_table_of_a_rollout() -> None:
    core = PolicyCore()
    first = tables(set_config(core, RULES, 1_000))
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
    (during,) = tables(set_config(core, RULES, 2_000))
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
    (last,) = tables(set_config(core, RULES, 1_000))
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
        route_config=route_config_to_pb(M, RULES, True),
        target_version="1.0.0",
    )
    cmd = command_from_pb(pb)
    assert isinstance(cmd, Command) and cmd.kind is CommandKind.SET_ROUTE_CONFIG
    assert (cmd.rules, cmd.allow_pinning, cmd.target_version) == (RULES, True, "1.0.0")
    other = rollout_pb2.RolloutCommand()
    other.CopyFrom(pb)
    other.route_config.model = "other"
    mismatch = command_from_pb(other)
    assert isinstance(mismatch, CommandRejected) and mismatch.reason == "no route config"
    assert mismatch.command.kind is CommandKind.SET_ROUTE_CONFIG
    pb.route_config.rules[0].version = ""
    assert isinstance(command_from_pb(pb), CommandRejected)
    rev = rollout_pb2.RolloutCommand(
        kind=rollout_pb2.COMMAND_REVERT, model=M, target_version="1.0.0"
    )
    cmd = command_from_pb(rev)
    assert isinstance(cmd, Command) and cmd.kind is CommandKind.REVERT


def test_plan_round_trips_through_a_table() -> None:
    plan = stable_plan(M, "1.0.0", 7).with_cohort(RULES, True)
    table = route_table_for(plan)
    assert table.rules == (INTERNAL,) and table.allow_pinning
    assert plan_of_table(table) == plan


def batch(version: str, at_ms: int) -> TelemetrySample:
    n, latency = 10, LatencyHistogram()
    latency.record(5.0, n)
    return TelemetrySample(
        model=M,
        version=version,
        variant="fp32",
        worker_id=f"w-{version}",
        completed_at_ms=at_ms,
        started_at_ms=at_ms - 5,
        compute_ms=5.0,
        request_count=n,
        error_count=0,
        latency=latency,
    )


def test_every_rollout_step_keeps_the_cohort_rules() -> None:
    """Steps the engine takes on its own (ticks on telemetry) publish the model's rules."""
    core = PolicyCore(window_ms=4000, step_ms=1000)
    set_config(core, RULES, 99_000)
    spec = RolloutSpec(
        rollout_id="r2",
        model=M,
        baseline="1.0.0",
        candidate="1.1.0",
        steps=(Step(10.0, 10, 2.0), Step(50.0, 10, 2.0), Step(100.0, 0, 0.0)),
        gates=Gates(mode=GateMode.FIXED),
    )
    out: list[object] = core.on_command(
        Command(kind=CommandKind.START, model=M, spec=spec), 100_000
    )
    for t in range(100_000, 130_000, 250):
        core.on_telemetry(batch("1.0.0", t))
        core.on_telemetry(batch("1.1.0", t))
        if t % 1000 == 0:
            out.extend(core.tick(t))
    kinds = [o.decision.kind for o in out if isinstance(o, RolloutAudit)]
    assert DecisionKind.ADVANCE in kinds and kinds[-1] is DecisionKind.PROMOTE
    plans = [o.plan for o in out if isinstance(o, RoutingPublication)]
    assert len(plans) >= 3  # the start, at least one step, the promotion
    assert all(p.rules == RULES and p.allow_pinning for p in plans)
    published = tables(out)
    assert all([r.name for r in t.rules] == ["internal"] and t.allow_pinning for t in published)
    assert published[-1].stable_version == "1.1.0"


def test_a_new_split_keeps_the_cohort_and_only_a_cohort_change_sets_it() -> None:
    routing = Routing()
    first = routing.publish(stable_plan(M, "1.0.0", 1).with_cohort(RULES, True))
    assert first.rules == () and not first.allow_pinning  # no table yet: no cohort
    routing.set_plan(stable_plan(M, "1.0.0", 2).with_cohort(RULES, True))
    split = split_plan(
        model=M,
        rollout_id="r",
        stable_version="1.0.0",
        baseline="1.0.0",
        candidate="1.1.0",
        candidate_weight_percent=5.0,
        epoch=3,
    )
    kept = routing.publish(split)
    assert (kept.rules, kept.allow_pinning) == (RULES, True)
    assert kept.with_cohort((), False) == split
    assert routing.plan(M) == kept and routing.epochs.current(M) == 3
    routing.set_plan(replace(kept, epoch=4).with_cohort((), False))
    cleared = routing.publish(replace(split, epoch=5))
    assert cleared.rules == () and not cleared.allow_pinning


def test_clearing_the_rules_publishes_none() -> None:
    core = PolicyCore()
    set_config(core, RULES, 1_000)
    (cleared,) = tables(set_config(core, (), 2_000, allow_pinning=False))
    assert list(cleared.rules) == [] and not cleared.allow_pinning
    (started,) = tables(core.on_command(Command(kind=CommandKind.START, model=M, spec=SPEC), 3_000))
    assert list(started.rules) == [] and not started.allow_pinning


def test_invalid_rules_in_a_command_are_rejected() -> None:
    core = PolicyCore()
    (out,) = set_config(core, (INTERNAL, INTERNAL), 1_000)
    assert isinstance(out, CommandRejected) and "repeat" in out.reason
    assert core.routing.plan(M) is None
