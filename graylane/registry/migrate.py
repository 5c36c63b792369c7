"""Run the registry's Alembic migrations programmatically (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

__all__ = ["MIGRATIONS_DIR", "alembic_config", "create_db_engine", "downgrade", "upgrade"]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def create_db_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get their folder created and foreign keys on."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, future=True)
    if parsed.get_backend_name() == "sqlite":

        @event.listens_for(engine, "connect")
        def _foreign_keys(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
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
