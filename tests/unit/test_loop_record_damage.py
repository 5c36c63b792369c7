"""Record-level damage and the consume loop: header keys that are not UTF-8 are read
(aiokafka decoded them strictly, inside ``getmany``), and a fetch that fails for one
record is read again record by record, passing over exactly that record."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.memory_records import MemoryRecords

from graylane.errors import ErrorCode
from graylane.kafka.loop import BackoffPolicy, ConsumeLoop, Fault, LoopHooks
from graylane.kafka.reading import CompactedFollower
from graylane.kafka.seam import (
    ConsumerOptions,
    Record,
    TolerantRecords,
    header_damage,
    readable,
)
from graylane.settings import Settings
from tests.support.memory_kafka import MemoryBroker, MemoryConsumer, MemoryFactory

TOPIC = "t.in"
GROUP = "g"


class _RawKey(str):
    raw: bytes

    def __new__(cls, raw: bytes) -> _RawKey:
        key = super().__new__(cls, "k")
        key.raw = raw
        return key

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


def _message_set(*records: tuple[bytes, list[tuple[str, bytes]]]) -> bytes:
    """One v2 batch on the wire, as a fetch response carries it."""
    builder = _DefaultRecordBatchBuilderPy(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, (value, headers) in enumerate(records):
        builder.append(offset, timestamp=1, key=None, value=value, headers=headers)
    return bytes(builder.build())


def _read(records: Any) -> list[Any]:
    out = []
    while records.has_next():
        out.extend(records.next_batch())
    return out


def test_a_header_key_that_is_not_utf8_is_read_with_its_bytes_kept() -> None:
    data = _message_set((b"a", [("ok", b"1")]), (b"b", [(_RawKey(b"\xff\xfe"), b"x")]), (b"c", []))
    with pytest.raises(UnicodeDecodeError):  # aiokafka's own reader: the whole fetch fails
        _read(MemoryRecords(data))
    got = _read(TolerantRecords(data))
    assert [r.value for r in got] == [b"a", b"b", b"c"]
    assert [r.offset for r in got] == [0, 1, 2]
    key, value = got[1].headers[0]
    assert key.encode("utf-8", "surrogateescape") == b"\xff\xfe" and value == b"x"


def test_damaged_headers_are_named_and_made_readable_for_a_dead_letter() -> None:
    [_, damaged, _] = _read(
        TolerantRecords(
            _message_set((b"a", []), (b"b", [(_RawKey(b"\xc3("), b"x")]), (b"c", [("k", b"")]))
        )
    )
    record = Record(TOPIC, 0, 1, 1, 0, None, b"b", None, -1, 1, tuple(damaged.headers))
    assert header_damage(record) == "a header key is not valid UTF-8"
    fixed = readable(record)
    assert header_damage(fixed) is None
    fixed.headers[0][0].encode("utf-8")  # a dead letter can carry it


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
    factory = _PoisonedFactory(
        MemoryBroker(), Settings(topic_prefix="t", partitions=2, instance_id="damage")
    )
    factory.broker.create_topic(TOPIC, 2)
    for value in (b"r0", b"poison", b"r2"):
        factory.broker.append(TOPIC, value, partition=0)
    for value in (b"s0", b"s1"):
        factory.broker.append(TOPIC, value, partition=1)
    loop = ConsumeLoop(
        "test",
        factory,
        [TOPIC],
        ConsumerOptions(group_id=GROUP),
        role="test",
        client_suffix="test",
        policy=BackoffPolicy(base_s=0.01, cap_s=0.02),
        poll_ms=50,
    )
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


async def test_a_compacted_topic_record_the_handler_fails_on_is_passed_over() -> None:
    """A compacted topic is read from its beginning at every start: a record that ended
    the follower (and so the router) ended it again after every restart."""
    factory = MemoryFactory(MemoryBroker(), Settings(topic_prefix="t", partitions=1))
    factory.broker.create_topic("t.tables", 1)
    for value in (b"a", b"bad", b"c"):
        factory.broker.append("t.tables", value, key=value, partition=0)
    applied: list[bytes] = []

    def apply(record: Record) -> None:
        if record.value == b"bad":
            raise KeyError("a field this build does not know")
        applied.append(record.value or b"")

    follower = CompactedFollower(factory, "t.tables", apply, client_suffix="tables")
    try:
        await follower.catch_up()
    finally:
        await follower.stop()
    assert applied == [b"a", b"c"]
    assert follower.passed_over == 1
