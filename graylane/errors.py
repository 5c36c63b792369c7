"""Graylane's exception families, each carrying its own retry policy."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class GraylaneError(RuntimeError):
    """Base of every Graylane error; ``retriable`` says whether trying again can help."""

    retriable = False


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
