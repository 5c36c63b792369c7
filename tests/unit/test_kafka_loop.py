"""The one consume loop over the in-memory double: what it commits, what it retries,
what it passes over (one record, never the loop), what ends it, and how it stops;
one batch at a time and pipelined (``max_in_flight`` > 1) alike, and what only the
pipelined loop does: fetch on while sends are in flight, up to its cap, and drain."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError
from prometheus_client import CollectorRegistry

from graylane.errors import ErrorCode, GraylaneError
from graylane.kafka.backoff import BackoffPolicy
from graylane.kafka.consume_loop import ConsumeLoop, LoopHooks
from graylane.kafka.fault import Fault
from graylane.kafka.seam import ConsumerOptions, Record
from graylane.settings import Settings
from tests.support.memory_kafka import MemoryBroker, MemoryConsumer, MemoryFactory

TOPIC = "t.in"
GROUP = "g"


class Transient(GraylaneError):
    """A failure that trying again can cure."""

    retriable = True


class Broken(GraylaneError):
    """A failure that it cannot."""


@pytest.fixture(params=[1, 4], ids=["one-at-a-time", "pipelined"])
def in_flight(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def factory(tmp_path: Path) -> MemoryFactory:
    factory = MemoryFactory(
        MemoryBroker(), Settings(topic_prefix="t", partitions=1, instance_id="loop-test")
    )
    factory.broker.create_topic(TOPIC, 1)
    for n in range(3):
        factory.broker.append(TOPIC, f"r{n}".encode(), partition=0)
    return factory


def loop_of(
    factory: MemoryFactory,
    group: str | None = GROUP,
    *,
    in_flight: int = 1,
    registry: CollectorRegistry | None = None,
    max_records: int | None = None,
) -> ConsumeLoop:
    return ConsumeLoop(
        "test",
        factory,
        [TOPIC],
        ConsumerOptions(group_id=group),
        role="test",
        client_suffix="test",
        policy=BackoffPolicy(base_s=0.01, cap_s=0.02),
        poll_ms=50,
        max_in_flight=in_flight,
        registry=registry,
        max_records=max_records,
    )


def committed(factory: MemoryFactory) -> int | None:
    return factory.broker.committed(GROUP, TopicPartition(TOPIC, 0))


async def test_a_delivered_batch_is_committed_and_a_stop_frees_the_consumer(
    factory: MemoryFactory, in_flight: int
) -> None:
    loop = loop_of(factory, in_flight=in_flight)
    seen: list[bytes] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        seen.extend(r.value or b"" for r in records)
        return []

    await loop.start()
    assert await loop.turn(LoopHooks(handle=handle)) == 3
    assert seen == [b"r0", b"r1", b"r2"]
    assert committed(factory) == 3
    await loop.stop()
    with pytest.raises(GraylaneError):
        loop.consumer  # noqa: B018 - stopped: no consumer to use


async def test_a_retriable_error_rewinds_backs_off_and_tells_the_fault_callbacks(
    factory: MemoryFactory, in_flight: int
) -> None:
    loop = loop_of(factory, in_flight=in_flight)
    faults: list[tuple[Fault, BaseException]] = []
    loop.guard.on_fault(lambda kind, exc: faults.append((kind, exc)))
    tries: list[int] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        tries.append(len(records))
        if len(tries) == 1:
            raise Transient("the store blinked")
        return []

    await loop.start()
    try:
        hooks = LoopHooks(handle=handle)
        await loop.turn(hooks)
        assert committed(factory) is None  # nothing of the failed batch
        await loop.turn(hooks)
    finally:
        await loop.stop()
    assert tries == [3, 3]  # the same batch again
    assert committed(factory) == 3
    [(kind, exc)] = faults
    assert kind is Fault.OUTAGE and isinstance(exc, Transient)
    assert loop.guard.backoff.failures == 0  # reset by the success


async def test_lost_authorization_propagates_and_nothing_is_committed(
    factory: MemoryFactory, in_flight: int
) -> None:
    loop = loop_of(factory, in_flight=in_flight)

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        raise TopicAuthorizationFailedError()

    await loop.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await loop.run(asyncio.Event(), LoopHooks(handle=handle))
    finally:
        await loop.stop()
    assert committed(factory) is None


async def test_an_error_of_no_known_kind_passes_over_its_record_and_commits_the_batch(
    factory: MemoryFactory, in_flight: int
) -> None:
    """It used to end the loop uncommitted: the same record ended every restart."""
    loop = loop_of(factory, in_flight=in_flight)
    handled: list[bytes] = []
    dead: list[tuple[bytes, ErrorCode]] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        if any(r.value == b"r1" for r in records):
            raise Broken("no")
        handled.extend(r.value or b"" for r in records)
        return []

    async def dead_letter(record: Record, code: ErrorCode, why: str) -> Awaitable[object]:
        dead.append((record.value or b"", code))
        return asyncio.sleep(0)

    await loop.start()
    try:
        assert await loop.turn(LoopHooks(handle=handle, dead_letter=dead_letter)) == 3
    finally:
        await loop.stop()
    assert handled == [b"r0", b"r2"]
    assert dead == [(b"r1", ErrorCode.INTERNAL)]
    assert loop.guard.faults[Fault.RECORD] == 1
    assert committed(factory) == 3


async def test_offsets_kept_elsewhere_go_to_the_commit_hook(
    factory: MemoryFactory, in_flight: int
) -> None:
    loop = loop_of(factory, group=None, in_flight=in_flight)
    kept: dict[TopicPartition, int] = {}
    positioned: list[bool] = []

    async def position(consumer: object) -> None:
        positioned.append(True)

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        return []

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        kept.update(offsets)

    await loop.start(position)
    try:
        while not kept:
            await loop.turn(LoopHooks(handle=handle, commit=commit))
    finally:
        await loop.stop()
    assert positioned == [True]
    assert kept == {TopicPartition(TOPIC, 0): 3}


async def test_a_stop_cuts_a_backoff_wait_short(factory: MemoryFactory, in_flight: int) -> None:
    loop = ConsumeLoop(
        "test",
        factory,
        [TOPIC],
        ConsumerOptions(group_id=GROUP),
        role="test",
        client_suffix="test",
        policy=BackoffPolicy(base_s=30.0, cap_s=30.0),
        max_in_flight=in_flight,
    )
    stop = asyncio.Event()

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        stop.set()  # stop while the batch fails: the 30 s backoff must not be waited out
        raise Transient("down")

    await loop.start()
    try:
        await asyncio.wait_for(loop.run(stop, LoopHooks(handle=handle)), 5)
    finally:
        await loop.stop()
    assert loop.guard.faults[Fault.OUTAGE] == 1


class _PoisonedConsumer:
    """A consumer whose fetch fails, as aiokafka's does, when it meets b"poison": the
    poisoned partition stays where it was, the others have moved on (records lost)."""

    def __init__(self, inner: MemoryConsumer) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        before = {tp: await self._inner.position(tp) for tp in self._inner.assignment()}
        got = await self._inner.getmany(*partitions, timeout_ms=timeout_ms, max_records=max_records)
        for tp, records in got.items():
            poisoned = [r for r in records if r.value == b"poison"]
            if poisoned:
                self._inner.seek(tp, before[tp])
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return got


class _PoisonedFactory(MemoryFactory):
    def consumer(self, *topics: str, **kwargs: Any) -> Any:
        return _PoisonedConsumer(super().consumer(*topics, **kwargs))


async def test_a_fetch_that_fails_for_one_record_passes_over_exactly_that_record(
    in_flight: int,
) -> None:
    """aiokafka's fetch raised for one record (a header key it could not decode) and
    the whole loop ended; on restart it read the same record and ended again."""
    factory = _PoisonedFactory(
        MemoryBroker(), Settings(topic_prefix="t", partitions=2, instance_id="damage")
    )
    factory.broker.create_topic(TOPIC, 2)
    for value in (b"r0", b"poison", b"r2"):
        factory.broker.append(TOPIC, value, partition=0)
    for value in (b"s0", b"s1"):
        factory.broker.append(TOPIC, value, partition=1)
    loop = loop_of(factory, in_flight=in_flight)
    handled: list[bytes] = []
    dead: list[tuple[int, int, ErrorCode]] = []

    async def handle(records: Sequence[Record]) -> list[Awaitable[object]]:
        handled.extend(r.value or b"" for r in records)
        return []

    async def dead_letter(record: Record, code: ErrorCode, why: str) -> Awaitable[object]:
        dead.append((record.partition, record.offset, code))
        return asyncio.sleep(0)

    hooks = LoopHooks(handle=handle, dead_letter=dead_letter)  # type: ignore[arg-type]
    await loop.start()
    try:
        for _ in range(5):
            await loop.turn(hooks)
    finally:
        await loop.stop()
    assert sorted(handled) == [b"r0", b"r2", b"s0", b"s1"]
    assert dead == [(0, 1, ErrorCode.DECODE_ERROR)]
    assert loop.guard.faults[Fault.RECORD] == 1
    assert factory.broker.committed(GROUP, TopicPartition(TOPIC, 0)) == 3
    assert factory.broker.committed(GROUP, TopicPartition(TOPIC, 1)) == 2


# -- only the pipelined loop -----------------------------------------------------------

OUT = "t.out"


def forwarding(factory: MemoryFactory, handled: list[bytes]) -> Any:
    """A handler that forwards each record to OUT and returns the sends unawaited."""
    producer = factory.producer()

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        if not producer.started:
            await producer.start()
        handled.extend(r.value or b"" for r in records)
        return [await producer.send(OUT, r.value) for r in records]

    factory.broker.create_topic(OUT, 1)
    return handle


def in_flight_gauge(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("graylane_kafka_in_flight_cycles", {"service": "test"})


async def test_a_pipelined_loop_fetches_on_while_sends_are_in_flight_up_to_its_cap(
    factory: MemoryFactory,
) -> None:
    for n in range(3, 6):
        factory.broker.append(TOPIC, f"r{n}".encode(), partition=0)
    registry = CollectorRegistry()
    loop = loop_of(factory, in_flight=4, registry=registry, max_records=1)
    handled: list[bytes] = []
    hooks = LoopHooks(handle=forwarding(factory, handled))
    factory.broker.hold_acks()
    await loop.start()
    try:
        for n in range(4):
            assert await loop.turn(hooks) == 1  # no turn waited for an acknowledgement
            assert loop.in_flight == n + 1
        assert handled == [b"r0", b"r1", b"r2", b"r3"]
        assert committed(factory) is None  # nothing is acknowledged
        assert in_flight_gauge(registry) == 4
        assert loop.in_flight == loop.max_in_flight  # the cap: the next turn waits first
        factory.broker.release_acks()
        assert await loop.turn(hooks) == 1
        assert handled[-1] == b"r4"
        assert committed(factory) == 5  # r4's send was acknowledged at once
        assert loop.in_flight == 0 and in_flight_gauge(registry) == 0
    finally:
        await loop.stop()


async def test_a_clean_stop_drains_what_is_in_flight_and_commits_it(
    factory: MemoryFactory,
) -> None:
    loop = loop_of(factory, in_flight=4, max_records=1)
    stop = asyncio.Event()
    handled: list[bytes] = []

    async def after_turn(consumer: object) -> None:
        if loop.in_flight == 3:  # every record handled, none acknowledged
            stop.set()
            factory.broker.release_acks()  # acknowledged after the last turn's commit

    hooks = LoopHooks(handle=forwarding(factory, handled), after_turn=after_turn)
    factory.broker.hold_acks()
    await loop.start()
    try:
        await asyncio.wait_for(loop.run(stop, hooks), 10)
    finally:
        await loop.stop()
    assert handled == [b"r0", b"r1", b"r2"]
    assert committed(factory) == 3  # committed by the drain


async def test_a_send_failing_for_no_known_reason_has_its_cycle_handled_record_by_record(
    factory: MemoryFactory,
) -> None:
    loop = loop_of(factory, in_flight=4)
    handled: list[bytes] = []
    dead: list[tuple[bytes, ErrorCode]] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        handled.extend(r.value or b"" for r in records)
        sends: list[Awaitable[object]] = []
        for r in records:
            ack: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            if r.value == b"r1":
                ack.set_exception(Broken("this record cannot be answered"))
            else:
                ack.set_result(None)
            sends.append(ack)
        return sends

    async def dead_letter(record: Record, code: ErrorCode, why: str) -> Awaitable[object]:
        dead.append((record.value or b"", code))
        return asyncio.sleep(0)

    hooks = LoopHooks(handle=handle, dead_letter=dead_letter)
    await loop.start()
    try:
        await loop.turn(hooks)
        assert committed(factory) is None  # the cycle's sends failed: not settled
        for _ in range(10):  # the next turns act on the failure
            await loop.turn(hooks)
            if dead:
                break
    finally:
        await loop.stop()
    assert handled == [b"r0", b"r1", b"r2", b"r0", b"r1", b"r2"]  # then one at a time
    assert dead == [(b"r1", ErrorCode.INTERNAL)]
    assert committed(factory) == 3
    assert loop.guard.faults[Fault.RECORD] == 1


async def test_lost_credentials_in_a_send_end_a_pipelined_loop_with_nothing_more_committed(
    factory: MemoryFactory,
) -> None:
    loop = loop_of(factory, in_flight=4, max_records=1)

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        ack: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if records[0].value == b"r1":
            ack.set_exception(TopicAuthorizationFailedError())
        else:
            ack.set_result(None)
        return [ack]

    await loop.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await asyncio.wait_for(loop.run(asyncio.Event(), LoopHooks(handle=handle)), 10)
        assert loop.in_flight == 0
    finally:
        await loop.stop()
    assert committed(factory) == 1  # r0 only: nothing past r1, though r2 was acknowledged
