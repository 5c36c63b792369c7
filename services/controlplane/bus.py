"""Kafka edge of the control plane: publish user intent on ``<p>.control.commands``."""

from __future__ import annotations

from typing import Protocol

from aiokafka import AIOKafkaProducer

from graylane.errors import NotStartedError
from graylane.kafka.seam import KafkaFactory
from graylane.serde import encode, encode_key
from graylane.v1 import rollout_pb2

__all__ = ["CommandPublisher", "KafkaCommandBus"]


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
