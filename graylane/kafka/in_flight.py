"""The cycles a pipelined consume loop has handled and not committed yet (pure).

A cycle is one turn's records, open while their sends are being acknowledged; the
loop goes on fetching while fewer than its cap are open. :class:`InFlightCycles` is the
bookkeeping only (no I/O, no clock): which offsets may be committed (the prefix of
settled cycles, in fetch order), where to read again after a failure
(:class:`Replay`), what to forget when partitions go to another member.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from aiokafka import TopicPartition

from graylane.kafka.delivery import first_offsets, next_offsets
from graylane.kafka.seam import Record

__all__ = ["InFlightCycles", "Replay"]


@dataclass
class _Tracked:
    """One cycle as :class:`InFlightCycles` sees it: where its records begin and end."""

    first: dict[TopicPartition, int]
    next: dict[TopicPartition, int]
    settled: bool = False


@dataclass(frozen=True)
class Replay:
    """What a failed cycle asks for: seek to ``offsets`` (per partition, the first record
    of the failed cycle and of every later one), and the cycles no longer tracked."""

    offsets: dict[TopicPartition, int]
    dropped: tuple[int, ...]


class InFlightCycles:
    """The cycles a pipelined loop has handled and not committed yet, in fetch order (pure).

    A cycle is one turn's records, open while their sends are being acknowledged. Cycles
    settle in any order; only the prefix of settled cycles becomes committable (per
    partition, the highest next offset of that prefix), so a committed offset never
    passes a record whose sends are not all acknowledged. A failed cycle drops itself
    and every later one (they are read again: :class:`Replay`). At most ``cap`` cycles
    are tracked at once; a settled cycle counts until the ones before it settle too.
    """

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError("at least one cycle in flight")
        self.cap = cap
        self._cycles: dict[int, _Tracked] = {}  # insertion order: fetch order
        self._ready: dict[TopicPartition, int] = {}
        self.opened = 0
        """Cycles opened so far; the next one's key."""

    def __len__(self) -> int:
        return len(self._cycles)

    @property
    def full(self) -> bool:
        return len(self._cycles) >= self.cap

    @property
    def keys(self) -> list[int]:
        """The tracked cycles, oldest first."""
        return list(self._cycles)

    @property
    def ready(self) -> dict[TopicPartition, int]:
        """The offsets to commit: the settled prefix's, not yet committed."""
        return dict(self._ready)

    def tracks(self, key: int) -> bool:
        return key in self._cycles

    def settled(self, key: int) -> bool:
        return key in self._cycles and self._cycles[key].settled

    def partitions(self, key: int) -> set[TopicPartition]:
        return set(self._cycles[key].next)

    @property
    def partitions_held(self) -> set[TopicPartition]:
        """Every partition a tracked cycle or a ready offset is on."""
        held = set(self._ready)
        for cycle in self._cycles.values():
            held.update(cycle.next)
        return held

    def open(self, records: Sequence[Record]) -> int:
        """Track a new cycle of ``records`` (fetched after every tracked one); its key."""
        if self.full:
            raise ValueError(f"{self.cap} cycles in flight already")
        if not records:
            raise ValueError("a cycle has records")
        key, self.opened = self.opened, self.opened + 1
        self._cycles[key] = _Tracked(first_offsets(records), next_offsets(records))
        return key

    def settle(self, key: int) -> bool:
        """Every send of cycle ``key`` is acknowledged; False if it is no longer tracked."""
        cycle = self._cycles.get(key)
        if cycle is None:
            return False
        cycle.settled = True
        return True

    def advance(self) -> list[int]:
        """Move the settled prefix into :attr:`ready`; the keys it held."""
        done: list[int] = []
        for key, cycle in list(self._cycles.items()):
            if not cycle.settled:
                break
            del self._cycles[key]
            done.append(key)
            for tp, offset in cycle.next.items():
                self._ready[tp] = max(self._ready.get(tp, offset), offset)
        return done

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        """``offsets`` are committed (or given up): they are no longer :attr:`ready`."""
        for tp, offset in offsets.items():
            if tp in self._ready and self._ready[tp] <= offset:
                del self._ready[tp]

    def fail(self, key: int) -> Replay:
        """Cycle ``key`` failed: it and every later cycle are dropped, to be read again."""
        if key not in self._cycles:
            return Replay({}, ())
        keys = list(self._cycles)
        dropped = tuple(keys[keys.index(key) :])
        offsets: dict[TopicPartition, int] = {}
        for k in dropped:
            for tp, offset in self._cycles.pop(k).first.items():
                offsets[tp] = min(offsets.get(tp, offset), offset)
        return Replay(offsets, dropped)

    def forget(self, partitions: Collection[TopicPartition]) -> list[int]:
        """``partitions`` went to another member: nothing of them is committed or rewound
        here any more (their next owner reads from the last commit). A cycle left with no
        partition is dropped; the keys dropped."""
        for tp in partitions:
            self._ready.pop(tp, None)
        dropped: list[int] = []
        for key, cycle in list(self._cycles.items()):
            for tp in partitions:
                cycle.first.pop(tp, None)
                cycle.next.pop(tp, None)
            if not cycle.next:
                del self._cycles[key]
                dropped.append(key)
        return dropped

    def clear(self) -> list[int]:
        """Stop tracking everything (the loop ends); the keys dropped."""
        dropped = list(self._cycles)
        self._cycles.clear()
        self._ready.clear()
        return dropped
