"""The Kafka admin API: idempotent topic set-up, topic facts, and ACL grants.

:func:`ensure_topics` creates missing topics and brings existing ones to their
specified configs; :class:`MessageLimits` reads how large a record each topic
accepts; :func:`apply_acls` grants :mod:`graylane.acls` rules (the same
rules ``graylane acls`` prints as ``kafka-acls.sh`` lines) through CreateAcls, for
``graylane acls --apply`` and the secured-broker tests. Granting needs a principal
allowed to Alter the cluster (the super user of a local secured broker).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol, runtime_checkable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.protocol.admin import CreateAclsRequest, CreateAclsRequestStruct

from graylane.acls import AclRule, Operation, Pattern, Resource
from graylane.errors import GraylaneError, TopicSetupError
from graylane.topics import TopicSpec

__all__ = [
    "STOCK_MAX_MESSAGE_BYTES",
    "AclApplyError",
    "AclBinding",
    "AdminFactory",
    "MessageLimits",
    "TopicSetupReport",
    "apply_acls",
    "bindings_for",
    "describe_topic_configs",
    "ensure_topics",
    "partition_count",
    "partition_counts",
    "topic_overrides",
]

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36


@runtime_checkable
class AdminFactory(Protocol):
    """Builds admin clients (:class:`~graylane.kafka.seam.KafkaFactory` does)."""

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


async def _config_entries(
    admin: AIOKafkaAdminClient, name: str, kind: ConfigResourceType = ConfigResourceType.TOPIC
) -> list[_ConfigEntry]:
    responses = await admin.describe_configs([ConfigResource(kind, name)])
    entries: list[_ConfigEntry] = []
    for response in responses:
        for resource in response.resources:
            error_code, error_message = resource[0], resource[1]
            if error_code != 0:
                raise TopicSetupError(f"describe configs of {name}: {error_message or error_code}")
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
                        topic_configs=s.creation_configs(),
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


STOCK_MAX_MESSAGE_BYTES = 1_048_588
"""Kafka's default ``message.max.bytes``: 1 MiB plus a record batch's log overhead."""


class MessageLimits:
    """How large a record each topic accepts, as the broker says; read once per topic.

    A topic's limit is its effective ``max.message.bytes`` (set on it, or the broker
    default it inherits); where the topic's configs cannot be read, the broker's
    ``message.max.bytes``, and where neither can, Kafka's stock default. It is never
    more than ``ceiling``, the producer's ``max_request_size``. A limit that had to be
    guessed is asked for again after ``retry_s``. Without an admin client (an
    in-memory double) every topic takes ``ceiling``.
    """

    def __init__(
        self, factory: AdminFactory | None, *, ceiling: int, retry_s: float = 60.0
    ) -> None:
        self._factory = factory
        self.ceiling = ceiling
        self._retry_s = retry_s
        self._known: dict[str, int] = {}
        self._guessed: dict[str, float] = {}  # topic -> when its guess expires
        self._lock = asyncio.Lock()

    @classmethod
    def of_factory(cls, factory: object, *, ceiling: int) -> MessageLimits:
        """Limits read through ``factory``'s admin client, if it builds one."""
        return cls(factory if isinstance(factory, AdminFactory) else None, ceiling=ceiling)

    async def limit(self, topic: str) -> int:
        """The largest record batch (bytes) ``topic`` accepts from this producer."""
        if topic in self._known and self._guessed.get(topic, float("inf")) > time.monotonic():
            return self._known[topic]
        await self.load([topic])
        return self._known[topic]

    async def load(self, topics: Iterable[str]) -> None:
        """Read the limits of ``topics`` (at start; later ones are read on first use)."""
        wanted = list(dict.fromkeys(topics))
        async with self._lock:
            now = time.monotonic()
            wanted = [
                t for t in wanted if t not in self._known or self._guessed.get(t, now + 1) <= now
            ]
            if not wanted:
                return
            if self._factory is None:
                self._known.update(dict.fromkeys(wanted, self.ceiling))
                return
            read, guess = await self._describe(self._factory, wanted)
            for topic in wanted:
                found = read.get(topic)
                self._known[topic] = min(self.ceiling, guess if found is None else found)
                if found is None:
                    self._guessed[topic] = time.monotonic() + self._retry_s
                else:
                    self._guessed.pop(topic, None)

    async def _describe(
        self, factory: AdminFactory, topics: list[str]
    ) -> tuple[dict[str, int], int]:
        """Limits read per topic, and the broker default for the topics left out."""
        read: dict[str, int] = {}
        admin = factory.admin()
        try:
            await admin.start()
            for topic in topics:
                try:
                    value = (await describe_topic_configs(admin, topic)).get("max.message.bytes")
                except Exception as exc:  # no DescribeConfigs, a missing topic: guess
                    log.warning("cannot read max.message.bytes of %s: %s", topic, exc)
                    continue
                if value is not None:
                    read[topic] = int(value)
            if len(read) == len(topics):
                return read, STOCK_MAX_MESSAGE_BYTES
            return read, await _broker_message_max_bytes(admin)
        except Exception as exc:  # the admin client cannot start: guess for them all
            log.warning("cannot read message size limits: %s", exc)
            return read, STOCK_MAX_MESSAGE_BYTES
        finally:
            await admin.close()


async def _broker_message_max_bytes(admin: AIOKafkaAdminClient) -> int:
    """A broker's ``message.max.bytes``, or Kafka's stock default if it cannot be read."""
    try:
        brokers = (await admin.describe_cluster())["brokers"]
        entries = await _config_entries(
            admin, str(brokers[0]["node_id"]), ConfigResourceType.BROKER
        )
        value = next((e.value for e in entries if e.name == "message.max.bytes"), None)
        return int(value) if value is not None else STOCK_MAX_MESSAGE_BYTES
    except Exception as exc:  # no DescribeConfigs on the cluster: assume the stock default
        log.warning("cannot read the broker's message.max.bytes: %s", exc)
        return STOCK_MAX_MESSAGE_BYTES


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


# -- ACLs ----------------------------------------------------------------------------


class _ResourceType(IntEnum):  # org.apache.kafka.common.resource.ResourceType
    TOPIC = 2
    GROUP = 3


class _PatternType(IntEnum):  # PatternType
    LITERAL = 3
    PREFIXED = 4


class _AclOperation(IntEnum):  # AclOperation
    READ = 3
    WRITE = 4
    CREATE = 5
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11


_ALLOW = 3  # AclPermissionType.ALLOW
_RESOURCES = {Resource.TOPIC: _ResourceType.TOPIC, Resource.GROUP: _ResourceType.GROUP}
_PATTERNS = {Pattern.LITERAL: _PatternType.LITERAL, Pattern.PREFIXED: _PatternType.PREFIXED}
_OPERATIONS = {
    Operation.READ: _AclOperation.READ,
    Operation.WRITE: _AclOperation.WRITE,
    Operation.CREATE: _AclOperation.CREATE,
    Operation.DESCRIBE: _AclOperation.DESCRIBE,
    Operation.DESCRIBE_CONFIGS: _AclOperation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS: _AclOperation.ALTER_CONFIGS,
}


class _CreateManyAcls(CreateAclsRequest):  # type: ignore[misc]
    """CreateAcls (v1+) with many creations in one request; aiokafka's sends one."""

    def __init__(self, creations: Sequence[tuple[int, str, int, str, str, int, int]]) -> None:
        self._creations = list(creations)

    def build(self, request_struct_class: type[CreateAclsRequestStruct]) -> CreateAclsRequestStruct:
        if request_struct_class.API_VERSION < 1:  # v0 has no pattern type (prefixed ACLs)
            raise AclApplyError("the broker does not speak CreateAcls v1 (Kafka >= 2.0)")
        return request_struct_class(self._creations)


class AclApplyError(GraylaneError):
    """The broker refused one or more ACL bindings."""


@dataclass(frozen=True)
class AclBinding:
    """One ALLOW binding on the wire: (resource, pattern, principal, operation)."""

    resource: Resource
    name: str
    pattern: Pattern
    principal: str
    operation: Operation

    def as_creation(self) -> tuple[int, str, int, str, str, int, int]:
        return (
            int(_RESOURCES[self.resource]),
            self.name,
            int(_PATTERNS[self.pattern]),
            self.principal,
            "*",
            int(_OPERATIONS[self.operation]),
            _ALLOW,
        )


def bindings_for(grants: Mapping[str, Sequence[AclRule]]) -> list[AclBinding]:
    """One binding per (principal, rule, operation), in a stable order."""
    return [
        AclBinding(rule.resource, rule.name, rule.pattern, principal, op)
        for principal, rules in grants.items()
        for rule in rules
        for op in rule.operations
    ]


async def apply_acls(admin: AIOKafkaAdminClient, bindings: Sequence[AclBinding]) -> int:
    """Create ``bindings`` (idempotent on the broker); returns how many were sent."""
    if not bindings:
        return 0
    request = _CreateManyAcls([b.as_creation() for b in bindings])
    response = await admin._send_request(request)
    refused = [
        f"{bindings[i].principal} {bindings[i].operation.value} {bindings[i].name}: "
        f"{message or code}"
        for i, (code, message) in enumerate(response.creation_responses)
        if code != 0
    ]
    if refused:
        raise AclApplyError("the broker refused ACLs:\n  " + "\n  ".join(refused))
    return len(bindings)
