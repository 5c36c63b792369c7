"""The pipelined consume loop (``ConsumeLoop(max_in_flight=4)``) on the real broker.

Its handler returns futures that the test acknowledges itself, out of order (newest
first) and with one held back: the group's committed offset never passes a record
whose send is unacknowledged (checked at every commit the loop makes, and on the
broker while the send is held), a restart reads again exactly what was not
acknowledged, a send failing retriably is read again without losing the records
after it, and a member joining the group waits for the in-flight cycles to be
acknowledged and committed before the partitions change hands (or, once
``revoke_wait_s`` is spent, leaves them to be read again from the last commit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import NotLeaderForPartitionError

from graylane.errors import NotStartedError
from graylane.kafka.backoff import BackoffPolicy
from graylane.kafka.consume_loop import ConsumeLoop, LoopHooks
from graylane.kafka.fault import Fault
from graylane.kafka.seam import ConsumerOptions, KafkaFactory, Record
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

MODEL = "pipelined"
SWEEP_S = 0.02


@dataclass
class Acks:
    """The handler's sends, acknowledged by :meth:`sweep` newest first, except the
    offsets in ``held`` (``fail`` turns a held one into a failed send)."""

    held: set[int] = field(default_factory=set)
    handled: list[tuple[int, int]] = field(default_factory=list)
    acked: set[tuple[int, int]] = field(default_factory=set)
    pending: list[tuple[tuple[int, int], asyncio.Future[None]]] = field(default_factory=list)
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)
    out_of_order: int = 0

    async def handle(self, records: list[Record]) -> list[Awaitable[object]]:
        sends: list[Awaitable[object]] = []
        for r in records:
            ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.handled.append((r.partition, r.offset))
            self.pending.append(((r.partition, r.offset), ack))
            sends.append(ack)
        return sends

    def sweep(self) -> None:
        """Acknowledge every pending send not held, the newest first."""
        keep: list[tuple[tuple[int, int], asyncio.Future[None]]] = []
        ready = [(where, ack) for where, ack in self.pending if not ack.done()]
        for where, ack in reversed(ready):
            if where[1] in self.held:
                keep.append((where, ack))
                continue
            if keep or any(w < where for w, a in ready if not a.done() and w != where):
                self.out_of_order += 1  # an older send is still unacknowledged
            self.acked.add(where)
            ack.set_result(None)
        self.pending = keep

    def fail(self, offset: int, error: BaseException) -> None:
        self.held.discard(offset)
        for where, ack in self.pending:
            if where[1] == offset and not ack.done():
                ack.set_exception(error)

    def unacknowledged_below(self, offsets: dict[TopicPartition, int]) -> list[tuple[int, int]]:
        return [
            (tp.partition, o)
            for tp, upto in offsets.items()
            for o in range(upto)
            if (tp.partition, o) not in self.acked
        ]

    async def sweeping(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sweep()
            await asyncio.sleep(SWEEP_S)


def pipelined(factory: KafkaFactory, topic: str, group: str, **kwargs: object) -> ConsumeLoop:
    return ConsumeLoop(
        "pipelined",
        factory,
        [topic],
        ConsumerOptions(group_id=group),
        role="pipelined",
        client_suffix="pipelined",
        policy=BackoffPolicy(base_s=0.05, cap_s=0.2),
        poll_ms=100,
        **kwargs,  # type: ignore[arg-type]
    )


def hooks_of(loop: ConsumeLoop, acks: Acks) -> LoopHooks:
    """``acks.handle``; every commit checked against what is acknowledged, then made."""

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        assert not acks.unacknowledged_below(offsets), (offsets, acks.acked)
        acks.commits.append(dict(offsets))
        await loop.consumer.commit(offsets)

    return LoopHooks(handle=acks.handle, commit=commit)


async def serve(loop: ConsumeLoop, acks: Acks, stop: asyncio.Event) -> None:
    await loop.start()  # (a group member's start waits for its first assignment)
    sweeper = asyncio.create_task(acks.sweeping(stop))
    try:
        await loop.run(stop, hooks_of(loop, acks))
    finally:
        stop.set()
        await sweeper
        await loop.stop()


@contextlib.asynccontextmanager
async def running(loop: ConsumeLoop, acks: Acks) -> AsyncIterator[asyncio.Task[None]]:
    """``loop`` started and running with ``acks`` swept, in a task; stopped cleanly."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(loop, acks, stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def assignment(loop: ConsumeLoop) -> set[TopicPartition]:
    try:
        return loop.consumer.assignment()
    except NotStartedError:
        return set()


async def produce(factory: KafkaFactory, topic: str, count: int, partition: int = 0) -> None:
    producer = factory.producer()
    await producer.start()
    try:
        for i in range(count):
            await producer.send_and_wait(topic, f"r{i}".encode(), partition=partition)
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def admin_of(factory: KafkaFactory) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = factory.admin()
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def group_offset(admin: AIOKafkaAdminClient, group: str, tp: TopicPartition) -> int | None:
    """The group's committed offset of ``tp``, as the broker has it."""
    offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    found = offsets.get(tp)
    return None if found is None or found.offset < 0 else found.offset


async def topic_of(factory: KafkaFactory) -> str:
    await factory.ensure_topics(factory.layout.model_specs(MODEL, ["1.0.0"]))
    return factory.layout.version_requests(MODEL, "1.0.0")  # 2 partitions in tests


async def test_out_of_order_acks_commit_only_what_is_acknowledged_and_a_restart_reads_the_rest(
    factory: KafkaFactory,
) -> None:
    topic = await topic_of(factory)
    tp = TopicPartition(topic, 0)
    group = f"{factory.settings.topic_prefix}-pipelined"
    count, held = 12, 5
    await produce(factory, topic, count)
    first = Acks(held={held})
    loop = pipelined(factory, topic, group, max_in_flight=4, max_records=1, revoke_wait_s=1.0)
    async with admin_of(factory) as admin:
        async with running(loop, first):

            async def stuck_at_the_held_send() -> bool:
                acked = {o for _, o in first.acked}
                return (
                    loop.in_flight == 4
                    and acked >= set(range(held + 4)) - {held}
                    and await group_offset(admin, group, tp) == held
                )

            await wait_until(stuck_at_the_held_send, timeout=60, what="every ack before it")
            # at the cap: the held cycle and the three after it, acknowledged out of order
            assert max(o for _, o in first.handled) == held + 3
            assert first.out_of_order > 0
            assert {o for _, o in first.acked} == set(range(held + 4)) - {held}
            assert await group_offset(admin, group, tp) == held
        # stopped with the send still held: the drain gave up on it, committed nothing past it
        assert all(offsets[tp] <= held for offsets in first.commits)
        assert await group_offset(admin, group, tp) == held

        again = Acks(acked=set(first.acked))  # what the group's offset may pass
        restarted = pipelined(factory, topic, group, max_in_flight=4, max_records=1)
        async with running(restarted, again):

            async def all_committed() -> bool:
                return await group_offset(admin, group, tp) == count

            await wait_until(all_committed, timeout=60, what="every record committed")
        # read again from the unacknowledged one on (the ones acknowledged after it too)
        assert [o for _, o in again.handled] == list(range(held, count))
        assert await group_offset(admin, group, tp) == count


async def test_a_send_failing_retriably_is_read_again_and_no_later_record_is_lost(
    factory: KafkaFactory,
) -> None:
    topic = await topic_of(factory)
    tp = TopicPartition(topic, 0)
    group = f"{factory.settings.topic_prefix}-pipelined-retry"
    count, failing = 10, 3
    await produce(factory, topic, count)
    acks = Acks(held={failing})
    loop = pipelined(factory, topic, group, max_in_flight=4, max_records=1)
    async with admin_of(factory) as admin:
        async with running(loop, acks):

            async def stuck_at_the_failing_send() -> bool:
                acked = {o for _, o in acks.acked}
                return (
                    loop.in_flight == 4
                    and acked >= set(range(failing + 4)) - {failing}
                    and await group_offset(admin, group, tp) == failing
                )

            await wait_until(stuck_at_the_failing_send, timeout=60, what="every ack before it")
            acks.fail(failing, NotLeaderForPartitionError())  # retriable: an outage

            async def all_committed() -> bool:
                return await group_offset(admin, group, tp) == count

            await wait_until(all_committed, timeout=60, what="every record committed")
        assert loop.guard.faults[Fault.OUTAGE] == 1
        assert loop.guard.backoff.failures == 0  # reset once the retry was committed
    # the failed cycle and the three dropped after it (though acknowledged) were read
    # again from the failed one on, and so was everything after them
    handled = [o for _, o in acks.handled]
    assert handled == list(range(failing + 4)) + list(range(failing, count))
    committed = [offsets[tp] for offsets in acks.commits]
    assert committed == sorted(committed) and committed[-1] == count


async def test_a_member_joining_waits_for_the_cycles_in_flight_to_be_committed(
    factory: KafkaFactory,
) -> None:
    topic = await topic_of(factory)
    group = f"{factory.settings.topic_prefix}-pipelined-join"
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    for tp in tps:
        await produce(factory, topic, 3, partition=tp.partition)
    everything = set(range(3))
    held = Acks(held=everything)  # nothing acknowledged until the rebalance waits
    first = pipelined(factory, topic, group, max_in_flight=8, max_records=2, revoke_wait_s=60)
    joining = Acks(acked=held.acked)  # one set: what either member acknowledged
    second = pipelined(factory, topic, group, max_in_flight=4)
    async with admin_of(factory) as admin, running(first, held):
        await wait_until(lambda: len(held.handled) == 6, timeout=60, what="all six handled")
        assert 0 < first.in_flight < first.max_in_flight  # the loop itself is not waiting
        assert [await group_offset(admin, group, tp) for tp in tps] == [None, None]
        async with running(second, joining):
            await wait_until(
                lambda: first.guard.revocations == 1, timeout=60, what="the rebalance waits"
            )
            assert first.in_flight > 0 and not held.acked
            held.held.clear()  # acknowledged now, while the partitions are still revoked

            def one_each() -> bool:
                return len(assignment(first)) == 1 == len(assignment(second))

            await wait_until(one_each, timeout=60, what="one partition each")
            assert first.in_flight == 0
            # committed before the partitions went: the joiner reads on from there
            assert [await group_offset(admin, group, tp) for tp in tps] == [3, 3]
            [given] = assignment(second)
            await produce(factory, topic, 1, partition=given.partition)  # offset 3

            def joiner_read_the_new_record() -> bool:
                return (given.partition, 3) in joining.handled

            await wait_until(joiner_read_the_new_record, timeout=60, what="the new record")
    assert joining.handled[0] == (given.partition, 3)  # nothing the first had acknowledged


async def test_a_drain_that_runs_out_of_time_leaves_the_unacknowledged_to_be_read_again(
    factory: KafkaFactory,
) -> None:
    topic = await topic_of(factory)
    group = f"{factory.settings.topic_prefix}-pipelined-timeout"
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    for tp in tps:
        await produce(factory, topic, 3, partition=tp.partition)
    held = Acks(held=set(range(3)))  # not acknowledged before the drain gives up
    first = pipelined(factory, topic, group, max_in_flight=8, max_records=2, revoke_wait_s=0.5)
    joining = Acks(acked=held.acked)
    second = pipelined(factory, topic, group, max_in_flight=4)
    async with admin_of(factory) as admin, running(first, held):
        await wait_until(lambda: len(held.handled) == 6, timeout=60, what="all six handled")
        async with running(second, joining):

            def one_each() -> bool:
                return len(assignment(first)) == 1 == len(assignment(second))

            await wait_until(one_each, timeout=60, what="one partition each")
            [kept], [given] = assignment(first), assignment(second)

            def read_again() -> bool:
                again = held.handled[6:]
                return sorted(again) == [(kept.partition, o) for o in range(3)] and all(
                    (given.partition, o) in joining.handled for o in range(3)
                )

            await wait_until(read_again, timeout=60, what="both read from the last commit")
            assert first.guard.revocations == 1
            assert await group_offset(admin, group, kept) is None  # nothing acknowledged
            held.held.clear()

            async def all_committed() -> bool:
                return [await group_offset(admin, group, tp) for tp in tps] == [3, 3]

            await wait_until(all_committed, timeout=60, what="everything committed")
            await wait_until(lambda: first.in_flight == 0, timeout=60, what="nothing in flight")
    assert not any(given in offsets for offsets in held.commits)  # it went to the joiner
