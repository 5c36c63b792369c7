"""Graylane: gray releases of inference models over Kafka.

The front door for sending requests::

    from graylane import GraylaneClient, Settings

    async with GraylaneClient(Settings.from_env()) as client:
        result = await client.infer("gpt", prompt="hello", timeout=10)

The names below are imported on first use, so ``import graylane.topics`` (or any
other library module) loads nothing else.

Room: the library, the bottom layer. Nothing under ``graylane`` (but the service and
application packages mounted in it) imports a service or ``app``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graylane.client import (
        GraylaneClient,
        InferenceTimeout,
        RequestRejected,
        Result,
        Task,
        UnknownModel,
    )
    from graylane.errors import ErrorCode, GraylaneError
    from graylane.kafka.seam import KafkaFactory
    from graylane.serde import PostProcess
    from graylane.settings import Settings

__all__ = [
    "ErrorCode",
    "GraylaneClient",
    "GraylaneError",
    "InferenceTimeout",
    "KafkaFactory",
    "PostProcess",
    "RequestRejected",
    "Result",
    "Settings",
    "Task",
    "UnknownModel",
]

_HOME = {
    "ErrorCode": "graylane.errors",
    "GraylaneClient": "graylane.client",
    "GraylaneError": "graylane.errors",
    "InferenceTimeout": "graylane.client",
    "KafkaFactory": "graylane.kafka.seam",
    "PostProcess": "graylane.serde",
    "RequestRejected": "graylane.client",
    "Result": "graylane.client",
    "Settings": "graylane.settings",
    "Task": "graylane.client",
    "UnknownModel": "graylane.client",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'graylane' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
