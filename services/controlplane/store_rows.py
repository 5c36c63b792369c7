"""Tables of the control plane's SQL store, prefixed ``cp_`` (made by registry migration 0002)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from graylane.registry.schema import Base

__all__ = [
    "AuditRow",
    "CommandRow",
    "QosPolicyRow",
    "RolloutRow",
    "RouteConfigRow",
    "SinkOffsetRow",
]


class RolloutRow(Base):
    __tablename__ = "cp_rollouts"

    rollout_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    baseline_version: Mapped[str] = mapped_column(String(64), nullable=False)
    candidate_version: Mapped[str] = mapped_column(String(64), nullable=False)
    phase: Mapped[int] = mapped_column(Integer, nullable=False)
    terminal: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    spec: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    state: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    state_updated_ms: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    created_by: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    created_at_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    updated_at_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)


class CommandRow(Base):
    __tablename__ = "cp_commands"

    command_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    rollout_id: Mapped[str] = mapped_column(String(160), nullable=False, index=True)
    model: Mapped[str] = mapped_column(String(128), nullable=False)
    kind: Mapped[int] = mapped_column(Integer, nullable=False)
    issued_by: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    issued_at_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    # Null until the broker acknowledged the command on <p>.control.commands.
    sent_at_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class RouteConfigRow(Base):
    """A model's cohort routing (RouteConfig protobuf), made by registry migration 0003."""

    __tablename__ = "cp_route_configs"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    config: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    updated_by: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    updated_at_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)


class QosPolicyRow(Base):
    __tablename__ = "cp_qos_policies"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    policy: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    updated_by: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    updated_at_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)


class AuditRow(Base):
    __tablename__ = "cp_audit"
    __table_args__ = (UniqueConstraint("decision_id", name="uq_cp_audit_decision_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    decision_id: Mapped[str] = mapped_column(String(128), nullable=False)
    decided_at_ms: Mapped[int] = mapped_column(BigInteger, nullable=False, index=True)
    model: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    rollout_id: Mapped[str] = mapped_column(String(160), nullable=False, default="", index=True)
    version: Mapped[str] = mapped_column(String(64), nullable=False, default="")
    kind: Mapped[int] = mapped_column(Integer, nullable=False)
    rule: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    reason: Mapped[str] = mapped_column(Text, nullable=False, default="")
    record: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class SinkOffsetRow(Base):
    """Next offset the audit sink reads per topic partition (resume after restart)."""

    __tablename__ = "cp_sink_offsets"

    topic: Mapped[str] = mapped_column(String(255), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    next_offset: Mapped[int] = mapped_column(BigInteger, nullable=False)
