"""Registry tables (SQLAlchemy 2.x typed declarative), portable to SQLite and PostgreSQL.

Only portable column types are used: integers, bounded strings, text, floats,
booleans and timezone-aware timestamps. Enumerations are stored as their string
values (no native ENUM types), so migrations never need ALTER TYPE.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "ANY_TARGET",
    "ArtifactRow",
    "Base",
    "ModelRow",
    "ModelVersionRow",
    "RungQualityRow",
    "StableRevisionRow",
    "StableVersionRow",
    "ValidationResultRow",
]

ANY_TARGET = "any"
"""``target`` of an artifact that runs on any machine (ONNX files); engines use ``sm<cc>``."""

# Explicit constraint names keep Alembic migrations identical on every database.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ModelRow(Base):
    __tablename__ = "registry_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, nullable=False)
    description: Mapped[str] = mapped_column(Text, nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    versions: Mapped[list[ModelVersionRow]] = relationship(
        back_populates="model", cascade="all, delete-orphan"
    )


class ModelVersionRow(Base):
    __tablename__ = "registry_model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version", name="uq_model_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("registry_models.id", ondelete="CASCADE"), nullable=False, index=True
    )
    version: Mapped[str] = mapped_column(String(64), nullable=False)
    source_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    model: Mapped[ModelRow] = relationship(back_populates="versions")
    artifacts: Mapped[list[ArtifactRow]] = relationship(
        back_populates="model_version", cascade="all, delete-orphan"
    )


class ArtifactRow(Base):
    __tablename__ = "registry_artifacts"
    __table_args__ = (UniqueConstraint("name", "target", name="uq_artifact_name_target"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version_id: Mapped[int] = mapped_column(
        ForeignKey("registry_model_versions.id", ondelete="CASCADE"), nullable=False, index=True
    )
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    target: Mapped[str] = mapped_column(String(16), nullable=False, default=ANY_TARGET)
    precision: Mapped[str] = mapped_column(String(16), nullable=False)
    backend: Mapped[str] = mapped_column(String(16), nullable=False)
    backend_version: Mapped[str] = mapped_column(String(32), nullable=False)
    strategy: Mapped[str] = mapped_column(String(64), nullable=False)
    path: Mapped[str] = mapped_column(Text, nullable=False)
    manifest_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    servable: Mapped[bool] = mapped_column(Boolean, nullable=False)
    forced: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    gpu_compute_capability: Mapped[str | None] = mapped_column(String(8), nullable=True)
    # An engine-server variant: its endpoint, the digest of the model file the engine
    # loaded, and its place on the QoS ladder (all NULL for ONNX files and engines).
    endpoint_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    model_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    ladder_rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    model_version: Mapped[ModelVersionRow] = relationship(back_populates="artifacts")
    validation: Mapped[ValidationResultRow | None] = relationship(
        back_populates="artifact", cascade="all, delete-orphan", uselist=False
    )


class ValidationResultRow(Base):
    __tablename__ = "registry_validation_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    artifact_id: Mapped[int] = mapped_column(
        ForeignKey("registry_artifacts.id", ondelete="CASCADE"), nullable=False, unique=True
    )
    passed: Mapped[bool] = mapped_column(Boolean, nullable=False)
    max_abs: Mapped[float | None] = mapped_column(Float, nullable=True)
    mean_rel: Mapped[float | None] = mapped_column(Float, nullable=True)
    cosine: Mapped[float | None] = mapped_column(Float, nullable=True)
    top1_agreement: Mapped[float | None] = mapped_column(Float, nullable=True)
    token_agreement: Mapped[float | None] = mapped_column(Float, nullable=True)
    rows: Mapped[int | None] = mapped_column(Integer, nullable=True)
    failures: Mapped[str] = mapped_column(Text, nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    artifact: Mapped[ArtifactRow] = relationship(back_populates="validation")


class StableVersionRow(Base):
    """The version a model's traffic goes to when no rollout says otherwise."""

    __tablename__ = "registry_stable_versions"

    model_id: Mapped[int] = mapped_column(
        ForeignKey("registry_models.id", ondelete="CASCADE"), primary_key=True
    )
    version_id: Mapped[int] = mapped_column(
        ForeignKey("registry_model_versions.id", ondelete="CASCADE"), nullable=False
    )
    # The stable version before the last change (a plain id: the version may be gone).
    previous_version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=_now, onupdate=_now
    )


class StableRevisionRow(Base):
    """One change of a model's stable version: revision ``n`` made ``version`` stable.

    Revisions count from 1 per model and only grow; going back to an old version is a
    new revision, as ``kubectl rollout undo`` makes one.
    """

    __tablename__ = "registry_stable_revisions"
    __table_args__ = (UniqueConstraint("model_id", "revision", name="uq_stable_revision"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("registry_models.id", ondelete="CASCADE"), nullable=False, index=True
    )
    revision: Mapped[int] = mapped_column(Integer, nullable=False)
    version: Mapped[str] = mapped_column(String(64), nullable=False)
    set_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class RungQualityRow(Base):
    """One precision rung of a version scored on an evaluation set (``graylane eval
    --record``), beside the score of the reference rung scored in the same run.

    One row per (version, rung, set digest): scoring the rung on the same set again
    replaces it.
    """

    __tablename__ = "registry_rung_quality"
    __table_args__ = (
        UniqueConstraint("version_id", "precision", "set_sha256", name="uq_rung_quality"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version_id: Mapped[int] = mapped_column(
        ForeignKey("registry_model_versions.id", ondelete="CASCADE"), nullable=False, index=True
    )
    precision: Mapped[str] = mapped_column(String(32), nullable=False)
    set_name: Mapped[str] = mapped_column(String(255), nullable=False)
    set_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    items: Mapped[int] = mapped_column(Integer, nullable=False)
    score: Mapped[float] = mapped_column(Float, nullable=False)
    ci_low: Mapped[float] = mapped_column(Float, nullable=False)
    ci_high: Mapped[float] = mapped_column(Float, nullable=False)
    reference_precision: Mapped[str] = mapped_column(String(32), nullable=False)
    reference_score: Mapped[float] = mapped_column(Float, nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
