"""Idempotent topic set-up and small read helpers over the admin API."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from graylane.errors import TopicSetupError
from graylane.kafka.reading import read_latest_per_key, wait_for_assignment
from graylane.topics import TopicSpec

__all__ = [
    "AdminFactory",
    "TopicSetupReport",
    "describe_topic_configs",
    "ensure_topics",
    "partition_count",
    "read_latest_per_key",
    "wait_for_assignment",
]

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36


class AdminFactory(Protocol):
    """Builds admin clients (:class:`~graylane.kafka.factory.KafkaFactory` does)."""

    def admin(self) -> AIOKafkaAdminClient: ...


@dataclass(frozen=True)
class TopicSetupReport:
    created: tuple[str, ...]
    reconfigured: tuple[str, ...]
    unchanged: tuple[str, ...]


async def describe_topic_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    """The broker's view of a topic's configs (all of them, defaults included)."""
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    configs: dict[str, str] = {}
    for response in responses:
        for resource in response.resources:
            error_code, error_message = resource[0], resource[1]
            if error_code != 0:
                raise TopicSetupError(f"describe configs of {topic}: {error_message or error_code}")
            for entry in resource[4]:
                configs[entry[0]] = entry[1]
    return configs


async def partition_count(admin: AIOKafkaAdminClient, topic: str) -> int:
    for t in await admin.describe_topics([topic]):
        if t["topic"] == topic and t["error_code"] == 0:
            return len(t["partitions"])
    raise TopicSetupError(f"topic {topic} does not exist")


async def ensure_topics(factory: AdminFactory, specs: Sequence[TopicSpec]) -> TopicSetupReport:
    """Create missing topics and bring existing ones to their specified configs.

    Safe to call any number of times, from any number of processes.
    """
    admin = factory.admin()
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        created: list[str] = []
        if missing:
            response = await admin.create_topics(
                [
                    NewTopic(
                        name=s.name,
                        num_partitions=s.partitions,
                        replication_factor=s.replication_factor,
                        topic_configs=s.configs(),
                    )
                    for s in missing
                ]
            )
            for topic_error in response.topic_errors:
                name, code = topic_error[0], topic_error[1]
                message = topic_error[2] if len(topic_error) > 2 else ""
                if code == 0:
                    created.append(name)
                elif code != _TOPIC_ALREADY_EXISTS:
                    raise TopicSetupError(f"cannot create topic {name}: error {code} {message}")
        reconfigured: list[str] = []
        unchanged: list[str] = []
        for spec in specs:
            if spec.name in created:
                continue
            current = await describe_topic_configs(admin, spec.name)
            wanted = spec.configs()
            if all(current.get(k) == v for k, v in wanted.items()):
                unchanged.append(spec.name)
                continue
            # AlterConfigs replaces the topic's dynamic configs as a whole.
            await admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, spec.name, configs=wanted)]
            )
            reconfigured.append(spec.name)
        await _wait_for_leaders(admin, [s.name for s in specs])
        if created:
            # Metadata names a leader a moment before the broker serves offsets for
            # the new partitions; readers starting right away would log retries.
            await asyncio.sleep(0.5)
        if created or reconfigured:
            log.info("topics created=%s reconfigured=%s", created, reconfigured)
        return TopicSetupReport(tuple(created), tuple(reconfigured), tuple(unchanged))
    finally:
        await admin.close()


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, topics: list[str], timeout_s: float = 30.0
) -> None:
    """Wait until every partition of ``topics`` has a leader."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        described = await admin.describe_topics(topics)
        ready = all(
            t["error_code"] == 0
            and t["partitions"]
            and all(p["leader"] >= 0 for p in t["partitions"])
            for t in described
        )
        if ready and len(described) >= len(set(topics)):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TopicSetupError(f"topics without leaders after {timeout_s}s: {topics}")
        await asyncio.sleep(0.2)
