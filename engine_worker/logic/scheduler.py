"""Iteration-level scheduling of a running decode batch (pure).

Between two decode steps, finished sequences leave the batch and waiting ones join it
(first in, first out) while there are free rows, so a short request never waits for
the longest one in its batch. The scheduler only decides *who* runs; the decode loop
(:class:`~graylane.engine_worker.kv_decode.KvDecodeLoop`) keeps the caches, with row
``r`` of every cache tensor belonging to ``running[r]``. Row order is stable: leaving
removes rows without reordering the others, and joiners are appended after the running
rows in arrival order. Admission is bounded by rows, by the prompt tokens prefilled per
step and by the cache positions the running rows reserve together.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from graylane.errors import GraylaneError

__all__ = ["DecodeJoin", "DecodeScheduler", "SchedulerError", "SchedulerLimits"]


class SchedulerError(GraylaneError, ValueError):
    """A sequence id is unknown, duplicated, or a limit is not positive."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerLimits:
    """How much one step may hold."""

    max_batch_size: int
    """Rows in the running decode batch."""
    max_prefill_tokens: int | None = None
    """Prompt tokens admitted per step (at least one prompt always joins); ``None``: no cap."""
    max_kv_tokens: int | None = None
    """Cache positions the running rows may reserve together (each row reserves its prompt
    plus its ``max_new_tokens``; one row always runs); ``None``: no cap."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise SchedulerError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise SchedulerError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.max_kv_tokens is not None and self.max_kv_tokens < 1:
            raise SchedulerError(f"max_kv_tokens must be >= 1, got {self.max_kv_tokens}")


@dataclass(frozen=True, slots=True)
class DecodeJoin:
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
        self._reserved: dict[int, int] = {}
        """Cache positions each known sequence may grow to (prompt + max new tokens)."""

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

    @property
    def reserved_kv_tokens(self) -> int:
        """Cache positions the running rows reserve together."""
        return sum(self._reserved[s] for s in self._running)

    def submit(self, seq_id: int, prompt_len: int, reserve: int | None = None) -> None:
        """Queue a sequence; it joins at a later :meth:`admit`.

        ``reserve``: the cache positions it may grow to (default: its prompt).
        """
        if seq_id in self._known:
            raise SchedulerError(f"sequence {seq_id} was already submitted")
        if prompt_len < 1:
            raise SchedulerError(f"sequence {seq_id}: prompt must be non-empty")
        self._known.add(seq_id)
        self._reserved[seq_id] = max(prompt_len, reserve or 0)
        self._waiting.append((seq_id, prompt_len))

    def withdraw(self, seq_id: int) -> bool:
        """Remove a waiting sequence (it never ran); False if it is not waiting."""
        for entry in self._waiting:
            if entry[0] == seq_id:
                self._waiting.remove(entry)
                self._known.discard(seq_id)
                self._reserved.pop(seq_id, None)
                return True
        return False

    def admit(self) -> DecodeJoin:
        """Move waiting sequences into free rows; the caller prefills them next."""
        first_row = len(self._running)
        free = self.limits.max_batch_size - first_row
        budget = self.limits.max_prefill_tokens
        kv_budget = self.limits.max_kv_tokens
        kv = self.reserved_kv_tokens
        joining: list[int] = []
        tokens = 0
        while self._waiting and len(joining) < free:
            seq_id, length = self._waiting[0]
            if joining and budget is not None and tokens + length > budget:
                break
            reserve = self._reserved[seq_id]
            if kv_budget is not None and (self._running or joining) and kv + reserve > kv_budget:
                break
            self._waiting.popleft()
            joining.append(seq_id)
            tokens += length
            kv += reserve
        self._running.extend(joining)
        return DecodeJoin(tuple(joining), first_row)

    def leave(self, seq_ids: Iterable[int]) -> tuple[int, ...]:
        """Remove finished sequences; returns the rows that stay, in their old positions."""
        gone = set(seq_ids)
        unknown = gone - set(self._running)
        if unknown:
            raise SchedulerError(f"sequences {sorted(unknown)} are not running")
        kept = tuple(row for row, seq_id in enumerate(self._running) if seq_id not in gone)
        self._running = [self._running[row] for row in kept]
        self._known -= gone
        for seq_id in gone:
            self._reserved.pop(seq_id, None)
        return kept
