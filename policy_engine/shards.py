"""The models this policy-engine instance decides for: one core per owned partition.

Unsharded (``partitions`` 0), one :class:`~graylane.policy_engine.core.PolicyCore`
decides for every model, as it always did. Sharded, the consumer group assigns this
instance some partitions of the co-partitioned telemetry, commands and outcomes topics;
each owned partition has a core of its own holding only the models on it
(:func:`~graylane.policy_engine.logic.shards.partition_of`). On assignment a partition's
core is rebuilt from the compacted control topics filtered to its models
(:func:`restrict`), with epochs fenced by the generation it was taken in
(:class:`FencedEpochs`); on revocation the core is dropped and this instance no longer
decides for those models. Records of a partition being restored wait for it
(:meth:`ShardMap.core_for`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from graylane import serde
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.isolation import RecordGuard
from graylane.policy_engine.logic.shards import (
    ShardOwnership,
    keeps_state,
    partition_of,
    session_lapsed,
)
from graylane.policy_engine.state import Epochs
from graylane.policy_engine.wire import Restored
from graylane.v1 import audit_pb2, control_pb2, rollout_pb2

__all__ = [
    "FencedEpochs",
    "OwnedShard",
    "ShardMap",
    "newest_by_epoch",
    "precision_epoch",
    "restrict",
    "rollout_epoch",
    "routing_epoch",
    "scale_epoch",
]

K = TypeVar("K", bound=Hashable)


class FencedEpochs(Epochs[K]):
    """Epochs that a new owner writes above ``floor`` (the generation it took its
    partition in), whatever lower epochs it read back: every key's current epoch is at
    least ``floor``, so the next one written is above it."""

    def __init__(self, floor: int) -> None:
        super().__init__()
        self.floor = floor

    def current(self, key: K) -> int:
        return max(self._highest.get(key, 0), self.floor)

    def note(self, key: K, epoch: int) -> bool:
        """Take an epoch read back or written; whether it is the newest written (the floor
        is not one: a record read back below it still says what runs)."""
        newest = epoch >= self._highest.get(key, 0)
        if newest:
            self._highest[key] = epoch
        return newest


def fence_core(core: PolicyCore, floor: int) -> None:
    """Every epoch ``core`` writes from now on starts above ``floor`` (before restore)."""
    core.routing.epochs = FencedEpochs(floor)
    core.qos.precision = FencedEpochs(floor)
    core.scaling.epochs = FencedEpochs(floor)


def restrict(restored: Restored, keep: Callable[[str], bool]) -> Restored:
    """What ``restored`` holds of the models ``keep`` accepts (skips stay with it)."""
    return Restored(
        states=[(state, spec) for state, spec in restored.states if keep(spec.model)],
        epochs={m: e for m, e in restored.epochs.items() if keep(m)},
        tables={m: t for m, t in restored.tables.items() if keep(m)},
        precision={k: v for k, v in restored.precision.items() if keep(k.model)},
        qos_policies=[p for p in restored.qos_policies if keep(p.model)],
        scale={k: v for k, v in restored.scale.items() if keep(k.model)},
        skipped=list(restored.skipped),
    )


def newest_by_epoch(
    records: Iterable[tuple[bytes | None, bytes | None]], epoch_of: Callable[[bytes], int]
) -> dict[bytes, bytes | None]:
    """The value per key of a compacted topic's ``(key, value)`` records in log order: the
    latest, unless an earlier one has a higher epoch. An instance that lost its partition
    but wrote on (a zombie) writes lower epochs than the new owner, later in the log; its
    records are passed over. A tombstone deletes whatever came before; a value whose epoch
    cannot be read counts as epoch -1 (restore skips and audits it when it is the only one).
    """
    newest: dict[bytes, tuple[int, bytes | None]] = {}
    for key, value in records:
        if key is None:
            continue
        if value is None:
            newest[key] = (-1, None)
            continue
        try:
            epoch = epoch_of(value)
        except Exception:  # undecodable: restore says so
            epoch = -1
        before = newest.get(key)
        if before is None or before[1] is None or epoch >= before[0]:
            newest[key] = (epoch, value)
    return {key: value for key, (_, value) in newest.items()}


def routing_epoch(value: bytes) -> int:
    return int(serde.decode(control_pb2.RoutingTable, value).epoch)


def precision_epoch(value: bytes) -> int:
    return int(serde.decode(control_pb2.PrecisionCommand, value).epoch)


def scale_epoch(value: bytes) -> int:
    return int(serde.decode(control_pb2.ScaleRequest, value).epoch)


def rollout_epoch(value: bytes) -> int:
    return int(serde.decode(rollout_pb2.RolloutState, value).epoch)


@dataclass
class OwnedShard:
    """A partition this instance owns, its core, and whether the core is restored."""

    ownership: ShardOwnership
    core: PolicyCore
    decided_by: audit_pb2.RunningBuild
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class ShardMap:
    """The owned partitions' cores (sharded), or the one core that decides for all."""

    def __init__(
        self,
        make_core: Callable[[], PolicyCore],
        decided_by: audit_pb2.RunningBuild,
        *,
        sharded: bool = False,
    ) -> None:
        self.sharded = sharded
        self.partitions = 0
        """Of the co-partitioned topics (read at start, before any assignment)."""
        self._make_core = make_core
        self._decided_by = decided_by
        self.guard = RecordGuard()  # one for every core: a skip is audited once
        self._shards: dict[int, OwnedShard] = {}
        self._generation: int | None = None
        self.paused = False
        """Set from a revocation to the next assignment: no decisions meanwhile."""
        self.settled = asyncio.Event()
        """Set while the group's assignment is known here: records wait for it (faust
        may resume fetching a new partition before this instance has taken it on)."""
        self._last_tick_s: float | None = None
        self._hold_until_s = 0.0
        self.lock = asyncio.Lock()
        """Held by a tick while it decides and publishes, and by a rebalance."""
        if not sharded:
            self._add(ShardOwnership(0, 0, decided_by.instance))
            self.settled.set()

    def may_decide(self, now_s: float, session_s: float) -> bool:
        """Whether a tick at ``now_s`` (a monotonic clock) may decide. After a silence
        longer than the group session (:func:`session_lapsed`), not until the group has
        assigned partitions again, or at most two sessions later (a process starved while
        its consumer kept the session alive gets no new assignment)."""
        if self.sharded and session_lapsed(self._last_tick_s, now_s, session_s):
            self._hold_until_s = now_s + 2 * session_s
        self._last_tick_s = now_s
        return not self.paused and now_s >= self._hold_until_s

    def _add(self, ownership: ShardOwnership) -> OwnedShard:
        core = self._make_core()
        core.guard = self.guard
        decided_by = audit_pb2.RunningBuild()
        decided_by.CopyFrom(self._decided_by)
        if self.sharded:
            fence_core(core, ownership.floor)
            decided_by.generation = ownership.generation
            decided_by.partition = ownership.partition
        shard = OwnedShard(ownership, core, decided_by)
        self._shards[ownership.partition] = shard
        return shard

    def owned(self) -> list[OwnedShard]:
        return [self._shards[p] for p in sorted(self._shards)]

    def ready(self) -> list[OwnedShard]:
        return [s for s in self.owned() if s.ready.is_set()]

    def shard_of(self, model: str) -> OwnedShard | None:
        if not self.sharded:
            return self._shards.get(0)
        return self._shards.get(partition_of(model, self.partitions))

    async def core_for(self, model: str) -> PolicyCore | None:
        """The core deciding for ``model`` once it is restored; None when not owned here."""
        await self.settled.wait()
        shard = self.shard_of(model)
        if shard is None:
            return None
        await shard.ready.wait()
        return shard.core if self.shard_of(model) is shard else None

    def revoking(self) -> None:
        """A rebalance began: no decision, and no record taken, until :meth:`reassign`."""
        self.paused = True
        self.settled.clear()

    def reassign(
        self, partitions: Iterable[int], generation: int
    ) -> tuple[list[OwnedShard], list[OwnedShard]]:
        """The group's assignment in ``generation``: the shards dropped, and the new ones
        (fresh cores, to restore). A partition kept from the generation just before
        keeps its core; after a gap (generations this instance missed, when another may
        have owned it) every partition is taken anew."""
        wanted = set(partitions)
        kept = keeps_state(self._generation, generation)
        self._generation = generation
        self._last_tick_s, self._hold_until_s = None, 0.0  # assigned: a fresh start
        gone = [shard for p, shard in sorted(self._shards.items()) if p not in wanted or not kept]
        for shard in gone:
            self._drop(shard.ownership.partition)
        new = [
            self._add(ShardOwnership(p, generation, self._decided_by.instance))
            for p in sorted(wanted - set(self._shards))
        ]
        self.paused = False
        self.settled.set()
        return gone, new

    def _drop(self, partition: int) -> None:
        shard = self._shards.pop(partition, None)
        if shard is not None:
            shard.ready.set()  # records waiting for it go on, and find it gone

    def models_of(self, partition: int) -> Callable[[str], bool]:
        return lambda model: partition_of(model, self.partitions) == partition
