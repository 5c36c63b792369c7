"""A refused START ends in a terminal state with its reason; it never blocks the model."""

from __future__ import annotations

from pathlib import Path

from graylane.policy_engine import wire
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    CommandRejected,
    RolloutPublication,
)
from graylane.policy_engine.wire import command_from_pb, records_of
from graylane.rollouts.pb import rollout_spec_to_pb
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import Phase
from graylane.serde import decode
from graylane.services.controlplane.state import open_store
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2, rollout_pb2

FIRST = RolloutSpec(rollout_id="r1", model="m", baseline="1.0.0", candidate="1.1.0")
SECOND = RolloutSpec(rollout_id="r2", model="m", baseline="1.0.0", candidate="1.2.0")


def _start(spec: RolloutSpec) -> Command:
    return Command(kind=CommandKind.START, model="m", rollout_id=spec.rollout_id, spec=spec)


def test_a_refused_start_publishes_its_rollout_as_aborted_with_the_reason() -> None:
    core = PolicyCore()
    core.on_command(_start(FIRST), 1_000)
    out = core.on_command(_start(SECOND), 2_000)
    assert isinstance(out[0], CommandRejected)
    ended = [o for o in out if isinstance(o, RolloutPublication)]
    assert len(ended) == 1 and ended[0].state.rollout_id == "r2"
    assert ended[0].state.phase is Phase.ABORTED
    assert "already has the active rollout r1" in ended[0].state.last_reason
    assert core.rollouts["m"].spec.rollout_id == "r1"  # the active one is untouched
    # the refused id counts as seen: a redelivered START changes nothing
    assert core.on_command(_start(SECOND), 3_000) == []
    # and it restores as finished, not active
    (rec,) = [r for r in records_of(ended, TopicLayout(prefix="t")) if r.topic.endswith("rollouts")]
    state, spec = wire.rollout_state_from_pb(decode(rollout_pb2.RolloutState, rec.value))
    assert state.terminal and spec == SECOND


def test_an_undecodable_start_is_rejected_as_a_start() -> None:
    broken = rollout_pb2.RolloutCommand(kind=rollout_pb2.COMMAND_START, model="m", rollout_id="x")
    got = command_from_pb(broken)
    assert isinstance(got, CommandRejected) and got.command.kind is CommandKind.START


def _pending(store_rollout_id: str) -> tuple[rollout_pb2.RolloutState, rollout_pb2.RolloutCommand]:
    spec = rollout_spec_to_pb(SECOND)
    state = rollout_pb2.RolloutState(
        rollout_id=store_rollout_id, model="m", phase=rollout_pb2.PENDING, spec=spec
    )
    command = rollout_pb2.RolloutCommand(
        command_id="c-start",
        rollout_id=store_rollout_id,
        model="m",
        kind=rollout_pb2.COMMAND_START,
        spec=spec,
        issued_at_unix_ms=1,
    )
    return state, command


def test_the_store_ends_a_pending_row_when_its_start_is_refused(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'cp.db'}")
    state, command = _pending("r2")
    store.create_rollout(state, command)
    assert store.active_rollout("m") is not None
    refused = audit_pb2.AuditRecord(
        decision_id="rejected-c-start",
        decided_at_unix_ms=50,
        model="m",
        rollout_id="r2",
        rule="command_rejected",
        reason="start rejected: rollout 'r2': at least one step is required",
        command_id="c-start",
    )
    # a refused manual command (another command id) leaves the row alone
    other = audit_pb2.AuditRecord()
    other.CopyFrom(refused)
    other.decision_id, other.command_id = "rejected-c-pause", "c-pause"
    store.add_audit([other])
    assert store.active_rollout("m") is not None
    store.add_audit([refused])
    assert store.active_rollout("m") is None
    stored = store.get_rollout("r2")
    assert stored is not None and stored.finished
    assert stored.state.phase == rollout_pb2.ABORTED
    assert "at least one step" in stored.state.last_reason
