"""Run the registry's Alembic migrations programmatically (no alembic.ini needed).

Migrations run at the control plane's start; a reader that must never write (a
worker) opens the database read-only (:func:`create_db_engine` with ``read_only``)
and only checks that the schema is current (:func:`require_current`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from graylane.registry.records import RegistryError

__all__ = [
    "MIGRATIONS_DIR",
    "VERSION_TABLE",
    "SchemaNotCurrent",
    "alembic_config",
    "create_db_engine",
    "downgrade",
    "require_current",
    "upgrade",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "registry_alembic_version"


class SchemaNotCurrent(RegistryError):
    """The database schema is not the one this code reads: migrations have not run."""


def create_db_engine(url: str, *, read_only: bool = False) -> Engine:
    """An engine for ``url``; SQLite files get their folder created and foreign keys on.

    ``read_only``: every connection refuses writes (SQLite ``query_only``, PostgreSQL
    ``default_transaction_read_only``), whatever the credentials in ``url`` may do;
    grant that role SELECT only, too (see ``deploy/k8s/README.md``).
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    connect_args: dict[str, str] = {}
    if read_only and backend == "postgresql":
        connect_args["options"] = "-c default_transaction_read_only=on"
    elif read_only and backend != "sqlite":
        raise ValueError(f"read-only connections are not supported on {backend}")
    if backend == "sqlite" and parsed.database not in (None, "", ":memory:") and not read_only:
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, future=True, connect_args=connect_args)
    if backend == "sqlite":
        pragmas = ["PRAGMA foreign_keys=ON", *(["PRAGMA query_only=ON"] if read_only else [])]

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            for pragma in pragmas:
                cursor.execute(pragma)
            cursor.close()

    return engine


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # configparser treats '%' as interpolation; URLs may hold %-escaped passwords.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str | Engine, revision: str = "head") -> None:
    """Bring the registry schema at ``url`` (or on ``engine``) up to ``revision``."""
    engine = create_db_engine(url) if isinstance(url, str) else url
    config = alembic_config()
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        if isinstance(url, str):
            engine.dispose()


def downgrade(url: str | Engine, revision: str = "base") -> None:
    """Undo registry migrations down to ``revision`` (``base`` drops every table)."""
    engine = create_db_engine(url) if isinstance(url, str) else url
    config = alembic_config()
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        if isinstance(url, str):
            engine.dispose()


def require_current(engine: Engine) -> None:
    """Raise :class:`SchemaNotCurrent` unless the schema is at the newest revision."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    with engine.connect() as connection:
        current = MigrationContext.configure(
            connection, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()
    if current != head:
        raise SchemaNotCurrent(
            f"registry schema at {current or 'nothing'}, this code reads {head}: "
            "start the control plane first, it migrates at its start"
        )
