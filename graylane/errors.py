"""Graylane's one error vocabulary: the exception root and the wire's error codes.

:class:`ErrorCode` is ``graylane.v1.ErrorCode`` as a Python enum: why a request
was refused or failed, in an error result, a dead letter, an HTTP answer or a gRPC
status. The router, the workers, the SDK, the gateway and the control plane speak
it; its ``name`` is the string a metric label shows. Each code has one HTTP status
(:attr:`ErrorCode.http_status`) and one gRPC status (:attr:`ErrorCode.grpc_status`),
stated once in the table below: the gateway and the control plane answer with them.

:class:`GraylaneError` is the base of every Graylane exception. Its class-level
``code`` is the :class:`ErrorCode` it is answered with, wherever it surfaces, and
``retriable`` says whether trying the same thing again can help (a broker outage:
yes; a malformed record: no); a consume loop reads it to retry a batch or pass
over it, instead of listing exception types.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from http import HTTPStatus
from typing import TypeVar

__all__ = [
    "BusError",
    "ErrorCode",
    "GraylaneError",
    "GrpcStatus",
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
    UNAUTHENTICATED = 22
    """No credentials, or credentials this service does not know."""
    PERMISSION_DENIED = 23
    """Known credentials that may not ask for this (a priority, a tag, a method)."""
    RATE_LIMITED = 24
    """The caller's rate or concurrency share is spent; retry after a while."""
    OVERLOADED = 25
    """The service itself is out of room for this call now (retriable)."""
    NOT_FOUND = 26
    """A named thing other than a model or version does not exist (a rollout, an answer)."""
    ALREADY_EXISTS = 27
    """The thing to be made exists already, and stays as it is."""
    FAILED_PRECONDITION = 28
    """Well formed, but the system is not in a state that allows it."""

    @classmethod
    def of(cls, value: int) -> ErrorCode | None:
        """The code for a wire value; None for a number this build does not know."""
        try:
            return cls(value)
        except ValueError:
            return None

    @property
    def http_status(self) -> HTTPStatus:
        """The HTTP status a call refused or failed with this code is answered with."""
        return _STATUS[self][0]

    @property
    def grpc_status(self) -> GrpcStatus:
        """The gRPC status a call refused or failed with this code is answered with."""
        return _STATUS[self][1]


class GrpcStatus(IntEnum):
    """gRPC's canonical status codes, value for value (``grpc.StatusCode[name]``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


_E, _H, _G = ErrorCode, HTTPStatus, GrpcStatus
_STATUS: dict[ErrorCode, tuple[HTTPStatus, GrpcStatus]] = {
    # the caller's own mistakes
    _E.DECODE_ERROR: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.MISSING_INPUT: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.UNEXPECTED_INPUT: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.BAD_DTYPE: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.BAD_SHAPE: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.SEQUENCE_TOO_LONG: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.UNSUPPORTED_TASK: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.BAD_REQUEST: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.BAD_REPLY_TOPIC: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.BAD_ROUTING_TABLE: (_H.BAD_REQUEST, _G.INVALID_ARGUMENT),
    _E.PAYLOAD_TOO_LARGE: (_H.REQUEST_ENTITY_TOO_LARGE, _G.RESOURCE_EXHAUSTED),
    _E.UNKNOWN_MODEL: (_H.NOT_FOUND, _G.NOT_FOUND),
    _E.UNKNOWN_VERSION: (_H.NOT_FOUND, _G.NOT_FOUND),
    _E.NOT_FOUND: (_H.NOT_FOUND, _G.NOT_FOUND),
    _E.ALREADY_EXISTS: (_H.CONFLICT, _G.ALREADY_EXISTS),
    _E.FAILED_PRECONDITION: (_H.CONFLICT, _G.FAILED_PRECONDITION),
    _E.UNAUTHENTICATED: (_H.UNAUTHORIZED, _G.UNAUTHENTICATED),
    _E.PERMISSION_DENIED: (_H.FORBIDDEN, _G.PERMISSION_DENIED),
    _E.RATE_LIMITED: (_H.TOO_MANY_REQUESTS, _G.RESOURCE_EXHAUSTED),
    # the system cannot take the call now: retry
    _E.SHED: (_H.SERVICE_UNAVAILABLE, _G.UNAVAILABLE),
    _E.ENGINE_UNAVAILABLE: (_H.SERVICE_UNAVAILABLE, _G.UNAVAILABLE),
    _E.OVERLOADED: (_H.SERVICE_UNAVAILABLE, _G.UNAVAILABLE),
    _E.DEADLINE_EXCEEDED: (_H.GATEWAY_TIMEOUT, _G.DEADLINE_EXCEEDED),
    # failures inside
    _E.ERROR_CODE_UNSPECIFIED: (_H.INTERNAL_SERVER_ERROR, _G.UNKNOWN),
    _E.ENGINE_FAILURE: (_H.INTERNAL_SERVER_ERROR, _G.INTERNAL),
    _E.INJECTED_FAULT: (_H.INTERNAL_SERVER_ERROR, _G.INTERNAL),
    _E.INTERNAL: (_H.INTERNAL_SERVER_ERROR, _G.INTERNAL),
    _E.RESULT_TOO_LARGE: (_H.INTERNAL_SERVER_ERROR, _G.INTERNAL),
}
if set(_STATUS) != set(ErrorCode):  # a new code must say how it is answered
    raise AssertionError(f"codes without a status: {sorted(set(ErrorCode) - set(_STATUS))}")


class GraylaneError(RuntimeError):
    """Base of every Graylane error: ``code`` is what it is answered with, and
    ``retriable`` says whether trying again can help."""

    code: ErrorCode = ErrorCode.INTERNAL
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
