"""Consumer lag from what a consumer already knows (no extra broker round trip)."""

from __future__ import annotations

from typing import Protocol

from aiokafka import TopicPartition

__all__ = ["LagSource", "consumer_lag"]


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
