"""Integration fixtures: ``settings`` (and so ``factory``) point at the real local broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.settings import Settings
from tests.support.settings import make_settings


@pytest.fixture
def settings(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Settings:
    """Settings on the real local broker (started on demand, never stopped by a test)."""
    return make_settings(kafka_bootstrap, unique_prefix, tmp_path)
