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
    from graylane.deploy.kafka import broker as kafka_broker
    from graylane.deploy.kafka import process as kafka_process

    kafka_broker.start()
    yield kafka_process.bootstrap()


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


# Under pytest-xdist (``make test``'s second phase: ``-n 2 --dist loadgroup``) each group below
# runs on one worker, one test after another, while the others take the rest:
# - "containers": the images podman builds and runs;
# - "postgres": the local PostgreSQL server's one database (the schema migrated in place).
# Every other test has its own topics, consumer groups, ports and files. The tests marked
# ``speed`` judge measured speed and run alone, in ``make test``'s first phase.
_SHARED = ("containers", "postgres")


def _xdist_group(item: pytest.Item) -> str | None:
    for group in _SHARED:
        if item.get_closest_marker(group) is not None:
            return group
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each item as it is collected: xdist reads the groups in its own
    ``pytest_collection_modifyitems``, which runs before a conftest's."""
    group = _xdist_group(item)
    if group is not None:  # one group each: xdist joins several into a new one
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup``, a grouped test that xdist did not rename would run beside
    its group's others: fail at once rather than share podman's images or the database."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} tests (first: {lost[0]}): this pytest "
            "and pytest-xdist do not agree on how to rename a test; see pyproject.toml"
        )
