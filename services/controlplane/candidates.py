"""Before a rollout starts: is the candidate's topic there, and is a worker consuming it?

:class:`CandidateCheck` is a small protocol so unit tests fake it;
:class:`KafkaCandidateCheck` asks the broker (topic list + consumer-group members).
"""

from __future__ import annotations

from typing import Any, Protocol

from graylane.kafka.admin import AdminFactory
from graylane.topics import TopicLayout

__all__ = ["CandidateCheck", "KafkaCandidateCheck", "worker_group"]


def worker_group(prefix: str, model: str, version: str) -> str:
    """The consumer group workers of ``model``/``version`` join (see the worker's options)."""
    return f"{prefix}-worker-{model}-{version}"


def _how_to_start(model: str, version: str) -> str:
    return f"start one with `graylane worker --model {model} --version {version}`"


class CandidateCheck(Protocol):
    async def __call__(self, model: str, version: str) -> str | None:
        """Why a rollout to ``version`` cannot start now, or None."""
        ...


class KafkaCandidateCheck:
    """The candidate topic exists and its worker group has at least one member."""

    def __init__(self, factory: AdminFactory, layout: TopicLayout, prefix: str) -> None:
        self._factory = factory
        self._layout = layout
        self._prefix = prefix

    async def __call__(self, model: str, version: str) -> str | None:
        topic = self._layout.version_requests(model, version)
        group = worker_group(self._prefix, model, version)
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
