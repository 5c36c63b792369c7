"""Initial registry schema: models, versions, artifacts, validation results, stable versions.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "registry_models",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_models")),
        sa.UniqueConstraint("name", name=op.f("uq_registry_models_name")),
    )
    op.create_table(
        "registry_model_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("source_sha256", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["registry_models.id"],
            name=op.f("fk_registry_model_versions_model_id_registry_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_model_versions")),
        sa.UniqueConstraint("model_id", "version", name="uq_model_version"),
    )
    op.create_index(
        op.f("ix_registry_model_versions_model_id"), "registry_model_versions", ["model_id"]
    )
    op.create_table(
        "registry_artifacts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("target", sa.String(length=16), nullable=False),
        sa.Column("precision", sa.String(length=16), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("backend_version", sa.String(length=32), nullable=False),
        sa.Column("strategy", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("manifest_sha256", sa.String(length=64), nullable=False),
        sa.Column("servable", sa.Boolean(), nullable=False),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("gpu_compute_capability", sa.String(length=8), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["registry_model_versions.id"],
            name=op.f("fk_registry_artifacts_version_id_registry_model_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_artifacts")),
        sa.UniqueConstraint("name", "target", name="uq_artifact_name_target"),
    )
    op.create_index(op.f("ix_registry_artifacts_version_id"), "registry_artifacts", ["version_id"])
    op.create_table(
        "registry_stable_versions",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["registry_models.id"],
            name=op.f("fk_registry_stable_versions_model_id_registry_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["registry_model_versions.id"],
            name=op.f("fk_registry_stable_versions_version_id_registry_model_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", name=op.f("pk_registry_stable_versions")),
    )
    op.create_table(
        "registry_validation_results",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("artifact_id", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("max_abs", sa.Float(), nullable=True),
        sa.Column("mean_rel", sa.Float(), nullable=True),
        sa.Column("cosine", sa.Float(), nullable=True),
        sa.Column("top1_agreement", sa.Float(), nullable=True),
        sa.Column("token_agreement", sa.Float(), nullable=True),
        sa.Column("rows", sa.Integer(), nullable=True),
        sa.Column("failures", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["artifact_id"],
            ["registry_artifacts.id"],
            name=op.f("fk_registry_validation_results_artifact_id_registry_artifacts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_validation_results")),
        sa.UniqueConstraint("artifact_id", name=op.f("uq_registry_validation_results_artifact_id")),
    )


def downgrade() -> None:
    op.drop_table("registry_validation_results")
    op.drop_table("registry_stable_versions")
    op.drop_index(op.f("ix_registry_artifacts_version_id"), table_name="registry_artifacts")
    op.drop_table("registry_artifacts")
    op.drop_index(op.f("ix_registry_model_versions_model_id"), table_name="registry_model_versions")
    op.drop_table("registry_model_versions")
    op.drop_table("registry_models")
