"""Engine failures, each carrying whether trying again can help."""

from __future__ import annotations


class EngineError(RuntimeError):
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
