"""Iteration-level scheduling of a running decode batch (pure logic, no engine).

Between two decode steps, finished sequences leave the batch and waiting ones
join it (first in, first out) while there are free rows, so a short request
never waits for the longest one in its batch. The scheduler only decides *who*
runs; the engine loop (:mod:`graylane.engine_worker.kv_generate`) keeps the
caches, with row ``r`` of every cache tensor belonging to ``running[r]``.

Row order is stable: leaving removes rows without reordering the others, and
joiners are appended after the running rows in arrival order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class SchedulerError(ValueError):
    """A sequence id is unknown, duplicated, or a limit is not positive."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerLimits:
    """How much one step may hold."""

    max_batch_size: int
    """Rows in the running decode batch."""
    max_prefill_tokens: int | None = None
    """Prompt tokens admitted per step (at least one prompt always joins); ``None``: no cap."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise SchedulerError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise SchedulerError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")


@dataclass(frozen=True, slots=True)
class Admission:
    """The sequences that join before the next decode step, in row order after the running ones."""

    joining: tuple[int, ...]
    first_row: int
    """Row of ``joining[0]`` once joined (the running batch's size before they join)."""


class DecodeScheduler:
    """Waiting queue and running rows of one decode loop."""

    def __init__(self, limits: SchedulerLimits) -> None:
        self.limits = limits
        self._waiting: deque[tuple[int, int]] = deque()  # (seq_id, prompt_len)
        self._running: list[int] = []
        self._known: set[int] = set()

    @property
    def running(self) -> tuple[int, ...]:
        """Sequence ids by row."""
        return tuple(self._running)

    @property
    def waiting(self) -> tuple[int, ...]:
        return tuple(seq_id for seq_id, _ in self._waiting)

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    def submit(self, seq_id: int, prompt_len: int) -> None:
        """Queue a sequence; it joins at a later :meth:`admit`."""
        if seq_id in self._known:
            raise SchedulerError(f"sequence {seq_id} was already submitted")
        if prompt_len < 1:
            raise SchedulerError(f"sequence {seq_id}: prompt must be non-empty")
        self._known.add(seq_id)
        self._waiting.append((seq_id, prompt_len))

    def admit(self) -> Admission:
        """Move waiting sequences into free rows; the caller prefills them next."""
        first_row = len(self._running)
        free = self.limits.max_batch_size - first_row
        budget = self.limits.max_prefill_tokens
        joining: list[int] = []
        tokens = 0
        while self._waiting and len(joining) < free:
            seq_id, length = self._waiting[0]
            if joining and budget is not None and tokens + length > budget:
                break
            self._waiting.popleft()
            joining.append(seq_id)
            tokens += length
        self._running.extend(joining)
        return Admission(tuple(joining), first_row)

    def leave(self, seq_ids: Iterable[int]) -> tuple[int, ...]:
        """Remove finished sequences; returns the rows that stay, in their old positions."""
        gone = set(seq_ids)
        unknown = gone - set(self._running)
        if unknown:
            raise SchedulerError(f"sequences {sorted(unknown)} are not running")
        kept = tuple(row for row, seq_id in enumerate(self._running) if seq_id not in gone)
        self._running = [self._running[row] for row in kept]
        self._known -= gone
        return kept


def should_compact(width: int, lengths: Sequence[int], *, min_waste: int = 16) -> bool:
    """Whether a cache ``width`` columns wide should be repacked to its rows' real ``lengths``.

    Rows leave holes (padding, finished neighbours); repacking costs one copy of
    the cache, so do it once at least half the width and ``min_waste`` columns
    are holes in every row.
    """
    if not lengths:
        return width > 0
    waste = width - max(lengths)
    return waste >= min_waste and 2 * waste >= width
