"""Consumer lag: from what a consumer already knows (no extra broker round trip),
or from a group's committed offsets (the broker's view, with no consumer of the group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

__all__ = ["LagSource", "TopicOffsets", "consumer_lag", "group_lag"]


class LagSource(Protocol):
    def assignment(self) -> set[TopicPartition]: ...

    def highwater(self, partition: TopicPartition) -> int | None: ...

    async def position(self, partition: TopicPartition) -> int: ...


async def consumer_lag(consumer: LagSource) -> dict[str, int]:
    """Records not yet consumed per topic: high watermark minus position, over assigned
    partitions whose watermark a fetch has reported (others count 0 until then)."""
    lag: dict[str, int] = {}
    for tp in consumer.assignment():
        high = consumer.highwater(tp)
        behind = 0 if high is None else max(0, high - await consumer.position(tp))
        lag[tp.topic] = lag.get(tp.topic, 0) + behind
    return lag


@dataclass(frozen=True)
class TopicOffsets:
    """A topic's end offsets and a group's committed offsets on it, summed over partitions.

    ``committed`` is None when the group has committed nothing on some partition
    (never consumed it); ``lag`` then counts those partitions from offset 0.
    """

    end: int
    committed: int | None
    lag: int


class EndOffsets(Protocol):
    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...


class GroupOffsets(Protocol):
    async def list_consumer_group_offsets(
        self, group_id: str, group_coordinator_id: int | None = None, partitions: Any = None
    ) -> dict[TopicPartition, OffsetAndMetadata]: ...


async def group_lag(
    ends: EndOffsets, groups: GroupOffsets, group_id: str, topic: str, partitions: int
) -> TopicOffsets:
    """The lag of ``group_id`` on ``topic`` from the broker's view (its committed offsets),
    so it is known whether or not the group's consumers are alive."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    end = await ends.end_offsets(tps)
    committed = await groups.list_consumer_group_offsets(group_id, partitions=tps)
    offsets = [committed.get(tp) for tp in tps]
    known = [o.offset if o is not None and o.offset >= 0 else None for o in offsets]
    highs = [end.get(tp, 0) for tp in tps]
    return TopicOffsets(
        end=sum(highs),
        committed=None if None in known else sum(k or 0 for k in known),
        lag=sum(max(0, e - (k or 0)) for e, k in zip(highs, known, strict=True)),
    )
