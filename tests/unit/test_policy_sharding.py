"""Sharding the policy engine by model: the partitioner, the ownership generations and
the epochs a new owner writes, the state restored per partition."""

from __future__ import annotations

import asyncio
import os

import pytest
from aiokafka.partitioner import DefaultPartitioner, murmur2

from graylane.policy_engine import logic
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.rollout import pending_state
from graylane.policy_engine.logic.shards import (
    GENERATION_SHIFT,
    ShardOwnership,
    epoch_floor,
    keeps_state,
    partition_of,
)
from graylane.policy_engine.logic.shards import murmur2 as our_murmur2
from graylane.policy_engine.messages import Command, CommandKind, RoutingPublication
from graylane.policy_engine.shards import FencedEpochs, ShardMap, restrict
from graylane.policy_engine.state import VersionKey
from graylane.policy_engine.wire import Restored, running_build_of
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec

BUILD = running_build_of(version="1", git_sha="abc", build_time="", instance="policy-0")


def test_murmur2_is_kafkas() -> None:
    samples = [b"", b"a", b"ab", b"abc", b"gpt", "modèle".encode()]
    samples += [os.urandom(n) for n in range(1, 33) for _ in range(5)]
    for data in samples:
        assert our_murmur2(data) == murmur2(data), data


@pytest.mark.parametrize("partitions", [1, 3, 6, 12])
def test_a_models_partition_is_the_one_its_records_are_produced_to(partitions: int) -> None:
    every = list(range(partitions))
    for i in range(50):
        model = f"model-{i}"
        produced = DefaultPartitioner()(model.encode(), every, every)
        assert partition_of(model, partitions) == produced
    with pytest.raises(ValueError):
        partition_of("gpt", 0)


def test_a_later_generation_writes_above_every_epoch_of_an_earlier_one() -> None:
    assert epoch_floor(0) == 0
    assert epoch_floor(3) == 3 << GENERATION_SHIFT
    assert epoch_floor(4) > epoch_floor(3) + 1_000_000
    assert ShardOwnership(2, 5, "policy-1").floor == epoch_floor(5)
    with pytest.raises(ValueError):
        epoch_floor(-1)


def test_state_is_kept_only_from_the_generation_just_before() -> None:
    assert keeps_state(4, 5)
    assert not keeps_state(None, 5)  # the first assignment: restore
    assert not keeps_state(4, 7)  # generations missed: another may have owned it
    assert not keeps_state(5, 5)


def test_fenced_epochs_start_above_the_floor_and_still_take_what_was_read_back() -> None:
    floor = epoch_floor(2)
    epochs: FencedEpochs[str] = FencedEpochs(floor)
    assert epochs.note("gpt", 7)  # read back from an earlier owner: noted, lower than floor
    assert epochs["gpt"] == 7
    assert epochs.current("gpt") == floor
    assert epochs.next("gpt") == floor + 1
    assert epochs.next("bert") == floor + 1  # a model never routed before
    assert not epochs.note("gpt", 9)  # an older owner's late record is not the newest
    assert epochs.note("gpt", floor + 5)
    assert epochs.next("gpt") == floor + 6


def test_a_new_owners_first_routing_table_outranks_the_previous_owners() -> None:
    shards = ShardMap(PolicyCore, BUILD, sharded=True)
    shards.partitions = 1
    _, (shard,) = shards.reassign([0], generation=3)
    core = shard.core
    core.restore(routing_epochs={"gpt": 41})
    cmd = Command(
        kind=CommandKind.REVERT,
        model="gpt",
        rollout_id="",
        command_id="c1",
        issued_by="op",
        target_version="1.0.0",
    )
    tables = [o for o in core.on_command(cmd, 1_000) if isinstance(o, RoutingPublication)]
    assert [t.plan.epoch for t in tables] == [epoch_floor(3) + 1]
    assert shard.decided_by.generation == 3 and shard.decided_by.partition == 0
    assert shard.decided_by.instance == "policy-0"


def _spec(model: str) -> RolloutSpec:
    return RolloutSpec(rollout_id=f"ro-{model}", model=model, baseline="1", candidate="2")


def test_restore_keeps_only_the_partitions_models() -> None:
    models = [f"m{i}" for i in range(12)]
    restored = Restored(
        states=[(pending_state(_spec(m), 0, epoch=1), _spec(m)) for m in models],
        epochs={m: 5 for m in models},
        precision={VersionKey(m, "1"): ("fp32", 2) for m in models},
        qos_policies=[
            QosPolicy(model=m, version="1", slo_p99_ms=100.0, ladder=("fp32",)) for m in models
        ],
        scale={VersionKey(m, "1"): (2, 3, 0) for m in models},
    )
    mine = restrict(restored, lambda m: partition_of(m, 3) == 1)
    expected = {m for m in models if partition_of(m, 3) == 1}
    assert 0 < len(expected) < len(models)
    assert {spec.model for _, spec in mine.states} == expected
    assert set(mine.epochs) == expected
    assert {k.model for k in mine.precision} == expected
    assert {p.model for p in mine.qos_policies} == expected
    assert {k.model for k in mine.scale} == expected


async def test_a_revoked_partition_is_dropped_and_its_models_are_no_longer_decided_here() -> None:
    shards = ShardMap(PolicyCore, BUILD, sharded=True)
    shards.partitions = 3
    gone, new = shards.reassign([0, 2], generation=1)
    assert gone == [] and [s.ownership.partition for s in new] == [0, 2]
    for shard in new:
        shard.ready.set()
    on_0 = next(m for m in (f"m{i}" for i in range(20)) if partition_of(m, 3) == 0)
    on_1 = next(m for m in (f"m{i}" for i in range(20)) if partition_of(m, 3) == 1)
    assert await shards.core_for(on_0) is new[0].core
    assert await shards.core_for(on_1) is None  # another instance's model
    # The next generation: 0 kept (state and all), 2 revoked, 1 new.
    gone, added = shards.reassign([0, 1], generation=2)
    assert [s.ownership.partition for s in gone] == [2]
    assert [s.ownership.partition for s in added] == [1]
    assert shards.owned()[0] is new[0]
    assert [s.ownership.partition for s in shards.ready()] == [0]  # 1 not restored yet
    # A rebalance: records wait (faust may fetch before the assignment is taken on).
    shards.revoking()
    waiting = asyncio.ensure_future(shards.core_for(on_0))
    await asyncio.sleep(0.01)
    assert not waiting.done() and not shards.may_decide(0.0, 10.0)
    # A gap in generations: everything is taken anew (another may have owned it).
    gone, added = shards.reassign([0, 1], generation=5)
    assert len(gone) == 2 and [s.ownership.generation for s in added] == [5, 5]
    added[0].ready.set()
    assert await waiting is added[0].core  # restored: the waiting record goes to it


def test_unsharded_one_core_decides_for_every_model() -> None:
    shards = ShardMap(PolicyCore, BUILD)
    (only,) = shards.owned()
    assert shards.shard_of("anything") is only
    assert only.decided_by.generation == 0
    assert not isinstance(only.core.routing.epochs, FencedEpochs)
    assert logic.__doc__


def test_audit_replay_shows_which_instance_decided_in_which_generation() -> None:
    from graylane.app.cli.replay import decision_extra
    from graylane.v1 import audit_pb2

    sharded = audit_pb2.AuditRecord(epoch=epoch_floor(3) + 2)
    sharded.decided_by.CopyFrom(BUILD)
    sharded.decided_by.generation = 3
    sharded.decided_by.partition = 1
    assert decision_extra(sharded) == (f"epoch={epoch_floor(3) + 2} by=policy-0 gen=3 partition=1")
    single = audit_pb2.AuditRecord(epoch=4)
    single.decided_by.CopyFrom(BUILD)
    assert decision_extra(single) == "epoch=4"  # unsharded: as before
    assert decision_extra(audit_pb2.AuditRecord()) == ""


def test_a_new_owner_restores_the_highest_epoch_not_a_zombies_later_write() -> None:
    from graylane import serde
    from graylane.policy_engine.shards import newest_by_epoch, routing_epoch
    from graylane.v1 import control_pb2

    def table(epoch: int) -> bytes:
        return serde.encode(control_pb2.RoutingTable(model="gpt", epoch=epoch))

    old_owner, new_owner = epoch_floor(1), epoch_floor(2)
    log = [
        (b"gpt", table(old_owner + 1)),
        (b"gpt", table(new_owner + 1)),  # the new owner's table
        (b"gpt", table(old_owner + 2)),  # the old one wrote on, unaware (a zombie)
        (b"bert", table(old_owner + 1)),
        (b"bert", table(old_owner + 2)),  # a plain later write wins as before
        (b"gone", table(3)),
        (b"gone", None),  # a tombstone deletes
        (None, table(99)),  # keyless: not a control record
        (b"bad", b"\xff not a table"),
    ]
    newest = newest_by_epoch(log, routing_epoch)
    assert newest[b"gpt"] == table(new_owner + 1)
    assert newest[b"bert"] == table(old_owner + 2)
    assert newest[b"gone"] is None
    assert newest[b"bad"] == b"\xff not a table"  # kept for restore to skip and audit
    assert set(newest) == {b"gpt", b"bert", b"gone", b"bad"}


def test_after_a_silence_past_the_session_no_decision_until_assigned_again() -> None:
    from graylane.policy_engine.logic.shards import session_lapsed

    assert not session_lapsed(None, 100.0, 10.0)  # the first tick
    assert not session_lapsed(95.0, 100.0, 10.0)
    assert session_lapsed(85.0, 100.0, 10.0)

    shards = ShardMap(PolicyCore, BUILD, sharded=True)
    shards.partitions = 2
    shards.reassign([0, 1], generation=1)
    assert shards.may_decide(0.0, 10.0) and shards.may_decide(1.0, 10.0)
    assert not shards.may_decide(30.0, 10.0)  # stopped for 29 s: maybe not the owner now
    assert not shards.may_decide(31.0, 10.0)
    shards.reassign([1], generation=2)  # the group says what is ours again
    assert shards.may_decide(31.5, 10.0)
    # Starved while the consumer kept the session: no assignment comes; decide again later.
    assert not shards.may_decide(60.0, 10.0)
    assert not any(shards.may_decide(float(t), 10.0) for t in range(61, 80))  # a tick a second
    assert shards.may_decide(80.5, 10.0)
    shards.paused = True  # revoked, not yet assigned again
    assert not shards.may_decide(81.0, 10.0)

    unsharded = ShardMap(PolicyCore, BUILD)
    assert unsharded.may_decide(0.0, 10.0) and unsharded.may_decide(100.0, 10.0)
