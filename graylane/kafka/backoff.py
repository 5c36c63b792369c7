"""Capped, jittered exponential backoff between the consume loop's retries (pure).

:class:`BackoffPolicy` says how long the ``n``-th failure in a row waits; :class:`Backoff`
counts the failures and is reset by a success. The random source is passed in, so a
test fixes the delays.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Backoff", "BackoffPolicy"]


@dataclass(frozen=True, kw_only=True)
class BackoffPolicy:
    """Delay ``n`` (from 0) is ``min(cap, base * factor**n)``, scaled by a jitter.

    ``jitter`` is the share of the delay drawn at random: 0.5 gives a delay in
    ``[d/2, d]`` ("equal jitter"), 1.0 gives ``[0, d]`` ("full jitter").
    """

    base_s: float = 0.2
    factor: float = 2.0
    cap_s: float = 10.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s or self.factor < 1:
            raise ValueError("backoff needs 0 < base <= cap and factor >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a share between 0 and 1")

    def ceiling(self, attempt: int) -> float:
        """The delay before jitter for the ``attempt``-th failure in a row (0-based)."""
        if attempt < 0:
            raise ValueError("attempt counts from 0")
        # no float overflow: stop multiplying once the cap is reached
        delay = self.base_s
        for _ in range(attempt):
            delay *= self.factor
            if delay >= self.cap_s:
                return self.cap_s
        return min(delay, self.cap_s)

    def delay(self, attempt: int, unit: float) -> float:
        """The delay for ``attempt``, with ``unit`` a random number in [0, 1)."""
        ceiling = self.ceiling(attempt)
        return ceiling * (1.0 - self.jitter) + ceiling * self.jitter * unit


@dataclass
class Backoff:
    """Failures in a row under a :class:`BackoffPolicy`; reset on success (pure:
    the random source is passed in)."""

    policy: BackoffPolicy = field(default_factory=BackoffPolicy)
    rand: Callable[[], float] = random.random
    failures: int = 0

    def next_delay(self) -> float:
        """Count one more failure; the seconds to wait before trying again."""
        delay = self.policy.delay(self.failures, self.rand())
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
