"""Graylane's exception families, each carrying its own retry policy."""

from __future__ import annotations


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
