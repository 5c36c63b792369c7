"""Model registry: models, semver versions, built artifacts with validation, stable version.

SQLite file by default (``GRAYLANE_DB_URL``, see :class:`graylane.settings.Settings`),
PostgreSQL via ``postgresql+psycopg://...``. The schema is managed by Alembic;
:func:`open_registry` brings it up to date before handing out a :class:`Registry`,
unless it opens read-only (workers): then it neither migrates nor writes.

Room: the library. May import the library; no service.
"""

from __future__ import annotations

from graylane.registry.migrate import (
    SchemaNotCurrent,
    create_db_engine,
    downgrade,
    require_current,
    upgrade,
)
from graylane.registry.records import (
    ArtifactInfo,
    ArtifactRecord,
    DuplicateArtifact,
    DuplicateVersion,
    EndpointSummary,
    ModelNotRegistered,
    RegisteredModel,
    RegistryError,
    RungQuality,
    StableRevision,
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
    "EndpointSummary",
    "ModelNotRegistered",
    "RegisteredModel",
    "Registry",
    "RegistryError",
    "RungQuality",
    "SchemaNotCurrent",
    "StableRevision",
    "UnknownArtifact",
    "UnknownVersion",
    "ValidationSummary",
    "VersionInfo",
    "VersionStatus",
    "create_db_engine",
    "downgrade",
    "open_registry",
    "require_current",
    "target_for",
    "upgrade",
]


def open_registry(url: str, migrate: bool = True, *, read_only: bool = False) -> Registry:
    """A :class:`Registry` on ``url``, with the schema migrated to the latest revision.

    ``read_only`` (a worker): no migration, every write refused by the connection, and
    :class:`SchemaNotCurrent` unless someone migrated the schema already.
    """
    engine = create_db_engine(url, read_only=read_only)
    if read_only:
        require_current(engine)
    elif migrate:
        upgrade(engine)
    return Registry(engine)
