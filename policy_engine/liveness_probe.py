"""Reads what the router sent each version and what its workers consumed (thin I/O).

Per (model, version): the version topic's end offsets (a consumer without a
group) and the worker group's committed offsets (the admin API), so the lag
is known whether or not a worker is alive. The core turns the samples into
liveness signals (:mod:`graylane.policy_engine.logic.liveness`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from graylane.errors import TopicSetupError
from graylane.kafka.admin import partition_count
from graylane.kafka.reading import GroupTopic, group_lags
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
        admin = self._admin
        keys = list(targets)
        topics = {key: layout.version_requests(key.model, key.version) for key in keys}

        async def count(topic: str) -> int | Exception:
            try:
                return await partition_count(admin, topic)
            except (KafkaError, TopicSetupError) as exc:
                return exc

        unknown = sorted({t for t in topics.values() if t not in self._partitions})
        for topic, counted in zip(unknown, await asyncio.gather(*map(count, unknown)), strict=True):
            if isinstance(counted, Exception):
                log.warning("liveness of %s not read: %s", topic, counted)
            else:
                self._partitions[topic] = counted
        readable = [key for key in keys if topics[key] in self._partitions]
        wanted = [
            GroupTopic(
                layout.worker_group(key.model, key.version),
                topics[key],
                self._partitions[topics[key]],
            )
            for key in readable
        ]
        try:
            lags = await group_lags(self._consumer, admin, wanted)
        except KafkaError as exc:
            log.warning("liveness of %d versions not read: %s", len(wanted), exc)
            return []
        out: list[tuple[VersionKey, OffsetSample]] = []
        for key, offsets in zip(readable, lags, strict=True):
            if isinstance(offsets, KafkaError):
                log.warning("liveness of %s/%s not read: %s", key.model, key.version, offsets)
                continue
            out.append((key, OffsetSample(at_ms, offsets.end, offsets.committed, offsets.lag)))
        return out
