"""Ids for batch telemetry: (worker, partition, first offset, attempt).

A rewind or a restart re-sends a batch with the same (worker, partition, first offset),
so the policy engine counts it once; ``attempt`` says how often this process ran it.
"""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from graylane.v1 import telemetry_pb2

__all__ = ["BatchIds"]

_REMEMBERED = 4096


class BatchIds:
    """Hands out batch ids and remembers the last attempts (bounded)."""

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id
        self._attempts: dict[tuple[int, int], int] = {}

    def of(self, first: ConsumerRecord[bytes, bytes]) -> telemetry_pb2.BatchId:
        """Who ran the batch starting at ``first``, and how often this process did."""
        where = (first.partition, first.offset)
        attempt = self._attempts.pop(where, -1) + 1
        self._attempts[where] = attempt
        while len(self._attempts) > _REMEMBERED:
            del self._attempts[next(iter(self._attempts))]
        return telemetry_pb2.BatchId(
            worker_id=self._worker_id,
            partition=first.partition,
            first_offset=first.offset,
            attempt=attempt,
        )
