"""Model registry: models, semver versions, built artifacts with validation, stable version.

SQLite file by default (``GRAYLANE_DB_URL``, see :class:`graylane.settings.Settings`),
PostgreSQL via ``postgresql+psycopg://...``. The schema is managed by Alembic;
:func:`open_registry` brings it up to date before handing out a :class:`Registry`.
"""

from __future__ import annotations

from graylane.registry.migrate import create_db_engine, downgrade, upgrade
from graylane.registry.records import (
    ArtifactInfo,
    ArtifactRecord,
    DuplicateArtifact,
    DuplicateVersion,
    ModelNotRegistered,
    RegisteredModel,
    RegistryError,
    UnknownArtifact,
    UnknownVersion,
    ValidationSummary,
    VersionInfo,
    VersionStatus,
    target_for,
)
from graylane.registry.repository import Registry

__all__ = [
    "ArtifactInfo",
    "ArtifactRecord",
    "DuplicateArtifact",
    "DuplicateVersion",
    "ModelNotRegistered",
    "RegisteredModel",
    "Registry",
    "RegistryError",
    "UnknownArtifact",
    "UnknownVersion",
    "ValidationSummary",
    "VersionInfo",
    "VersionStatus",
    "create_db_engine",
    "downgrade",
    "open_registry",
    "target_for",
    "upgrade",
]


def open_registry(url: str, migrate: bool = True) -> Registry:
    """A :class:`Registry` on ``url``, with the schema migrated to the latest revision."""
    engine = create_db_engine(url)
    if migrate:
        upgrade(engine)
    return Registry(engine)
