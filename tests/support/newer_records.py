"""Protobuf records as a newer writer makes them: enum values and fields this build does
not know, set on the wire (the generated classes cannot express them)."""

from __future__ import annotations

__all__ = ["UNKNOWN", "varint", "with_enum", "with_unknown_fields"]

UNKNOWN = 97
"""An enum value no enum of this build has."""


def varint(n: int) -> bytes:
    """``n`` (non-negative) as a protobuf base-128 varint."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def with_enum(value: bytes, field: int, number: int = UNKNOWN) -> bytes:
    """``value`` with the enum field ``field`` set to ``number`` on the wire (the last wins)."""
    return value + varint(field << 3 | 0) + varint(number)


def with_unknown_fields(value: bytes) -> bytes:
    """``value`` with fields a newer writer might add: a varint, a string, a nested message."""
    nested = varint(1 << 3 | 0) + varint(UNKNOWN)
    return (
        value
        + varint(900 << 3 | 0)
        + varint(12345)
        + varint(901 << 3 | 2)
        + varint(5)
        + b"newer"
        + varint(902 << 3 | 2)
        + varint(len(nested))
        + nested
    )
