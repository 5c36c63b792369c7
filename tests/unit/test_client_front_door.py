"""The front door: ``from graylane import GraylaneClient, Settings`` is enough to send a
request, and importing any library module still loads nothing it does not need."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import graylane
from graylane import ErrorCode, GraylaneClient, RequestRejected, Settings
from graylane.client import GraylaneClient as ClientInModule
from graylane.kafka.seam import KafkaFactory
from graylane.settings import Settings as SettingsInModule
from graylane.v1 import inference_pb2
from tests.support.memory_kafka import MemoryFactory
from tests.unit.test_client_memory import MODEL, error, factory, ok, responder  # noqa: F401

HOMES = {
    "graylane.client": "GraylaneClient InferenceTimeout RequestRejected Result Task UnknownModel",
    "graylane.errors": "ErrorCode GraylaneError",
    "graylane.kafka.seam": "KafkaFactory",
    "graylane.settings": "Settings",
    "graylane.serde": "PostProcess",
}
"""The public names, by the module that defines them."""


def test_the_exported_names_are_exactly_the_public_api_and_each_resolves() -> None:
    public = {name for names in HOMES.values() for name in names.split()}
    assert set(graylane.__all__) == public
    for home, names in HOMES.items():
        for name in names.split():
            assert getattr(graylane, name) is getattr(importlib.import_module(home), name)
    assert GraylaneClient is ClientInModule
    assert Settings is SettingsInModule
    assert set(dir(graylane)) >= public
    with pytest.raises(AttributeError):
        graylane.NoSuchThing  # noqa: B018


def test_a_library_module_imports_light() -> None:
    probe = (
        "import sys, graylane.topics; "
        "print(','.join(m for m in ('graylane.client', 'graylane.kafka.seam', 'aiokafka') "
        "if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == ""


def test_the_client_takes_settings_and_builds_the_real_factory() -> None:
    client = GraylaneClient(Settings(topic_prefix="p"), client_id="c1")
    assert isinstance(client.factory, KafkaFactory)
    assert client.reply_topic == client.layout.reply("c1")


async def test_one_request_through_the_front_door(factory: MemoryFactory) -> None:  # noqa: F811
    async with responder(factory, lambda r: [ok(r)]), GraylaneClient(factory) as client:
        result = await client.infer(MODEL, prompt="hello", timeout=5)
    assert result.ok and result.code is None and result.text == "echo hello"


async def test_an_error_result_carries_its_error_code(factory: MemoryFactory) -> None:  # noqa: F811
    async with (
        responder(factory, lambda r: [error(r, inference_pb2.BAD_SHAPE)]),
        GraylaneClient(factory) as client,
    ):
        with pytest.raises(RequestRejected) as caught:
            await client.infer(MODEL, prompt="hello", timeout=5)
    assert caught.value.result.code is ErrorCode.BAD_SHAPE
    assert caught.value.result.error_code == "BAD_SHAPE"
