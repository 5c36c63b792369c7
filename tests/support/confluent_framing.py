"""Confluent Schema Registry protobuf framing, written from the documented wire format
(magic byte 0, big-endian int32 schema id, zigzag-varint message-index array, the
single ``0`` byte for ``[0]``), independently of the decoder under test."""

from __future__ import annotations

import struct
from collections.abc import Sequence


def zigzag_varint(value: int) -> bytes:
    """A signed int32 as Confluent's ``ByteUtils.writeVarint`` writes it."""
    n = ((value << 1) ^ (value >> 31)) & 0xFFFFFFFF
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def frame(
    payload: bytes, schema_id: int, indexes: Sequence[int], *, shortcut: bool = True
) -> bytes:
    """``payload`` framed as a Schema Registry protobuf serializer frames it."""
    header = b"\x00" + struct.pack(">i", schema_id)
    if shortcut and list(indexes) == [0]:
        return header + b"\x00" + payload
    array = zigzag_varint(len(indexes)) + b"".join(zigzag_varint(i) for i in indexes)
    return header + array + payload
