"""How much a request matters when the system is overloaded: the caller's priority.

The gateway takes it from a header and sends it as the request's ``priority`` tag;
workers read the tag to shed less urgent requests first. Producers writing to Kafka
directly may set the tag themselves.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["PRIORITY_TAG", "Priority"]

PRIORITY_TAG = "priority"
"""The request tag that carries the caller's priority."""


class Priority(Enum):
    """How much a call matters when the system is overloaded."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"
