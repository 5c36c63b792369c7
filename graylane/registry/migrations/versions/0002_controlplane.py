"""Control plane tables: rollouts, commands (outbox), QoS policies, audit copy, sink offsets.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cp_rollouts",
        sa.Column("rollout_id", sa.String(length=160), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("baseline_version", sa.String(length=64), nullable=False),
        sa.Column("candidate_version", sa.String(length=64), nullable=False),
        sa.Column("phase", sa.Integer(), nullable=False),
        sa.Column("terminal", sa.Integer(), nullable=False),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column("state_updated_ms", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("rollout_id", name=op.f("pk_cp_rollouts")),
    )
    op.create_index(op.f("ix_cp_rollouts_model"), "cp_rollouts", ["model"])
    op.create_table(
        "cp_commands",
        sa.Column("command_id", sa.String(length=64), nullable=False),
        sa.Column("rollout_id", sa.String(length=160), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.Integer(), nullable=False),
        sa.Column("issued_by", sa.String(length=128), nullable=False),
        sa.Column("issued_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("sent_at_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("command_id", name=op.f("pk_cp_commands")),
    )
    op.create_index(op.f("ix_cp_commands_rollout_id"), "cp_commands", ["rollout_id"])
    op.create_table(
        "cp_qos_policies",
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("policy", sa.LargeBinary(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("model", "version", name=op.f("pk_cp_qos_policies")),
    )
    op.create_table(
        "cp_audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("decision_id", sa.String(length=128), nullable=False),
        sa.Column("decided_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("rollout_id", sa.String(length=160), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("record", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cp_audit")),
        sa.UniqueConstraint("decision_id", name="uq_cp_audit_decision_id"),
    )
    op.create_index(op.f("ix_cp_audit_decided_at_ms"), "cp_audit", ["decided_at_ms"])
    op.create_index(op.f("ix_cp_audit_model"), "cp_audit", ["model"])
    op.create_index(op.f("ix_cp_audit_rollout_id"), "cp_audit", ["rollout_id"])
    op.create_table(
        "cp_sink_offsets",
        sa.Column("topic", sa.String(length=255), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("next_offset", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("topic", "partition", name=op.f("pk_cp_sink_offsets")),
    )


def downgrade() -> None:
    op.drop_table("cp_sink_offsets")
    op.drop_index(op.f("ix_cp_audit_rollout_id"), table_name="cp_audit")
    op.drop_index(op.f("ix_cp_audit_model"), table_name="cp_audit")
    op.drop_index(op.f("ix_cp_audit_decided_at_ms"), table_name="cp_audit")
    op.drop_table("cp_audit")
    op.drop_table("cp_qos_policies")
    op.drop_index(op.f("ix_cp_commands_rollout_id"), table_name="cp_commands")
    op.drop_table("cp_commands")
    op.drop_index(op.f("ix_cp_rollouts_model"), table_name="cp_rollouts")
    op.drop_table("cp_rollouts")
