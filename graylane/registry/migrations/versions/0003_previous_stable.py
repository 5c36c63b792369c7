"""The previous stable version of a model (what ``rollout revert`` returns to);
the control plane's cohort routing per model.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("registry_stable_versions") as batch:
        batch.add_column(sa.Column("previous_version_id", sa.Integer(), nullable=True))
    op.create_table(
        "cp_route_configs",
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("config", sa.LargeBinary(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("model", name=op.f("pk_cp_route_configs")),
    )


def downgrade() -> None:
    op.drop_table("cp_route_configs")
    with op.batch_alter_table("registry_stable_versions") as batch:
        batch.drop_column("previous_version_id")
