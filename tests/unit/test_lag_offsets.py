"""Consumer lag as the policy engine reads it (committed offsets) and as a worker
reports it in telemetry (its own position)."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.observer import WorkerObserver
from graylane.kafka.reading import group_lag

TOPIC = "p.requests.m.v2"


class Ends:
    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends[tp.partition] for tp in partitions}


class Groups:
    def __init__(self, committed: dict[int, int]) -> None:
        self.committed = committed
        self.asked: list[str] = []

    async def list_consumer_group_offsets(
        self, group_id: str, group_coordinator_id: int | None = None, partitions: Any = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        self.asked.append(group_id)
        return {
            TopicPartition(TOPIC, p): OffsetAndMetadata(o, "") for p, o in self.committed.items()
        }


async def test_group_lag_sums_partitions_from_committed_offsets() -> None:
    groups = Groups({0: 5, 1: 7})
    offsets = await group_lag(Ends({0: 10, 1: 7}), groups, "p-worker-m-v2", TOPIC, 2)
    assert (offsets.end, offsets.committed, offsets.lag) == (17, 12, 5)
    assert groups.asked == ["p-worker-m-v2"]


async def test_a_group_that_never_committed_has_unknown_committed_and_full_lag() -> None:
    offsets = await group_lag(Ends({0: 10, 1: 4}), Groups({0: 3}), "g", TOPIC, 2)
    assert offsets.committed is None and offsets.lag == 14 - 3


class Consumer:
    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)}

    def highwater(self, partition: TopicPartition) -> int | None:
        return 20

    async def position(self, partition: TopicPartition) -> int:
        return 20 - 3 * (partition.partition + 1)


async def test_the_worker_keeps_its_lag_for_telemetry() -> None:
    observer = WorkerObserver(WorkerConfig(model="m", version="v2", initial_variant="fp32"))
    assert observer.lag == 0
    await observer.observe_lag(Consumer(), every_s=0.0)  # type: ignore[arg-type]
    assert observer.lag == 3 + 6
