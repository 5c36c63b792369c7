"""What a refused or failed call answers: an HTTP status and an error body (pure).

One :class:`ApiError` per failure, whatever raised it: the edge (auth, rate limit,
size caps, a malformed body), the SDK (an unknown model, a timeout) or the system
(an error result with its :class:`~graylane.errors.ErrorCode`). It renders as
OpenAI's error body (``{"error": {"message", "type", "param", "code"}}``) on the
``/v1`` endpoints and as the Open Inference Protocol's (``{"error": "..."}``) on
``/v2``. Overload answers (429, 503) carry ``Retry-After``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from graylane.errors import ErrorCode, GraylaneError

__all__ = ["ApiError", "ErrorType", "from_error_code"]


class ErrorType(Enum):
    """OpenAI's ``error.type`` values."""

    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    PERMISSION = "permission_error"
    NOT_FOUND = "not_found_error"
    RATE_LIMIT = "rate_limit_error"
    SERVER = "server_error"
    OVERLOADED = "overloaded_error"
    TIMEOUT = "timeout_error"


class ApiError(GraylaneError):
    """A call answered with an HTTP error."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: ErrorType,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s
        self.detail = detail
        """What went wrong inside, for the logs: never sent to the caller."""

    def openai_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type.value,
                "param": self.param,
                "code": self.code,
            }
        }

    def inference_protocol_body(self) -> dict[str, Any]:
        return {"error": self.message}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}

    # -- the edge's own refusals ------------------------------------------------------
    @classmethod
    def invalid(cls, message: str, param: str | None = None) -> ApiError:
        return cls(400, message, type=ErrorType.INVALID_REQUEST, param=param)

    @classmethod
    def unauthenticated(cls) -> ApiError:
        return cls(
            401,
            "Incorrect API key provided: send 'Authorization: Bearer <key>' with a key this "
            "gateway knows",
            type=ErrorType.INVALID_REQUEST,
            code="invalid_api_key",
        )

    @classmethod
    def forbidden(cls, message: str, param: str | None = None) -> ApiError:
        """The key is known but may not ask for this (a priority, a tag)."""
        return cls(403, message, type=ErrorType.PERMISSION, code="forbidden", param=param)

    @classmethod
    def rate_limited(cls, tenant: str, retry_after_s: float) -> ApiError:
        wait = max(1, int(-(-retry_after_s // 1)))
        return cls(
            429,
            f"rate limit of tenant {tenant!r} reached; retry after {wait} s",
            type=ErrorType.RATE_LIMIT,
            code="rate_limit_exceeded",
            retry_after_s=wait,
        )

    @classmethod
    def too_many_in_flight(cls, tenant: str, running: int, retry_after_s: int) -> ApiError:
        """The tenant holds its share of the replica's running calls."""
        return cls(
            429,
            f"tenant {tenant!r} has {running} calls running, its share of this gateway; "
            "retry when one ends",
            type=ErrorType.RATE_LIMIT,
            code="too_many_in_flight",
            retry_after_s=retry_after_s,
        )

    @classmethod
    def overloaded(cls, message: str, retry_after_s: int) -> ApiError:
        return cls(
            503, message, type=ErrorType.OVERLOADED, code="overloaded", retry_after_s=retry_after_s
        )

    @classmethod
    def too_large(cls, message: str) -> ApiError:
        return cls(413, message, type=ErrorType.INVALID_REQUEST, code="request_too_large")

    @classmethod
    def model_not_found(cls, message: str) -> ApiError:
        return cls(
            404, message, type=ErrorType.INVALID_REQUEST, code="model_not_found", param="model"
        )

    @classmethod
    def timed_out(cls, message: str) -> ApiError:
        return cls(504, message, type=ErrorType.TIMEOUT, code="timeout")


_INVALID = {
    ErrorCode.DECODE_ERROR,
    ErrorCode.MISSING_INPUT,
    ErrorCode.UNEXPECTED_INPUT,
    ErrorCode.BAD_DTYPE,
    ErrorCode.BAD_SHAPE,
    ErrorCode.SEQUENCE_TOO_LONG,
    ErrorCode.UNSUPPORTED_TASK,
    ErrorCode.BAD_REQUEST,
    ErrorCode.BAD_REPLY_TOPIC,
}


_GENERIC = {
    503: "the model's servers cannot take this call now; retry shortly",
    500: "the call failed inside the system; retry, or report its request id",
}


def from_error_code(code: ErrorCode | None, message: str, *, retry_after_s: int) -> ApiError:
    """The answer to an error result of the system. A caller's own mistake (4xx) is
    answered with the system's message; a failure inside (5xx, a shed call) with a
    generic one, the system's message kept as the answer's ``detail`` for the logs."""
    name = code.name.lower() if code is not None else "unknown"
    if code in (ErrorCode.UNKNOWN_MODEL, ErrorCode.UNKNOWN_VERSION):
        return ApiError.model_not_found(message)
    if code in _INVALID:
        return ApiError(400, message, type=ErrorType.INVALID_REQUEST, code=name)
    if code is ErrorCode.PAYLOAD_TOO_LARGE:
        return ApiError.too_large(message)
    if code in (ErrorCode.SHED, ErrorCode.ENGINE_UNAVAILABLE):
        return ApiError(
            503,
            _GENERIC[503],
            type=ErrorType.OVERLOADED,
            code=name,
            retry_after_s=retry_after_s,
            detail=message,
        )
    if code is ErrorCode.DEADLINE_EXCEEDED:
        return ApiError(504, message, type=ErrorType.TIMEOUT, code=name)
    return ApiError(500, _GENERIC[500], type=ErrorType.SERVER, code=name, detail=message)
