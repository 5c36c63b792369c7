"""Two policy-engine instances share the models by partition (``--sharded``).

Each decides for the models of the partition the consumer group assigned it; when one
is killed (-9) the other takes its partition over: it rebuilds those models' rollouts
from the control topics and goes on at the step they were at, with routing epochs above
everything the dead one wrote; a regression injected afterwards is rolled back by it.
Everything is checked from what the engines recorded: the audit (who decided, in which
generation) and the routing topic (the epochs).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.bench.policy_handover import instance_of
from app.bench.policy_scale import BASELINE, CANDIDATE, PolicyScaleConfig, TelemetryWriter
from graylane import serde
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.logic.shards import epoch_floor, partition_of
from graylane.policy_engine.service import PolicyConfig, prepare_topics, shard_partitions
from graylane.policy_engine.shards import newest_by_epoch, rollout_epoch
from graylane.routing.convert import table_from_pb
from graylane.services.router.state import TableStore
from graylane.settings import Settings
from graylane.v1 import audit_pb2, control_pb2, rollout_pb2
from tests.support.policy import policy_engine
from tests.support.records import read_audits, send_command
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 2


def models_by_partition() -> dict[int, tuple[str, str]]:
    """Per partition: a model whose rollout goes through its steps, and one held at its
    second step (the one a regression is injected into)."""
    found: dict[int, list[str]] = defaultdict(list)
    for i in range(100):
        name = f"shard-m{i}"
        found[partition_of(name, PARTITIONS)].append(name)
    return {p: (names[0], names[1]) for p, names in found.items()}


def start(model: str, *, held: bool) -> rollout_pb2.RolloutCommand:
    step = rollout_pb2.RolloutStep
    steps = (
        [step(weight_percent=10.0, min_samples=20, min_dwell_s=2),
         step(weight_percent=50.0, min_samples=20, min_dwell_s=3600),
         step(weight_percent=100.0, min_samples=20, min_dwell_s=60)]
        if held
        else [step(weight_percent=w, min_samples=20, min_dwell_s=6) for w in (10, 25, 50, 75, 100)]
    )  # fmt: skip
    rid = f"ro-{model}"
    return rollout_pb2.RolloutCommand(
        command_id=f"c-{rid}",
        rollout_id=rid,
        model=model,
        kind=rollout_pb2.COMMAND_START,
        issued_by="test",
        spec=rollout_pb2.RolloutSpec(
            rollout_id=rid,
            model=model,
            baseline_version=BASELINE,
            candidate_version=CANDIDATE,
            strategy=rollout_pb2.CANARY,
            steps=steps,
            failures_to_rollback=1,
        ),
    )


def decisions(audits: list[audit_pb2.AuditRecord], model: str) -> list[audit_pb2.AuditRecord]:
    return [a for a in audits if a.model == model and a.rollout_id and a.decided_by.instance]


@contextlib.asynccontextmanager
async def feeding(factory: KafkaFactory, writer: TelemetryWriter) -> AsyncIterator[None]:
    """``writer`` feeds the telemetry topic until the block ends."""
    producer = factory.producer(client_suffix="test-telemetry")
    await producer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(producer, stop))
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await task
        await producer.stop()


@contextlib.asynccontextmanager
async def sharded_engine(
    settings: Settings, log: Path, model: str, *, what: str, until: str = "restored partition"
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A `graylane policy --sharded` process, once its log shows ``until``."""
    with policy_engine(settings, log, model, "--sharded") as engine:
        await wait_until(lambda: until in log.read_text(errors="replace"), timeout=60, what=what)
        yield engine


def logged_instance(log: Path) -> str:
    """The instance id an engine logged when it restored a partition."""
    found = instance_of(log)
    assert found is not None, f"no instance id in {log}"
    return found


async def test_sharded_engines_each_decide_for_their_models_and_take_over_a_killed_ones(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    assert settings.partitions == PARTITIONS
    await prepare_topics(settings, PolicyConfig(sharded=True))
    assert await shard_partitions(factory) == PARTITIONS  # commands co-partitioned
    models = models_by_partition()
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    writer = TelemetryWriter(
        factory.layout.telemetry(),
        [m for pair in models.values() for m in pair],
        PolicyScaleConfig(batches_per_s=2.0, requests_per_batch=8),
    )
    async with (
        feeding(factory, writer),
        sharded_engine(
            settings, a_log, "shard-m0", what="the first instance owns partitions"
        ) as first,
        sharded_engine(settings, b_log, "shard-m0", what="the second instance takes a partition"),
    ):
        a_id, b_id = logged_instance(a_log), logged_instance(b_log)
        assert a_id != b_id
        for progressing, held in models.values():
            await send_command(factory, start(progressing, held=False))
            await send_command(factory, start(held, held=True))

        # Every rollout past its first step, decided by its partition's owner.
        async def all_advanced() -> bool:
            audits = await read_audits(factory)
            return all(
                any(a.rollout_after.step_index >= 1 for a in decisions(audits, m))
                for pair in models.values()
                for m in pair
            )

        await wait_until(all_advanced, timeout=90, poll_s=1, what="every rollout advanced")
        audits = await read_audits(factory)
        owner = {
            m: decisions(audits, m)[-1].decided_by.instance
            for pair in models.values()
            for m in pair
        }
        assert set(owner.values()) == {a_id, b_id}, owner  # both instances decide
        moved = [m for m, instance in owner.items() if instance == a_id]
        (moved_partition,) = {partition_of(m, PARTITIONS) for m in moved}
        progressing, held = models[moved_partition]
        assert progressing in moved and held in moved
        a_generation = decisions(audits, progressing)[-1].decided_by.generation

        first.kill()  # kill -9: no revocation, no clean leave
        first.wait(10)
        killed = time.monotonic()

        async def b_decides_a_moved_model() -> bool:
            return any(
                a.decided_by.instance == b_id
                for a in decisions(await read_audits(factory), progressing)
            )

        await wait_until(b_decides_a_moved_model, timeout=60, poll_s=0.5, what="takeover")
        took = time.monotonic() - killed

        # The survivor goes on with the dead one's rollouts: the progressing
        # one to its promotion, the held one at its step...
        async def promoted_by_b() -> bool:
            return any(
                a.kind == audit_pb2.DECISION_PROMOTE and a.decided_by.instance == b_id
                for a in decisions(await read_audits(factory), progressing)
            )

        await wait_until(promoted_by_b, timeout=120, poll_s=1, what="promoted by B")

        async def held_by_b() -> bool:
            return any(
                a.decided_by.instance == b_id for a in decisions(await read_audits(factory), held)
            )

        await wait_until(held_by_b, timeout=60, poll_s=1, what="B decides the held one")
        # ... and rolls it back once its candidate regresses.
        writer.regressed.add(held)

        async def rolled_back() -> bool:
            return any(
                a.kind == audit_pb2.DECISION_ROLLBACK
                for a in decisions(await read_audits(factory), held)
            )

        await wait_until(rolled_back, timeout=90, poll_s=1, what="the regression")

    audits = await read_audits(factory)
    for pair in models.values():
        for model in pair:
            mine = decisions(audits, model)
            # One instance per generation, and never back to an older generation: two
            # instances never decided for one model at once.
            by_generation: dict[int, set[str]] = defaultdict(set)
            for a in mine:
                by_generation[a.decided_by.generation].add(a.decided_by.instance)
                assert a.decided_by.partition == partition_of(model, PARTITIONS)
            assert all(len(ids) == 1 for ids in by_generation.values()), by_generation
            generations = [a.decided_by.generation for a in mine]
            assert generations == sorted(generations), (model, generations)

    # The moved progressing rollout: every step advanced exactly once, across the move.
    mine = decisions(audits, progressing)
    steps = [a.rollout_after.step_index for a in mine if a.kind == audit_pb2.DECISION_ADVANCE]
    assert steps == [1, 2, 3], steps  # then the promotion, from the last step
    switch = next(i for i, a in enumerate(mine) if a.decided_by.instance == b_id)
    assert switch > 0 and all(a.decided_by.instance == a_id for a in mine[:switch])
    assert all(a.decided_by.instance == b_id for a in mine[switch:])
    before, after = mine[switch - 1], mine[switch]
    assert after.decided_by.generation > a_generation
    assert after.rollout_before.step_index == before.rollout_after.step_index  # same step
    assert mine[-1].kind == audit_pb2.DECISION_PROMOTE

    # The moved held rollout: rolled back by the survivor, at the step it was held at.
    mine = decisions(audits, held)
    rollback = next(a for a in mine if a.kind == audit_pb2.DECISION_ROLLBACK)
    assert rollback.decided_by.instance == b_id
    assert rollback.rollout_before.step_index == 1
    assert rollback.rollout_after.phase == rollout_pb2.ROLLED_BACK

    # Routing epochs of the moved models rise across the move, and the survivor's start
    # above its generation's floor: a router refuses whatever the dead one still wrote.
    tables = [
        serde.decode(control_pb2.RoutingTable, r.value)
        for r in await read_to_end(factory, factory.layout.routing(), client_suffix="test")
        if r.value
    ]
    b_generation = after.decided_by.generation
    for model in (progressing, held):
        epochs = [t.epoch for t in tables if t.model == model]
        assert epochs == sorted(set(epochs)), (model, epochs)
        assert [e for e in epochs if e > epoch_floor(a_generation + 1)], (model, epochs)
        assert max(epochs) > epoch_floor(b_generation)
    print(
        f"moved partition {moved_partition}: generation {a_generation} -> {b_generation}, "
        f"first decision by the survivor {took:.1f} s after the kill; {len(audits)} audit records"
    )


async def test_an_instance_that_lost_its_partition_unaware_is_refused_by_epoch(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    """A zombie: an instance stopped (SIGSTOP) past its session loses its partition to the
    other; the other rolls back a regression there. Resumed, the stopped one may still
    decide from what it held before it notices; whatever it writes carries its old
    generation's epochs, below the new owner's: a router keeps the new owner's table, and
    a later owner restores the new owner's rollout state."""
    await prepare_topics(settings, PolicyConfig(sharded=True))
    models = models_by_partition()
    held = [pair[1] for pair in models.values()]
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    writer = TelemetryWriter(
        factory.layout.telemetry(), held, PolicyScaleConfig(batches_per_s=2.0, requests_per_batch=8)
    )
    async with (
        feeding(factory, writer),
        sharded_engine(
            settings, a_log, held[0], what="the first instance owns partitions"
        ) as first,
        sharded_engine(settings, b_log, held[0], what="the second instance takes a partition"),
    ):
        a_id, b_id = logged_instance(a_log), logged_instance(b_log)
        for model in held:
            await send_command(factory, start(model, held=True))

        async def at_held_step() -> bool:
            audits = await read_audits(factory)
            return all(
                any(a.rollout_after.step_index == 1 for a in decisions(audits, m)) for m in held
            )

        await wait_until(at_held_step, timeout=90, poll_s=1, what="both rollouts held")
        audits = await read_audits(factory)
        (victim,) = [m for m in held if decisions(audits, m)[-1].decided_by.instance == a_id]
        a_generation = decisions(audits, victim)[-1].decided_by.generation

        first.send_signal(signal.SIGSTOP)  # alive, but silent past its session
        try:

            async def taken_over() -> bool:
                return any(
                    a.decided_by.instance == b_id
                    for a in decisions(await read_audits(factory), victim)
                )

            await wait_until(taken_over, timeout=60, poll_s=1, what="B owns the victim")
            writer.regressed.add(victim)

            async def rolled_back_by_b() -> bool:
                return any(
                    a.kind == audit_pb2.DECISION_ROLLBACK and a.decided_by.instance == b_id
                    for a in decisions(await read_audits(factory), victim)
                )

            await wait_until(rolled_back_by_b, timeout=90, poll_s=1, what="B rolls back")
        finally:
            first.send_signal(signal.SIGCONT)
        audits = await read_audits(factory)
        b_generation = next(
            a.decided_by.generation
            for a in decisions(audits, victim)
            if a.decided_by.instance == b_id
        )

        def rejoined() -> bool:  # the resumed one took part in a later generation
            text = a_log.read_text(errors="replace")
            return any(
                f"(generation {g})" in text or f"(generation {g}," in text
                for g in range(b_generation + 1, b_generation + 20)
            )

        await wait_until(rejoined, timeout=60, poll_s=0.5, what="A rejoins the group")

    assert b_generation > a_generation
    audits = decisions(await read_audits(factory), victim)
    first_b = next(i for i, a in enumerate(audits) if a.decided_by.instance == b_id)
    b_floor = epoch_floor(b_generation)
    # The new owner decides at its floor or above (a hold keeps the epoch of the model's
    # last table; each table it writes is above the floor).
    assert all(a.epoch >= b_floor for a in audits[first_b:] if a.decided_by.instance == b_id)
    # What the old owner decided after the new one took over carries its old generation
    # and epochs below the new owner's (refused by routers and workers).
    late = [a for a in audits[first_b:] if a.decided_by.instance == a_id]
    assert all(
        a.decided_by.generation == a_generation and a.epoch < b_floor
        for a in late
        if a.decided_by.generation <= a_generation
    ), [(a.decided_by.generation, a.epoch) for a in late]

    # A router folding the routing topic keeps the new owner's rollback, whatever came after.
    records = await read_to_end(factory, factory.layout.routing(), client_suffix="test")
    store = TableStore()
    refused = 0
    for r in records:
        if r.value:
            table = serde.decode(control_pb2.RoutingTable, r.value)
            if table.model == victim and not store.offer(table_from_pb(table)):
                refused += 1
    kept = store.tables[victim]
    assert kept.epoch > b_floor
    assert kept.stable_version == BASELINE
    assert all(r.weight_percent == 0 for r in kept.routes if r.version == CANDIDATE)
    # A later owner restores the rolled-back state, not a stale one written after it.
    rollouts = await read_to_end(factory, factory.layout.rollouts(), client_suffix="test")
    newest = newest_by_epoch(((r.key, r.value) for r in rollouts), rollout_epoch)
    state = serde.decode(rollout_pb2.RolloutState, newest[f"ro-{victim}".encode()])
    assert state.phase == rollout_pb2.ROLLED_BACK
    print(
        f"zombie: generation {a_generation} -> {b_generation}; {len(late)} late decision(s) "
        f"by the old owner, {refused} routing table(s) of the victim refused by a router fold"
    )


async def test_with_one_partition_one_instance_decides_and_the_other_stands_by(
    settings: Settings, tmp_path: Path
) -> None:
    """The single-writer case of sharding: one partition, one owner; the other instance
    sits in the group deciding nothing until the owner dies, then takes every model over."""
    settings = replace(settings, partitions=1)
    factory = KafkaFactory(settings)
    await prepare_topics(settings, PolicyConfig(sharded=True))
    assert await shard_partitions(factory) == 1
    model = "shard-solo"
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    writer = TelemetryWriter(
        factory.layout.telemetry(), [model], PolicyScaleConfig(batches_per_s=2.0)
    )
    async with (
        feeding(factory, writer),
        sharded_engine(
            settings, a_log, model, what="the first instance owns the partition"
        ) as first,
        sharded_engine(
            settings, b_log, model, until="Joined group", what="the second instance joins the group"
        ),
    ):
        a_id = logged_instance(a_log)
        await send_command(factory, start(model, held=True))

        async def at_held_step() -> bool:
            return any(
                a.rollout_after.step_index == 1
                for a in decisions(await read_audits(factory), model)
            )

        await wait_until(at_held_step, timeout=90, poll_s=1, what="the rollout held")
        assert "restored partition" not in b_log.read_text(errors="replace")  # idle

        first.kill()
        first.wait(10)

        async def taken_over() -> bool:
            return any(
                a.decided_by.instance != a_id for a in decisions(await read_audits(factory), model)
            )

        await wait_until(taken_over, timeout=60, poll_s=0.5, what="the standby decides")
        b_id = logged_instance(b_log)

    mine = decisions(await read_audits(factory), model)
    switch = next(i for i, a in enumerate(mine) if a.decided_by.instance == b_id)
    assert switch > 0 and {a.decided_by.instance for a in mine[:switch]} == {a_id}
    assert {a.decided_by.instance for a in mine[switch:]} == {b_id}
    assert mine[switch].decided_by.generation > mine[switch - 1].decided_by.generation
    assert mine[switch].rollout_before.step_index == 1  # resumed at the step it was held at
    assert all(a.decided_by.partition == 0 for a in mine)
