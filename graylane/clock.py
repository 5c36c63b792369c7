"""The one wall clock: milliseconds since the Unix epoch, and the seam to replace it.

Code that decides by time takes a :data:`Clock` (any ``() -> int``) so tests and
replays can pass their own; everything else calls :func:`now_ms`.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "now_ms"]


class Clock(Protocol):
    """Returns the current time in Unix milliseconds."""

    def __call__(self) -> int: ...


def now_ms() -> int:
    """The system clock in Unix milliseconds."""
    return int(time.time() * 1000)
