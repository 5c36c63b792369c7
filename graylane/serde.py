"""Protobuf serde for every Graylane message on the bus."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from graylane.errors import SerdeError

M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    """Serialize a message (deterministic, so equal messages give equal bytes)."""
    return message.SerializeToString(deterministic=True)


def decode(kind: type[M], data: bytes | None) -> M:
    """Parse ``data`` as ``kind``; raises :class:`SerdeError` with the reason."""
    if data is None:
        raise SerdeError(f"cannot decode {kind.__name__}: the record has no value (tombstone)")
    message = kind()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise SerdeError(f"cannot decode {kind.__name__} from {len(data)} bytes: {exc}") from None
    return message


def encode_key(key: str | None) -> bytes | None:
    return None if key is None else key.encode("utf-8")


def decode_key(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None
