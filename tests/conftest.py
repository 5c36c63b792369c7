"""Shared fixtures: the real local Kafka broker and per-test topic names."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from graylane.kafka.factory import KafkaFactory  # noqa: E402
from graylane.settings import Settings  # noqa: E402


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
def settings(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Settings:
    return Settings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=unique_prefix,
        client_id=f"test-{unique_prefix}",
        partitions=2,
        db_url=f"sqlite:///{tmp_path / 'graylane.db'}",
        artifact_dir=tmp_path / "artifacts",
    )


@pytest.fixture
def factory(settings: Settings) -> KafkaFactory:
    return KafkaFactory(settings)
