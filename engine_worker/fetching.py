"""The worker's fetch step: one cycle of records from its request consumer.

A thin adapter over the consumer: after the first record it waits for a batch
to fill, for as long and as many rows as the batch learner's current choice
says (else the configured ``max_wait_ms`` and ``max_batch_size``).
"""

from __future__ import annotations

import logging
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from graylane.engine_worker.batch_learner import BatchChoice, BatchLearner
from graylane.engine_worker.config import WorkerConfig
from graylane.kafka.seam import ConsumerOptions
from graylane.topics import TopicLayout

log = logging.getLogger(__name__)


def consumer_options(config: WorkerConfig, layout: TopicLayout) -> ConsumerOptions:
    """The worker's consumer group and fetch sizes, from its config."""
    return ConsumerOptions(
        group_id=config.group_id or layout.worker_group(config.model, config.version),
        max_poll_records=config.max_batch_size * config.fetch_factor,
        fetch_max_wait_ms=max(1, config.max_wait_ms),
    )


class CycleFetch:
    """Fetches the records of one cycle under the learner's batching choice."""

    def __init__(self, config: WorkerConfig, learner: BatchLearner) -> None:
        self.config = config
        self.learner = learner
        self.choice = BatchChoice(config.max_batch_size, float(config.max_wait_ms))
        """The choice of the cycle fetched last (the planner uses it too)."""
        self._steady = self.choice
        """The last choice that was not exploring (logged when it changes)."""

    async def collect(self, consumer: AIOKafkaConsumer) -> list[ConsumerRecord[bytes, bytes]]:
        """Fetch up to max_batch_size*fetch_factor records, waiting after the first one
        for a batch to fill: the learned wait and batch size, else max_wait_ms."""
        if self.config.adaptive_batching:
            choice = self.learner.choose()
            if not choice.exploring and choice != self._steady:
                log.info("batching: up to %d rows, wait %.1f ms", choice.max_batch, choice.wait_ms)
                self._steady = choice
            self.choice = choice
        cap = self.config.max_batch_size * self.config.fetch_factor
        first = await consumer.getmany(timeout_ms=200, max_records=cap)
        records = [r for rs in first.values() for r in rs]
        if not records:
            return records
        deadline = time.monotonic() + self.choice.wait_ms / 1000.0
        while len(records) < self.choice.max_batch:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            more = await consumer.getmany(timeout_ms=left_ms, max_records=cap - len(records))
            records.extend(r for rs in more.values() for r in rs)
        return records
