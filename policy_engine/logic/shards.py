"""Sharding the policy engine by model: which partition a model is on, and how a new
owner's epochs outrank everything written before it.

Everything about one model is keyed by the model's name on co-partitioned topics
(telemetry, commands, outcomes: the same partition count), so Kafka's default
partitioner puts it on the same partition index of each. A policy engine owns the
models of the partitions its consumer group assigned it: :func:`partition_of` is that
partitioner (murmur2 of the key's UTF-8 bytes, like every Kafka client's default).

Fencing by ownership: the group's generation rises at every rebalance. A new owner of
a partition writes routing, precision and scale epochs from :func:`epoch_floor` of the
generation it got the partition in, above anything a previous owner (live or not)
wrote in an earlier generation; readers that never go back to a lower epoch then
refuse what an instance that lost the partition still writes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GENERATION_SHIFT",
    "ShardOwnership",
    "epoch_floor",
    "keeps_state",
    "murmur2",
    "partition_of",
    "session_lapsed",
]

GENERATION_SHIFT = 32
"""An owner's epochs start at ``generation << 32``: 2^32 epochs per key per generation."""

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c), as an unsigned 32-bit integer."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest >= 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_of(model: str, partitions: int) -> int:
    """The partition of ``model``'s records on a topic of ``partitions`` partitions."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(model.encode("utf-8")) & 0x7FFFFFFF) % partitions


def epoch_floor(generation: int) -> int:
    """The epoch above which an owner of ``generation`` writes (0 for generation 0)."""
    if generation < 0:
        raise ValueError(f"negative generation {generation}")
    return generation << GENERATION_SHIFT


@dataclass(frozen=True)
class ShardOwnership:
    """One partition owned by one instance since one generation of the group."""

    partition: int
    generation: int
    instance: str

    @property
    def floor(self) -> int:
        return epoch_floor(self.generation)

    def owns(self, model: str, partitions: int) -> bool:
        return partition_of(model, partitions) == self.partition


def keeps_state(previous: int | None, generation: int) -> bool:
    """Whether a partition this instance owned in ``previous`` and is assigned again in
    ``generation`` keeps its state: only when no generation came between (the group's
    generation rises by one per rebalance, and this instance took part in each). After a
    gap another instance may have owned and decided for it: the state is rebuilt."""
    return previous is not None and generation == previous + 1


def session_lapsed(last_tick_s: float | None, now_s: float, session_s: float) -> bool:
    """Whether this process went silent for longer than its group session (stopped, or
    starved) since its last tick: the group may have given its partitions to another
    instance meanwhile without it knowing yet, so it must not decide from what it held
    until the group has assigned it again."""
    return last_tick_s is not None and now_s - last_tick_s > session_s
