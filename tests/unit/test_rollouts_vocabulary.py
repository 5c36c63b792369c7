"""The one rollout vocabulary and its one protobuf mapping."""

from __future__ import annotations

import pytest

from graylane.rollouts import pb
from graylane.rollouts.spec import Strategy, step_weight_problem
from graylane.rollouts.vocabulary import (
    ACTIVE_PHASES,
    TERMINAL_PHASES,
    DecisionKind,
    DecisionRule,
    ManualCommand,
    Phase,
)
from graylane.v1 import audit_pb2, rollout_pb2


def test_every_phase_maps_both_ways_and_every_wire_phase_is_known() -> None:
    wire = {pb.phase_to_pb(p) for p in Phase}
    assert len(wire) == len(Phase)
    for phase in Phase:
        assert pb.phase_from_pb(pb.phase_to_pb(phase)) is phase
        assert rollout_pb2.RolloutPhase.Name(pb.phase_to_pb(phase)).lower() == phase.value
    known = set(rollout_pb2.RolloutPhase.values()) - {rollout_pb2.ROLLOUT_PHASE_UNSPECIFIED}
    assert wire == known
    assert pb.phase_to_pb(None) == rollout_pb2.ROLLOUT_PHASE_UNSPECIFIED
    assert pb.phase_from_pb(rollout_pb2.ROLLOUT_PHASE_UNSPECIFIED) is None
    assert pb.phase_from_pb(999) is None


def test_terminal_and_active_phases() -> None:
    assert {p for p in Phase if p.finished} == TERMINAL_PHASES
    assert not ACTIVE_PHASES & TERMINAL_PHASES
    assert Phase.PAUSED not in ACTIVE_PHASES | TERMINAL_PHASES


def test_every_manual_command_maps_both_ways() -> None:
    for command in ManualCommand:
        wire = pb.manual_command_to_pb(command)
        assert rollout_pb2.CommandKind.Name(wire) == f"COMMAND_{command.name}"
        assert pb.manual_command_from_pb(wire) is command
    assert pb.manual_command_from_pb(rollout_pb2.COMMAND_START) is None
    assert pb.manual_command_from_pb(rollout_pb2.COMMAND_SET_QOS_POLICY) is None


def test_every_decision_kind_and_strategy_maps_both_ways() -> None:
    for kind in DecisionKind:
        assert pb.decision_kind_from_pb(pb.decision_kind_to_pb(kind)) is kind
    assert len({pb.decision_kind_to_pb(k) for k in DecisionKind}) == len(DecisionKind)
    assert pb.decision_kind_from_pb(audit_pb2.DECISION_PRECISION_CHANGE) is None
    for strategy in Strategy:
        assert pb.strategy_from_pb(pb.strategy_to_pb(strategy)) is strategy
    assert pb.strategy_from_pb(0) is Strategy.CANARY


def test_manual_rules_name_their_command_and_other_rules_none() -> None:
    for command in ManualCommand:
        assert command.rule.command is command
        assert command.rule == f"manual_{command.value}"
    manual = {c.rule for c in ManualCommand}
    assert all(r.command is None for r in DecisionRule if r not in manual)


def test_rules_are_their_wire_strings() -> None:
    for rule in DecisionRule:
        assert pb.decision_rule_from_pb(str(rule)) is rule
        assert audit_pb2.AuditRecord(rule=rule).rule == rule.value
    assert pb.decision_rule_from_pb("no_such_rule") is None


@pytest.mark.parametrize(
    ("weights", "says"),
    [
        ((), None),
        ((1, 5, 25, 50, 100), None),
        ((50,), None),
        ((0, 100), "above 0"),
        ((1, 101), "at most 100"),
        ((float("nan"), 100), "above 0"),
        ((10, 5), "increase strictly"),
        ((5, 5, 100), "increase strictly"),
    ],
)
def test_the_one_step_rule(weights: tuple[float, ...], says: str | None) -> None:
    problem = step_weight_problem(weights)
    if says is None:
        assert problem is None
    else:
        assert problem is not None and says in problem
