"""When a broken engine is reloaded, and when the worker gives up (pure).

A worker whose engine fails every batch would otherwise answer
``ENGINE_FAILURE`` for ever. :class:`EngineHealth` counts *consecutive* engine
failures: after ``limit`` of them the worker reloads its engines once
(:attr:`EngineVerdict.RELOAD`); if the next ``limit`` batches fail too, it exits
non-zero (:attr:`EngineVerdict.EXIT`), so its supervisor restarts it and a
rollout sees the version as unresponsive. A served batch resets the count and
re-arms the reload.

Only engine failures count: input errors (a bad request), ``SHED`` and faults
injected on purpose for tests and demos never reach :meth:`EngineHealth.failed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["EngineHealth", "EngineVerdict", "WorkerGaveUp"]


class EngineVerdict(Enum):
    CONTINUE = "continue"
    """Keep serving with the engine as it is."""
    RELOAD = "reload"
    """Reload the engines (same variants, same artifacts) once."""
    EXIT = "exit"
    """The reload did not help: end the worker with a non-zero status."""


class WorkerGaveUp(RuntimeError):
    """The engine kept failing after a reload; the worker ends (its supervisor restarts it)."""


@dataclass
class EngineHealth:
    """Consecutive engine failures of one worker, and whether it already reloaded."""

    limit: int = 5
    """Consecutive failed batches before a reload (and again before giving up); 0 = never."""
    consecutive: int = 0
    reloaded: bool = False
    last_error: str = ""

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"engine failure limit must be >= 0, got {self.limit}")

    def served(self) -> None:
        """A batch ran on the engine (input errors of single items included)."""
        self.consecutive = 0
        self.reloaded = False

    def failed(self, reason: str) -> EngineVerdict:
        """A batch failed in the engine; what the worker must do now."""
        self.last_error = reason
        if self.limit == 0:
            return EngineVerdict.CONTINUE
        self.consecutive += 1
        if self.consecutive < self.limit:
            return EngineVerdict.CONTINUE
        self.consecutive = 0
        if self.reloaded:
            return EngineVerdict.EXIT
        self.reloaded = True
        return EngineVerdict.RELOAD

    def give_up(self) -> WorkerGaveUp:
        return WorkerGaveUp(
            f"engine failed {self.limit} consecutive batches after a reload; "
            f"last error: {self.last_error}"
        )
