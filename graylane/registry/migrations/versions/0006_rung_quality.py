"""The measured quality of a version's precision rungs: each rung's score on an
evaluation set beside its reference rung's (``graylane eval --record``).

Revision ID: 0006_rung_quality
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_rung_quality"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "registry_rung_quality",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("precision", sa.String(length=32), nullable=False),
        sa.Column("set_name", sa.String(length=255), nullable=False),
        sa.Column("set_sha256", sa.String(length=64), nullable=False),
        sa.Column("items", sa.Integer(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("ci_low", sa.Float(), nullable=False),
        sa.Column("ci_high", sa.Float(), nullable=False),
        sa.Column("reference_precision", sa.String(length=32), nullable=False),
        sa.Column("reference_score", sa.Float(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["registry_model_versions.id"],
            name=op.f("fk_registry_rung_quality_version_id_registry_model_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_rung_quality")),
        sa.UniqueConstraint("version_id", "precision", "set_sha256", name="uq_rung_quality"),
    )
    op.create_index(
        op.f("ix_registry_rung_quality_version_id"), "registry_rung_quality", ["version_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_registry_rung_quality_version_id"), table_name="registry_rung_quality")
    op.drop_table("registry_rung_quality")
