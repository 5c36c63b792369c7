"""Shared fixtures: per-test topic names, broker-free settings, and the real local broker;
the real llama.cpp engine server's fixtures come from ``tests/support/llamacpp.py``.

``settings`` here needs no broker (unit tests); ``tests/integration/conftest.py`` overrides it
with settings that point at the real local broker, started on demand. Hypothesis runs under
the ``graylane`` profile: no per-example deadline, so a busy machine cannot fail a property.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

hypothesis_settings.register_profile("graylane", deadline=None)
hypothesis_settings.load_profile("graylane")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from graylane.kafka.seam import KafkaFactory  # noqa: E402
from graylane.settings import Settings  # noqa: E402
from tests.support.settings import NO_BROKER, make_settings  # noqa: E402

# Engine-server fixtures (smollm2_gguf, start_llama_server, ...): see the module.
pytest_plugins = ("tests.support.llamacpp",)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of the real local broker (started if it is not running)."""
    from graylane.deploy.kafka import kafka

    kafka.start()
    yield kafka.bootstrap()


@pytest.fixture
def unique_prefix() -> str:
    """A topic prefix no other test uses, so tests never see each other's records."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def settings(unique_prefix: str, tmp_path: Path) -> Settings:
    """Broker-free settings (unit tests); integration tests get the broker ones."""
    return make_settings(NO_BROKER, unique_prefix, tmp_path)


@pytest.fixture
def factory(settings: Settings) -> KafkaFactory:
    return KafkaFactory(settings)


# Tests that share something outside the test (the images podman builds and runs, the local
# PostgreSQL server's one database) run one after another on one worker under pytest-xdist
# (``--dist loadgroup``); every other test has its own topics, ports and files.
_SERIAL_GROUPS = ("containers", "postgres")

# Under xdist the longest tests start first, so that none of them is left for the end.
_LONG_FIXTURES = {"start_llama_server", "private_broker"}


def _is_long(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None or bool(
        _LONG_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for group in _SERIAL_GROUPS:
            if item.get_closest_marker(group) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
                break
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the order it hands out
        items.sort(key=lambda item: not _is_long(item))
