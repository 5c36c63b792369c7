"""deliver_and_commit across a rebalance: revoked partitions are not committed, no crash."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from graylane.kafka.delivery import deliver_and_commit

T = "requests.m.v1"


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int


@dataclass
class Consumer:
    """Just what deliver_and_commit touches: assignment() and commit()."""

    assigned: set[TopicPartition]
    refuse: Exception | None = None
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if self.refuse is not None:
            raise self.refuse
        missing = [tp for tp in offsets if tp not in self.assigned]
        if missing:  # what aiokafka does
            raise IllegalStateError(f"Partition {missing[0]} is not assigned")
        self.commits.append(dict(offsets))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        raise AssertionError("no rewind expected")


async def nothing() -> list[object]:
    return []


RECORDS = [Rec(T, 0, 4), Rec(T, 0, 5), Rec(T, 2, 9)]


async def test_only_partitions_still_assigned_are_committed() -> None:
    # a second replica joined mid-batch and took partition 2
    consumer = Consumer({TopicPartition(T, 0), TopicPartition(T, 1)})
    assert await deliver_and_commit(consumer, RECORDS, nothing)  # type: ignore[arg-type]
    assert consumer.commits == [{TopicPartition(T, 0): 6}]


async def test_every_partition_revoked_commits_nothing() -> None:
    consumer = Consumer(set())
    assert await deliver_and_commit(consumer, RECORDS, nothing)  # type: ignore[arg-type]
    assert consumer.commits == []


@pytest.mark.parametrize(
    "refusal", [CommitFailedError("rebalanced"), IllegalStateError("not assigned")]
)
async def test_a_commit_refused_by_the_group_does_not_end_the_service(refusal: Exception) -> None:
    consumer = Consumer({TopicPartition(T, 0), TopicPartition(T, 2)}, refuse=refusal)
    assert await deliver_and_commit(consumer, RECORDS, nothing)  # type: ignore[arg-type]
    assert consumer.commits == []
