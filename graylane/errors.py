"""Graylane's one error vocabulary: the exception root and the wire's error codes.

:class:`GraylaneError` is the base of every Graylane exception. Its class-level
``retriable`` says whether trying the same thing again can help (a broker outage:
yes; a malformed record: no); a consume loop reads it to retry a batch or pass
over it, instead of listing exception types.

:class:`ErrorCode` is ``graylane.v1.ErrorCode`` as a Python enum: why a request
was refused or failed, in an error result or a dead letter. The router, the
workers and the SDK speak it; its ``name`` is the string a metric label shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

__all__ = [
    "BusError",
    "ErrorCode",
    "GraylaneError",
    "NotStartedError",
    "Rejection",
    "SerdeError",
    "TensorError",
    "TopicSetupError",
    "clip",
    "is_retriable",
    "require_started",
]

T = TypeVar("T")


class ErrorCode(IntEnum):
    """``graylane.v1.ErrorCode``, value for value (a unit test holds them equal)."""

    ERROR_CODE_UNSPECIFIED = 0
    DECODE_ERROR = 1
    UNKNOWN_MODEL = 2
    UNKNOWN_VERSION = 3
    MISSING_INPUT = 4
    UNEXPECTED_INPUT = 5
    BAD_DTYPE = 6
    BAD_SHAPE = 7
    PAYLOAD_TOO_LARGE = 8
    SEQUENCE_TOO_LONG = 9
    DEADLINE_EXCEEDED = 10
    UNSUPPORTED_TASK = 11
    BAD_REQUEST = 12
    ENGINE_FAILURE = 13
    INJECTED_FAULT = 14
    INTERNAL = 15
    BAD_REPLY_TOPIC = 16
    """A reply topic outside the allowlist; only ever in a dead letter."""
    RESULT_TOO_LARGE = 17
    """The result is larger than the broker accepts in one message."""
    BAD_ROUTING_TABLE = 18
    """A routing table the router refused; only ever in a dead letter."""
    SHED = 20
    """Admission control answered at once: the deadline could not be met (overload)."""
    ENGINE_UNAVAILABLE = 21
    """The version's engine server could not be reached or is not ready (retriable)."""

    @classmethod
    def of(cls, value: int) -> ErrorCode | None:
        """The code for a wire value; None for a number this build does not know."""
        try:
            return cls(value)
        except ValueError:
            return None


class GraylaneError(RuntimeError):
    """Base of every Graylane error; ``retriable`` says whether trying again can help."""

    retriable = False


def is_retriable(exc: BaseException) -> bool:
    """Whether ``exc`` says trying again can help (its class's ``retriable`` flag).

    Kafka's own errors carry the same flag, so one check covers both.
    """
    return bool(getattr(exc, "retriable", False))


class SerdeError(GraylaneError):
    """Bytes could not be decoded into the expected message."""


class TensorError(GraylaneError):
    """A tensor's dtype, shape or byte length is inconsistent."""


class BusError(GraylaneError):
    """The Kafka bus failed an operation."""

    retriable = True


class TopicSetupError(BusError):
    """Topics could not be created or configured as specified."""

    retriable = False


class NotStartedError(GraylaneError):
    """A service used a client before starting it."""


def require_started(client: T | None) -> T:
    """``client``, or :class:`NotStartedError` if the service has not started it."""
    if client is None:
        raise NotStartedError("a Kafka client was used before the service started it")
    return client


@dataclass(frozen=True, init=False)
class Rejection:
    """Why a request cannot be served: an :class:`~graylane.errors.ErrorCode` and a message.

    ``code`` may be given as the wire's number; it is held as the enum.
    """

    code: ErrorCode
    message: str

    def __init__(self, code: ErrorCode | int, message: str) -> None:
        object.__setattr__(self, "code", ErrorCode(code))
        object.__setattr__(self, "message", message)


def clip(text: str, limit: int = 80) -> str:
    """``text`` shortened for a log line or an error message."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"
