"""Record sizes against the broker's limits: dead letters that always fit, the size
bound the checks use, the ``max.message.bytes`` topics are created with.

Regression: a dead letter copied every header of the original uncapped plus 64 KiB
of key and value, so a record near its topic's limit yielded a letter over the
dead-letter topic's limit; the send failed non-retriably and the service stopped.
"""

from __future__ import annotations

import hashlib

import pytest
from aiokafka.structs import ConsumerRecord

from graylane import serde
from graylane.kafka.admin import STOCK_MAX_MESSAGE_BYTES, MessageLimits
from graylane.kafka.replies import (
    DEAD_LETTER_HEADER_NAMES,
    ReplySink,
    dead_letter_record,
    record_bytes,
)
from graylane.kafka.seam import Headers, KafkaFactory, Record
from graylane.settings import Settings
from graylane.topics import TopicLayout
from graylane.v1 import dlq_pb2, inference_pb2
from tests.support.batches import batch_bytes, big_headers, record_at
from tests.support.memory_kafka import MemoryBroker, MemoryProducer


def _record(value: bytes, key: bytes, headers: Headers) -> Record:
    return ConsumerRecord("t.requests.m", 3, 41, 0, 0, key, value, None, 1, len(value), headers)


def _near_limit_with_big_headers(limit: int) -> Record:
    """A record exactly at ``limit`` whose headers are most of it: 2000 of 500 bytes."""
    return record_at(limit, b"k" * 1_000, big_headers())


def test_record_bytes_bounds_the_batch_the_broker_measures() -> None:
    for value, key, headers in (
        (b"", None, []),
        (b"v" * 1000, b"k" * 10, [("h" * 5, b"x" * 7)]),
        (b"v" * 300_000, b"k" * 70_000, [(f"n{i}", b"x" * 2000) for i in range(300)]),
    ):
        assert batch_bytes(value, key, headers) <= record_bytes(value, key, headers)


@pytest.mark.parametrize("limit", [STOCK_MAX_MESSAGE_BYTES, 8 * 1024 * 1024, 64 * 1024])
def test_a_dead_letter_of_a_record_at_the_limit_with_big_headers_fits(limit: int) -> None:
    record = _near_limit_with_big_headers(STOCK_MAX_MESSAGE_BYTES)
    assert batch_bytes(record.value or b"", record.key, record.headers) == STOCK_MAX_MESSAGE_BYTES
    value, key = dead_letter_record(
        record, inference_pb2.DECODE_ERROR, "r" * 100_000, service="router", limit=limit
    )
    assert batch_bytes(value, key, ()) <= record_bytes(value, key) <= limit
    letter = serde.decode(dlq_pb2.DeadLetter, value)
    original = record.value or b""
    # Headers summarized, not copied: names clipped, no values; count and size in full.
    assert len(letter.original_headers) == DEAD_LETTER_HEADER_NAMES
    assert all(len(h.key) < 120 and not h.value for h in letter.original_headers)
    assert letter.original_header_count == 2000
    assert letter.original_headers_length == 2000 * (100 + 400)
    # The whole value described, as much of it kept as the limit leaves room for.
    assert letter.original_length == len(original)
    assert letter.original_truncated == (len(letter.original_value) < len(original))
    assert letter.original_sha256 == hashlib.sha256(original).digest()
    assert original.startswith(letter.original_value)
    assert letter.original_key_length == 1_000
    assert (record.key or b"").startswith(letter.original_key)
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        "t.requests.m",
        3,
        41,
    )


def test_a_small_record_is_kept_whole() -> None:
    record = _record(b"\xff\x00bad", b"key", [("trace", b"abc"), ("\udcff-raw", b"")])
    value, key = dead_letter_record(
        record, inference_pb2.DECODE_ERROR, "undecodable", service="w", limit=1 << 20
    )
    letter = serde.decode(dlq_pb2.DeadLetter, value)
    assert letter.original_value == b"\xff\x00bad" and not letter.original_truncated
    assert letter.original_key == b"key" and key == b"key"
    assert [h.key for h in letter.original_headers] == ["trace", "\ufffd-raw"]


async def test_the_sink_sizes_dead_letters_by_the_dead_letter_topics_limit() -> None:
    broker = MemoryBroker(auto_create_topics=True)
    producer = MemoryProducer(broker)
    await producer.start()
    limits = MessageLimits(None, ceiling=STOCK_MAX_MESSAGE_BYTES)
    sink = ReplySink(producer, TopicLayout(prefix="t"), "router", limits=limits)
    record = _near_limit_with_big_headers(STOCK_MAX_MESSAGE_BYTES)
    await (await sink.dead_letter(record, inference_pb2.INTERNAL, "a fatal send"))
    (letter,) = broker.records("t.dlq")
    assert batch_bytes(letter.value or b"", letter.key) <= STOCK_MAX_MESSAGE_BYTES


async def test_a_record_over_a_topics_limit_is_named_oversized() -> None:
    limits = MessageLimits(None, ceiling=4096)
    sink = ReplySink(MemoryProducer(MemoryBroker()), TopicLayout(prefix="t"), "r", limits=limits)
    assert await sink.oversized("t.results.m", b"x" * 3000, b"k") is None
    why = await sink.oversized("t.results.m", b"x" * 4096, b"k")
    assert why is not None and "t.results.m" in why and "4096" in why


def test_topics_are_created_with_the_max_message_bytes_graylane_sends() -> None:
    settings = Settings(topic_prefix="t", max_request_bytes=3 * 1024 * 1024)
    factory = KafkaFactory(settings)
    assert settings.max_message_bytes == 6 * 1024 * 1024
    for spec in factory.layout.shared_specs() + factory.layout.model_specs("m", ["v1"]):
        assert spec.creation_configs()["max.message.bytes"] == str(settings.max_message_bytes)
        # An operator's value stands: a repair does not bring it back.
        assert "max.message.bytes" not in spec.configs()
    assert Settings().max_message_bytes == TopicLayout().max_message_bytes
