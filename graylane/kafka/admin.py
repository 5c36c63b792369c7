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
    "partition_counts",
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


# DescribeConfigs (v1+) config_source of a config set on the topic itself.
_DYNAMIC_TOPIC_CONFIG = 1


@dataclass(frozen=True)
class _ConfigEntry:
    name: str
    value: str | None
    topic_override: bool  # set on the topic itself, not inherited from the broker
    sensitive: bool


async def _config_entries(admin: AIOKafkaAdminClient, topic: str) -> list[_ConfigEntry]:
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    entries: list[_ConfigEntry] = []
    for response in responses:
        for resource in response.resources:
            error_code, error_message = resource[0], resource[1]
            if error_code != 0:
                raise TopicSetupError(f"describe configs of {topic}: {error_message or error_code}")
            for entry in resource[4]:
                # v0 carries is_default where later versions carry config_source.
                override = (
                    not entry[3] if response.API_VERSION == 0 else entry[3] == _DYNAMIC_TOPIC_CONFIG
                )
                entries.append(_ConfigEntry(entry[0], entry[1], bool(override), bool(entry[4])))
    return entries


async def describe_topic_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    """The broker's view of a topic's configs (all of them, defaults included)."""
    return {e.name: e.value for e in await _config_entries(admin, topic) if e.value is not None}


async def topic_overrides(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    """The configs set on the topic itself (by us or by an operator), no defaults."""
    overrides: dict[str, str] = {}
    for entry in await _config_entries(admin, topic):
        if not entry.topic_override:
            continue
        if entry.value is None:
            raise TopicSetupError(
                f"topic {topic} has a sensitive config {entry.name!r} whose value the broker "
                "hides; repair its configs by hand (kafka-configs.sh --alter --add-config)"
            )
        overrides[entry.name] = entry.value
    return overrides


async def _repair_configs(admin: AIOKafkaAdminClient, topic: str, wanted: dict[str, str]) -> None:
    """Set ``wanted`` on ``topic`` and keep every other config set on it.

    aiokafka (0.14) has no IncrementalAlterConfigs, and AlterConfigs replaces a
    topic's dynamic configs as a whole; so the current overrides are read and
    re-sent merged with ``wanted``. An operator change landing between the read
    and the write can still be lost (a window of one round trip).
    """
    merged = {**await topic_overrides(admin, topic), **wanted}
    responses = await admin.alter_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic, configs=merged)]
    )
    for response in responses:
        for resource in response.resources:
            if resource[0] != 0:
                raise TopicSetupError(f"alter configs of {topic}: {resource[1] or resource[0]}")


async def partition_count(admin: AIOKafkaAdminClient, topic: str) -> int:
    for t in await admin.describe_topics([topic]):
        if t["topic"] == topic and t["error_code"] == 0:
            return len(t["partitions"])
    raise TopicSetupError(f"topic {topic} does not exist")


async def partition_counts(factory: AdminFactory, topics: Sequence[str]) -> dict[str, int]:
    """Partitions of each topic that exists (missing ones are left out)."""
    if not topics:
        return {}
    admin = factory.admin()
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics))
    finally:
        await admin.close()
    wanted = set(topics)
    return {
        t["topic"]: len(t["partitions"])
        for t in described
        if t["topic"] in wanted and t["error_code"] == 0
    }


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
            await _repair_configs(admin, spec.name, wanted)
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
