"""Engine-server variants: the endpoint that serves an artifact, the digest of the model
file its engine loaded, and its place on the version's QoS ladder.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("registry_artifacts") as batch:
        batch.add_column(sa.Column("endpoint_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("model_sha256", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("ladder_rank", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("registry_artifacts") as batch:
        batch.drop_column("ladder_rank")
        batch.drop_column("model_sha256")
        batch.drop_column("endpoint_url")
