"""Every change of a model's stable version, numbered (what ``rollout undo --to-revision``
goes back to).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "registry_stable_revisions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["registry_models.id"],
            name=op.f("fk_registry_stable_revisions_model_id_registry_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_stable_revisions")),
        sa.UniqueConstraint("model_id", "revision", name="uq_stable_revision"),
    )
    op.create_index(
        op.f("ix_registry_stable_revisions_model_id"), "registry_stable_revisions", ["model_id"]
    )


def downgrade() -> None:
    op.drop_index(
        op.f("ix_registry_stable_revisions_model_id"), table_name="registry_stable_revisions"
    )
    op.drop_table("registry_stable_revisions")
