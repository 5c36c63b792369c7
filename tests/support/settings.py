"""Per-test :class:`~graylane.settings.Settings`: own topic prefix, database and artifacts."""

from __future__ import annotations

from pathlib import Path

from graylane.settings import Settings

# Nothing listens there: a unit test that reaches for a broker fails instead of using one.
NO_BROKER = "127.0.0.1:1"


def make_settings(bootstrap_servers: str, unique_prefix: str, tmp_path: Path) -> Settings:
    """Settings of one test: its own topic prefix, database and artifact folder in tmp_path."""
    return Settings(
        bootstrap_servers=bootstrap_servers,
        topic_prefix=unique_prefix,
        client_id=f"test-{unique_prefix}",
        partitions=2,
        db_url=f"sqlite:///{tmp_path / 'graylane.db'}",
        artifact_dir=tmp_path / "artifacts",
    )
