"""Record-level damage: header keys that are not UTF-8 are read (aiokafka decoded
them strictly, inside ``getmany``), and a compacted-topic follower passes over a
record its handler cannot apply."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.memory_records import MemoryRecords

from graylane.kafka.reading import CompactedFollower
from graylane.kafka.seam import (
    Record,
    TolerantRecords,
    header_damage,
    readable,
)
from graylane.settings import Settings
from tests.support.damage import RawHeaderKey
from tests.support.memory_kafka import MemoryBroker, MemoryFactory

TOPIC = "t.in"
GROUP = "g"


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
    data = _message_set(
        (b"a", [("ok", b"1")]), (b"b", [(RawHeaderKey(b"\xff\xfe"), b"x")]), (b"c", [])
    )
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
            _message_set((b"a", []), (b"b", [(RawHeaderKey(b"\xc3("), b"x")]), (b"c", [("k", b"")]))
        )
    )
    record = Record(TOPIC, 0, 1, 1, 0, None, b"b", None, -1, 1, tuple(damaged.headers))
    assert header_damage(record) == "a header key is not valid UTF-8"
    fixed = readable(record)
    assert header_damage(fixed) is None
    fixed.headers[0][0].encode("utf-8")  # a dead letter can carry it


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
