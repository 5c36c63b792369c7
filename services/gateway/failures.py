"""What a refused or failed call answers: an HTTP status and an error body (pure).

One :class:`ApiError` per failure, whatever raised it: the edge (auth, rate limit,
size caps, a malformed body), the SDK (an unknown model, a timeout) or the system
(an error result). Each carries its :class:`~graylane.errors.ErrorCode`, and the code
gives the HTTP status (:attr:`~graylane.errors.ErrorCode.http_status`) and OpenAI's
error type (the table below). It renders as OpenAI's error body (``{"error":
{"message", "type", "param", "code"}}``) on the ``/v1`` endpoints and as the Open
Inference Protocol's (``{"error": "..."}``) on ``/v2``. Overload answers (429, 503)
carry ``Retry-After``.
"""

from __future__ import annotations

from enum import Enum
from http import HTTPStatus
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


_TYPE_OF_STATUS = {
    HTTPStatus.FORBIDDEN: ErrorType.PERMISSION,
    HTTPStatus.TOO_MANY_REQUESTS: ErrorType.RATE_LIMIT,
    HTTPStatus.SERVICE_UNAVAILABLE: ErrorType.OVERLOADED,
    HTTPStatus.GATEWAY_TIMEOUT: ErrorType.TIMEOUT,
}
_TYPE_OF_CODE = {ErrorCode.NOT_FOUND: ErrorType.NOT_FOUND}
"""OpenAI's ``type`` of a code: by its status, 4xx otherwise an invalid request and 5xx
otherwise a server error; an unknown model stays an invalid request, as OpenAI has it."""

_OPENAI_CODE = {
    ErrorCode.UNAUTHENTICATED: "invalid_api_key",
    ErrorCode.PERMISSION_DENIED: "forbidden",
    ErrorCode.RATE_LIMITED: "rate_limit_exceeded",
    ErrorCode.PAYLOAD_TOO_LARGE: "request_too_large",
    ErrorCode.UNKNOWN_MODEL: "model_not_found",
    ErrorCode.UNKNOWN_VERSION: "model_not_found",
}
"""OpenAI's ``code`` string where OpenAI names one; else the code's own name, lower case
(a caller's plain malformed request has none)."""


def openai_type(code: ErrorCode, status: HTTPStatus) -> ErrorType:
    if code in _TYPE_OF_CODE:
        return _TYPE_OF_CODE[code]
    if status in _TYPE_OF_STATUS:
        return _TYPE_OF_STATUS[status]
    return ErrorType.SERVER if status >= 500 else ErrorType.INVALID_REQUEST


class ApiError(GraylaneError):
    """A call answered with an HTTP error: its code's status, unless ``status`` is given
    (the web framework's own answers: an unknown path, a method not allowed)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        openai_code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
        detail: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = HTTPStatus(status) if status is not None else code.http_status
        self.message = message
        self.type = openai_type(code, self.status)
        self.openai_code = openai_code or _OPENAI_CODE.get(code)
        if self.openai_code is None and code is not ErrorCode.BAD_REQUEST:
            self.openai_code = code.name.lower()
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
                "code": self.openai_code,
            }
        }

    def inference_protocol_body(self) -> dict[str, Any]:
        return {"error": self.message}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}

    # -- the edge's own refusals ------------------------------------------------------
    @classmethod
    def invalid(cls, message: str, param: str | None = None) -> ApiError:
        return cls(ErrorCode.BAD_REQUEST, message, param=param)

    @classmethod
    def unauthenticated(cls) -> ApiError:
        return cls(
            ErrorCode.UNAUTHENTICATED,
            "Incorrect API key provided: send 'Authorization: Bearer <key>' with a key this "
            "gateway knows",
        )

    @classmethod
    def forbidden(cls, message: str, param: str | None = None) -> ApiError:
        """The key is known but may not ask for this (a priority, a tag)."""
        return cls(ErrorCode.PERMISSION_DENIED, message, param=param)

    @classmethod
    def rate_limited(cls, tenant: str, retry_after_s: float) -> ApiError:
        wait = max(1, int(-(-retry_after_s // 1)))
        return cls(
            ErrorCode.RATE_LIMITED,
            f"rate limit of tenant {tenant!r} reached; retry after {wait} s",
            retry_after_s=wait,
        )

    @classmethod
    def too_many_in_flight(cls, tenant: str, running: int, retry_after_s: int) -> ApiError:
        """The tenant holds its share of the replica's running calls."""
        return cls(
            ErrorCode.RATE_LIMITED,
            f"tenant {tenant!r} has {running} calls running, its share of this gateway; "
            "retry when one ends",
            openai_code="too_many_in_flight",
            retry_after_s=retry_after_s,
        )

    @classmethod
    def overloaded(cls, message: str, retry_after_s: int) -> ApiError:
        return cls(ErrorCode.OVERLOADED, message, retry_after_s=retry_after_s)

    @classmethod
    def too_large(cls, message: str) -> ApiError:
        return cls(ErrorCode.PAYLOAD_TOO_LARGE, message)

    @classmethod
    def model_not_found(cls, message: str) -> ApiError:
        return cls(ErrorCode.UNKNOWN_MODEL, message, param="model")

    @classmethod
    def timed_out(cls, message: str) -> ApiError:
        return cls(ErrorCode.DEADLINE_EXCEEDED, message, openai_code="timeout")


_GENERIC = {
    HTTPStatus.SERVICE_UNAVAILABLE: "the model's servers cannot take this call now; retry shortly",
    HTTPStatus.INTERNAL_SERVER_ERROR: (
        "the call failed inside the system; retry, or report its request id"
    ),
}


def from_error_code(code: ErrorCode | None, message: str, *, retry_after_s: int) -> ApiError:
    """The answer to an error result of the system. A caller's own mistake (4xx) is
    answered with the system's message; a failure inside (5xx, a shed call) with a
    generic one, the system's message kept as the answer's ``detail`` for the logs."""
    name = code.name.lower() if code is not None else "unknown"
    code = code if code is not None else ErrorCode.ERROR_CODE_UNSPECIFIED
    if code in (ErrorCode.UNKNOWN_MODEL, ErrorCode.UNKNOWN_VERSION):
        return ApiError(code, message, param="model")
    status = code.http_status
    if status not in _GENERIC:
        return ApiError(code, message, openai_code=_OPENAI_CODE.get(code, name))
    retry = retry_after_s if status == HTTPStatus.SERVICE_UNAVAILABLE else None
    return ApiError(code, _GENERIC[status], openai_code=name, retry_after_s=retry, detail=message)
