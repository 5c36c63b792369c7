"""Record batches as the broker measures them, and records built to a size."""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import ConsumerRecord

from graylane.kafka.seam import Headers, Record

__all__ = ["batch_bytes", "big_headers", "record_at"]


def batch_bytes(value: bytes, key: bytes | None, headers: Headers = ()) -> int:
    """What the broker compares with ``max.message.bytes``: one record's batch."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    builder.append(0, timestamp=1_700_000_000_000, key=key, value=value, headers=list(headers))
    return len(builder.build())


def big_headers(count: int = 2000) -> list[tuple[str, bytes]]:
    """``count`` headers of 500 bytes each: a 100-character name and a 400-byte value."""
    return [(f"h{i:04d}" + "n" * 95, b"v" * 400) for i in range(count)]


def record_at(
    limit: int, key: bytes, headers: Headers, *, fill: bytes = b"x", topic: str = "t.requests.m"
) -> Record:
    """A record whose batch is exactly ``limit`` bytes, its value made of ``fill``."""
    value = fill * (limit - batch_bytes(b"", key, headers))
    while batch_bytes(value, key, headers) > limit:  # the value's length varint grew
        value = value[:-1]
    return ConsumerRecord(topic, 3, 41, 0, 0, key, value, None, 1, len(value), list(headers))
