"""Reads what the router sent each version and what its workers consumed (thin I/O).

Per (model, version): the version topic's end offsets (a consumer without a
group) and the worker group's committed offsets (the admin API), so the lag
is known whether or not a worker is alive. The core turns the samples into
liveness signals (:mod:`graylane.policy_engine.logic.liveness`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from graylane.errors import TopicSetupError
from graylane.kafka.admin import partition_count
from graylane.kafka.reading import group_lag
from graylane.kafka.seam import BatchConsumer, ConsumerOptions, KafkaFactory
from graylane.policy_engine.logic.liveness import OffsetSample
from graylane.policy_engine.state import VersionKey

__all__ = ["LivenessProbe"]

log = logging.getLogger(__name__)


class LivenessProbe:
    """Samples version topics' end offsets and their worker groups' committed offsets."""

    def __init__(self, factory: KafkaFactory) -> None:
        self._factory = factory
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: BatchConsumer | None = None
        self._partitions: dict[str, int] = {}

    async def start(self) -> None:
        self._admin = self._factory.admin()
        await self._admin.start()
        self._consumer = self._factory.consumer(
            options=ConsumerOptions(group_id=None), client_suffix="policy-liveness"
        )
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await self._admin.close()
        self._admin = self._consumer = None

    async def sample(
        self, targets: Iterable[VersionKey], at_ms: int
    ) -> list[tuple[VersionKey, OffsetSample]]:
        """One sample per version that could be read; failures are logged and skipped."""
        if self._admin is None or self._consumer is None:
            return []
        layout = self._factory.layout
        out: list[tuple[VersionKey, OffsetSample]] = []
        for key in targets:
            model, version = key.model, key.version
            topic = layout.version_requests(model, version)
            try:
                if topic not in self._partitions:
                    self._partitions[topic] = await partition_count(self._admin, topic)
                offsets = await group_lag(
                    self._consumer,
                    self._admin,
                    layout.worker_group(model, version),
                    topic,
                    self._partitions[topic],
                )
            except (KafkaError, TopicSetupError) as exc:
                log.warning("liveness of %s/%s not read: %s", model, version, exc)
                continue
            sample = OffsetSample(at_ms, offsets.end, offsets.committed, offsets.lag)
            out.append((key, sample))
        return out
