"""Confluent Schema Registry protobuf framing, read on the ingress beside raw messages.

Most JVM producers (and Confluent's Go, .NET and Python serializers) do not send
a bare ``graylane.v1.InferenceRequest``: their protobuf serializer frames it as

====================  =========================================================
bytes                 meaning
====================  =========================================================
``0x00``              magic byte
4 bytes, big-endian   the schema id the producer registered (not looked up here)
varint array          the message indexes: a zigzag varint count, then each
                      index as a zigzag varint, the path of the message type in
                      its ``.proto`` file (``[1]``: the file's second top-level
                      message); the single byte ``0x00`` is the shortcut for
                      ``[0]``, the first message
the rest              the protobuf message itself
====================  =========================================================

A raw protobuf message never starts with ``0x00`` (that would be field number 0,
which protobuf forbids), so the first byte tells the two apart without any
registry: :func:`decode` accepts both. A framed record whose indexes name another
message of the file (a producer configured with the wrong class) is refused with
the reason, never parsed as the wrong type.

The schema id is kept (:attr:`Framing.schema_id`) but never fetched: Graylane's
contract is its own ``protos/``; a registry, if any, only records it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, cast

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from graylane import serde
from graylane.errors import SerdeError

__all__ = [
    "MAGIC_BYTE",
    "MAX_MESSAGE_INDEXES",
    "Framing",
    "FramingError",
    "Unframed",
    "decode",
    "message_indexes",
    "unframe",
]

M = TypeVar("M", bound=Message)

MAGIC_BYTE = 0
"""The first byte of a framed record (Confluent's wire format version 0)."""
MAX_MESSAGE_INDEXES = 16
"""Nesting depth accepted in the message-index array: the count is client-controlled."""
_HEADER = 5
"""Magic byte and the 4-byte schema id."""
_MAX_VARINT_BYTES = 5
"""A zigzag varint of a 32-bit int (Confluent writes int32s) takes at most 5 bytes."""


class FramingError(SerdeError):
    """A record starts with the magic byte but its framing is truncated or malformed."""


@dataclass(frozen=True, kw_only=True)
class Framing:
    """What a Schema Registry serializer put in front of the message."""

    schema_id: int
    message_indexes: tuple[int, ...]
    """The message type's path in its ``.proto`` file (``(0,)`` for the first message)."""


@dataclass(frozen=True, kw_only=True)
class Unframed:
    """A record value with its framing (if any) taken off."""

    payload: bytes
    framing: Framing | None
    """``None``: the value was a raw message."""


def unframe(data: bytes) -> Unframed:
    """Split ``data`` into framing and payload; a value not starting with 0 is raw.

    Raises :class:`FramingError` for a framed value that is cut short, has a varint
    longer than an int32's, a negative count or index, or more than
    :data:`MAX_MESSAGE_INDEXES` indexes.
    """
    if not data or data[0] != MAGIC_BYTE:
        return Unframed(payload=bytes(data), framing=None)
    if len(data) < _HEADER + 1:
        raise FramingError(
            f"schema-registry framing cut short: {len(data)} bytes, "
            f"at least {_HEADER + 1} needed (magic byte, schema id, message indexes)"
        )
    schema_id = int.from_bytes(data[1:_HEADER], "big")
    count, at = _zigzag_varint(data, _HEADER)
    if count < 0 or count > MAX_MESSAGE_INDEXES:
        raise FramingError(
            f"schema-registry framing has {count} message indexes; "
            f"0 to {MAX_MESSAGE_INDEXES} are accepted"
        )
    if count == 0:  # the single-0 shortcut: the file's first message
        return Unframed(
            payload=bytes(data[at:]), framing=Framing(schema_id=schema_id, message_indexes=(0,))
        )
    indexes: list[int] = []
    for _ in range(count):
        index, at = _zigzag_varint(data, at)
        if index < 0:
            raise FramingError(f"schema-registry framing has a negative message index {index}")
        indexes.append(index)
    return Unframed(
        payload=bytes(data[at:]),
        framing=Framing(schema_id=schema_id, message_indexes=tuple(indexes)),
    )


def _zigzag_varint(data: bytes, at: int) -> tuple[int, int]:
    """The zigzag-decoded varint at ``at`` and the offset after it."""
    value = 0
    for i in range(_MAX_VARINT_BYTES):
        if at + i >= len(data):
            raise FramingError("schema-registry framing cut short inside the message indexes")
        byte = data[at + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), at + i + 1
    raise FramingError(
        f"schema-registry framing has a varint longer than {_MAX_VARINT_BYTES} bytes"
    )


def message_indexes(kind: type[Message]) -> tuple[int, ...]:
    """The path a Schema Registry serializer writes for the message type ``kind``."""
    path: list[int] = []
    current: Descriptor | None = cast(Descriptor, kind.DESCRIPTOR)
    while current is not None:
        parent = current.containing_type
        siblings = (
            list(parent.nested_types)
            if parent is not None
            else list(current.file.message_types_by_name.values())
        )
        path.append(next(i for i, d in enumerate(siblings) if d.full_name == current.full_name))
        current = parent
    return tuple(reversed(path))


def decode(kind: type[M], data: bytes | None) -> M:
    """Parse ``data`` as ``kind``, raw or framed by a Schema Registry serializer.

    Raises :class:`SerdeError` (or :class:`FramingError`) with the reason, as
    :func:`graylane.serde.decode` does; a framed value whose indexes name another
    message type of ``kind``'s file is refused rather than misread.
    """
    if data is None:
        return serde.decode(kind, data)
    unframed = unframe(data)
    framing = unframed.framing
    if framing is not None:
        expected = message_indexes(kind)
        if framing.message_indexes != expected:
            raise FramingError(
                f"schema-registry framing (schema id {framing.schema_id}) names message "
                f"indexes {list(framing.message_indexes)}, not {kind.DESCRIPTOR.full_name} "
                f"({list(expected)})"
            )
    return serde.decode(kind, unframed.payload)
