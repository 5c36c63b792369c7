"""Kafka edge of the control plane: user intent out on ``<p>.control.commands``, and
the check before a rollout starts (is the candidate's topic there, is a worker consuming it?).

:class:`CandidateCheck` is a small protocol so unit tests fake it;
:class:`KafkaCandidateCheck` asks the broker (topic list + consumer-group members).
"""

from __future__ import annotations

from typing import Any, Protocol

from aiokafka import AIOKafkaProducer

from graylane.errors import NotStartedError
from graylane.kafka.admin import AdminFactory
from graylane.kafka.seam import KafkaFactory
from graylane.serde import encode, encode_key
from graylane.topics import TopicLayout
from graylane.v1 import dlq_pb2, rollout_pb2

__all__ = ["CandidateCheck", "CommandPublisher", "KafkaCandidateCheck", "KafkaCommandBus"]


class CommandPublisher(Protocol):
    async def publish(self, command: rollout_pb2.RolloutCommand) -> None:
        """Return once the command is durably on the bus."""


class KafkaCommandBus:
    """Commands keyed by model, so one model's commands stay in order."""

    def __init__(self, factory: KafkaFactory) -> None:
        self._factory = factory
        self._topic = factory.layout.commands()
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        producer = self._factory.producer(client_suffix="controlplane")
        await producer.start()
        self._producer = producer

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def publish(self, command: rollout_pb2.RolloutCommand) -> None:
        if self._producer is None:
            raise NotStartedError("KafkaCommandBus.publish before start()")
        await self._producer.send_and_wait(
            self._topic, value=encode(command), key=encode_key(command.model)
        )

    async def dead_letter(self, letter: dlq_pb2.DeadLetter) -> None:
        """Keep an undelivered notification on ``<p>.dlq`` (key: its rollout id)."""
        if self._producer is None:
            raise NotStartedError("KafkaCommandBus.dead_letter before start()")
        await self._producer.send_and_wait(
            self._factory.layout.dlq(), value=encode(letter), key=letter.original_key
        )


def _how_to_start(model: str, version: str) -> str:
    return f"start one with `graylane serve worker --model {model} --version {version}`"


class CandidateCheck(Protocol):
    async def __call__(self, model: str, version: str) -> str | None:
        """Why a rollout to ``version`` cannot start now, or None."""
        ...


class KafkaCandidateCheck:
    """The candidate topic exists and its worker group has at least one member."""

    def __init__(self, factory: AdminFactory, layout: TopicLayout) -> None:
        self._factory = factory
        self._layout = layout

    async def __call__(self, model: str, version: str) -> str | None:
        topic = self._layout.version_requests(model, version)
        group = self._layout.worker_group(model, version)
        admin = self._factory.admin()
        await admin.start()
        try:
            if topic not in set(await admin.list_topics()):
                return f"candidate topic {topic} does not exist; {_how_to_start(model, version)}"
            described = await admin.describe_consumer_groups([group])
        finally:
            await admin.close()
        if _members(described) == 0:
            return (
                f"no worker consumes {topic} (consumer group {group} has no members); "
                f"{_how_to_start(model, version)}"
            )
        return None


def _members(responses: list[Any]) -> int:
    count = 0
    for response in responses:
        for group in response.to_object().get("groups", []):
            count += len(group.get("members", []))
    return count
