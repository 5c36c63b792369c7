"""Capped exponential backoff with jitter, for the audit sink's restarts (pure)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Delays ``initial_s * factor**n``, capped at ``cap_s``, each spread by ±``jitter``."""

    initial_s: float = 0.5
    cap_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    attempts: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if not (0 < self.initial_s <= self.cap_s) or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff {self!r}")

    def next_delay(self) -> float:
        """The delay before the next attempt (and count this one)."""
        base = min(self.cap_s, self.initial_s * self.factor ** min(self.attempts, 64))
        self.attempts += 1
        spread = base * self.jitter
        return min(self.cap_s, max(0.0, base + self.rng.uniform(-spread, spread)))

    def reset(self) -> None:
        """The last attempt worked: start from ``initial_s`` again."""
        self.attempts = 0
