"""The one consume loop over the in-memory double: what it commits, what it retries,
what it passes over (one record, never the loop), what ends it, and how it stops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from graylane.errors import ErrorCode, GraylaneError
from graylane.kafka.loop import BackoffPolicy, ConsumeLoop, Fault, LoopHooks
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


@pytest.fixture
def factory(tmp_path: Path) -> MemoryFactory:
    factory = MemoryFactory(
        MemoryBroker(), Settings(topic_prefix="t", partitions=1, instance_id="loop-test")
    )
    factory.broker.create_topic(TOPIC, 1)
    for n in range(3):
        factory.broker.append(TOPIC, f"r{n}".encode(), partition=0)
    return factory


def loop_of(factory: MemoryFactory, group: str | None = GROUP) -> ConsumeLoop:
    return ConsumeLoop(
        "test",
        factory,
        [TOPIC],
        ConsumerOptions(group_id=group),
        role="test",
        client_suffix="test",
        policy=BackoffPolicy(base_s=0.01, cap_s=0.02),
        poll_ms=50,
    )


def committed(factory: MemoryFactory) -> int | None:
    return factory.broker.committed(GROUP, TopicPartition(TOPIC, 0))


async def test_a_delivered_batch_is_committed_and_a_stop_frees_the_consumer(
    factory: MemoryFactory,
) -> None:
    loop = loop_of(factory)
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
    factory: MemoryFactory,
) -> None:
    loop = loop_of(factory)
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
    factory: MemoryFactory,
) -> None:
    loop = loop_of(factory)

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
    factory: MemoryFactory,
) -> None:
    """It used to end the loop uncommitted: the same record ended every restart."""
    loop = loop_of(factory)
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


async def test_offsets_kept_elsewhere_go_to_the_commit_hook(factory: MemoryFactory) -> None:
    loop = loop_of(factory, group=None)
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


async def test_a_stop_cuts_a_backoff_wait_short(factory: MemoryFactory) -> None:
    loop = ConsumeLoop(
        "test",
        factory,
        [TOPIC],
        ConsumerOptions(group_id=GROUP),
        role="test",
        client_suffix="test",
        policy=BackoffPolicy(base_s=30.0, cap_s=30.0),
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


async def test_a_fetch_that_fails_for_one_record_passes_over_exactly_that_record() -> None:
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
    loop = loop_of(factory)
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
