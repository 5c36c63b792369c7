"""Model registry: models, semver versions, built artifacts with validation, stable version.

SQLite file by default (``GRAYLANE_DB_URL``, see :class:`graylane.settings.Settings`),
PostgreSQL via ``postgresql+psycopg://...``. The schema is managed by Alembic;
:func:`~graylane.registry.repository.open_registry` brings it up to date before handing
out a :class:`~graylane.registry.repository.Registry`,
unless it opens read-only (workers): then it neither migrates nor writes.

Room: the library. May import the library; no service.
"""
