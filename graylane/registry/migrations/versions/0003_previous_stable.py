"""The previous stable version of a model (what ``rollout revert`` returns to).

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


def downgrade() -> None:
    with op.batch_alter_table("registry_stable_versions") as batch:
        batch.drop_column("previous_version_id")
