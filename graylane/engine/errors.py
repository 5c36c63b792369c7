"""Engine failures, each carrying whether trying again can help.

Input errors carry the :class:`~graylane.errors.ErrorCode` a worker answers with, so
callers branch on the type (or its ``code``), never on the message text.
"""

from __future__ import annotations

from graylane.errors import ErrorCode, GraylaneError

__all__ = [
    "BadDtype",
    "BadShape",
    "EngineClosedError",
    "EngineError",
    "EngineLoadError",
    "EngineRunError",
    "IncompatibleEngineError",
    "InvalidInputError",
    "MissingInput",
    "UnexpectedInput",
]


class EngineError(GraylaneError):
    """Base of every engine failure; ``retriable`` says whether a retry can succeed."""

    retriable = False


class EngineLoadError(EngineError):
    """An engine file could not be read, parsed or placed on its device."""


class IncompatibleEngineError(EngineLoadError):
    """An engine was built for another GPU architecture or library version."""


class EngineRunError(EngineError):
    """The runtime failed while executing a batch (device error, out of memory)."""

    retriable = True


class EngineClosedError(EngineError):
    """The engine was closed and can no longer run."""


class InvalidInputError(EngineError, ValueError):
    """A request's tensors do not match the engine's inputs (name, dtype, rank, size)."""

    code = ErrorCode.BAD_REQUEST
    """The error code a request refused for this failure is answered with."""


class MissingInput(InvalidInputError):
    """An input the engine needs was not given."""

    code = ErrorCode.MISSING_INPUT


class UnexpectedInput(InvalidInputError):
    """An input was given that the engine does not take."""

    code = ErrorCode.UNEXPECTED_INPUT


class BadDtype(InvalidInputError):
    """A tensor's element type is not the one expected."""

    code = ErrorCode.BAD_DTYPE


class BadShape(InvalidInputError):
    """A tensor's shape (rank, a fixed size, a shared axis, its byte length) does not fit."""

    code = ErrorCode.BAD_SHAPE
