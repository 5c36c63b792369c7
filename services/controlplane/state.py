"""The state the control plane owns, in its SQL store: rollouts, commands (an outbox),
QoS policies, audit copy.

Room: ``state.py`` of the control plane (beside the model registry of
:mod:`graylane.registry`, the same database); changed only through
:class:`ControlStore`'s methods, keyed by rollout id and model.

The tables, prefixed ``cp_``, are created by the registry's Alembic migrations (0002,
0003), so registry and control plane share one database (SQLite file or PostgreSQL).
Protobuf messages are kept as their wire bytes next to a few indexed columns; the
store speaks protobuf because it sits at the I/O edge, like the servicers.

Ids and names fit their SQL column: kept as they are, or hashed, never cut silently.
A value longer than its column (PostgreSQL refuses it; SQLite would keep it whole) is
stored as a readable prefix, ``~`` and the first 16 hex digits of its sha256: stable
(the same value always maps to the same key, so inserts stay idempotent) and distinct
for values that share a long prefix (:func:`fit`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Engine,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from graylane.clock import Clock, now_ms
from graylane.registry.migrate import create_db_engine, upgrade
from graylane.registry.schema import Base
from graylane.rollouts.pb import phase_from_pb
from graylane.rollouts.vocabulary import DecisionRule
from graylane.serde import decode, encode
from graylane.v1 import audit_pb2, rollout_pb2

__all__ = [
    "HASH_DIGITS",
    "AuditRow",
    "CommandRow",
    "ControlStore",
    "QosPolicyRow",
    "RolloutRow",
    "RouteConfigRow",
    "SinkOffsetRow",
    "StoredPolicy",
    "StoredRollout",
    "fit",
    "open_store",
]


# -- tables ------------------------------------------------------------------------------------


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


# -- ids that fit their column -----------------------------------------------------------------


HASH_DIGITS = 16
_MARK = "~"


def fit(value: str, limit: int) -> str:
    """``value`` if it has at most ``limit`` characters, else its stable hashed form."""
    if limit <= HASH_DIGITS + len(_MARK):
        raise ValueError(f"a column of {limit} characters cannot hold a hashed id")
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_DIGITS]
    return f"{value[: limit - HASH_DIGITS - len(_MARK)]}{_MARK}{digest}"


# -- the store ---------------------------------------------------------------------------------


_PROMOTED = (rollout_pb2.BAKING, rollout_pb2.PROMOTED)
"""Phases in which the candidate is the stable version."""


def _finished(phase: int) -> bool:
    known = phase_from_pb(phase)
    return known is not None and known.finished


@dataclass(frozen=True)
class StoredRollout:
    state: rollout_pb2.RolloutState
    created_by: str
    created_at_ms: int

    @property
    def finished(self) -> bool:
        return _finished(self.state.phase)


@dataclass(frozen=True)
class StoredPolicy:
    policy: rollout_pb2.QosPolicy
    updated_by: str
    updated_at_ms: int


def _stored(row: RolloutRow) -> StoredRollout:
    return StoredRollout(
        decode(rollout_pb2.RolloutState, row.state), row.created_by, row.created_at_ms
    )


class ControlStore:
    """Short transactions over a SQLAlchemy engine; returns protobuf copies, never rows."""

    def __init__(self, engine: Engine, clock: Clock = now_ms) -> None:
        self._engine = engine
        self._clock = clock
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._on_promoted: Callable[[rollout_pb2.RolloutState], None] | None = None
        self._on_rolled_back: Callable[[rollout_pb2.RolloutState], None] | None = None

    def on_promoted(self, hook: Callable[[rollout_pb2.RolloutState], None]) -> None:
        """Call ``hook`` with each state that newly records a promotion (after its commit):
        BAKING (promoted, the bake begins) or PROMOTED, whichever comes first."""
        self._on_promoted = hook

    def on_rolled_back(self, hook: Callable[[rollout_pb2.RolloutState], None]) -> None:
        """Call ``hook`` with each state that newly records a rollback (after its commit)."""
        self._on_rolled_back = hook

    @property
    def engine(self) -> Engine:
        return self._engine

    # ------------------------------------------------------------ rollouts + commands

    def create_rollout(
        self, state: rollout_pb2.RolloutState, command: rollout_pb2.RolloutCommand
    ) -> None:
        """Store a new rollout and its START command in one transaction."""
        now = self._clock()
        with self._sessions.begin() as session:
            session.add(_rollout_row(state, now))
            session.add(_command_row(command))

    def add_command(self, command: rollout_pb2.RolloutCommand) -> None:
        with self._sessions.begin() as session:
            session.add(_command_row(command))

    def mark_sent(self, command_id: str) -> None:
        with self._sessions.begin() as session:
            row = session.get(CommandRow, command_id)
            if row is not None:
                row.sent_at_ms = self._clock()

    def is_sent(self, command_id: str) -> bool:
        """Whether the broker acknowledged the command (False for an unknown id)."""
        with self._sessions() as session:
            row = session.get(CommandRow, command_id)
            return row is not None and row.sent_at_ms is not None

    def unsent_commands(self) -> list[rollout_pb2.RolloutCommand]:
        """Commands stored but never acknowledged by the broker, oldest first."""
        with self._sessions() as session:
            rows = session.scalars(
                select(CommandRow)
                .where(CommandRow.sent_at_ms.is_(None))
                .order_by(CommandRow.issued_at_ms)
            ).all()
            return [decode(rollout_pb2.RolloutCommand, r.payload) for r in rows]

    def commands_of(self, rollout_id: str) -> list[rollout_pb2.RolloutCommand]:
        with self._sessions() as session:
            rows = session.scalars(
                select(CommandRow)
                .where(CommandRow.rollout_id == rollout_id)
                .order_by(CommandRow.issued_at_ms)
            ).all()
            return [decode(rollout_pb2.RolloutCommand, r.payload) for r in rows]

    def get_rollout(self, rollout_id: str) -> StoredRollout | None:
        with self._sessions() as session:
            row = session.get(RolloutRow, _key(RolloutRow.rollout_id, rollout_id))
            return None if row is None else _stored(row)

    def list_rollouts(
        self, model: str = "", *, active_only: bool = False, limit: int = 100
    ) -> list[StoredRollout]:
        """Newest first."""
        query = select(RolloutRow)
        if model:
            query = query.where(RolloutRow.model == model)
        if active_only:
            query = query.where(RolloutRow.terminal == 0)
        query = query.order_by(RolloutRow.created_at_ms.desc()).limit(limit)
        with self._sessions() as session:
            return [_stored(r) for r in session.scalars(query).all()]

    def active_rollout(self, model: str) -> StoredRollout | None:
        found = self.list_rollouts(model, active_only=True, limit=1)
        return found[0] if found else None

    def apply_state(self, state: rollout_pb2.RolloutState) -> bool:
        """Record a RolloutState from the policy engine unless an equal or newer one is stored.

        Newer is a later update, and never a lower epoch: an instance of a sharded policy
        engine that lost the model's partition (a zombie) writes later states with epochs
        below its successor's, and those are passed over. A state for a rollout this store
        never saw (started elsewhere) is stored with the spec it embeds. Returns whether
        anything changed.
        """
        now = self._clock()
        with self._sessions.begin() as session:
            row = session.get(RolloutRow, _key(RolloutRow.rollout_id, state.rollout_id))
            if row is None:
                session.add(_rollout_row(state, now))
                return True
            promoted: rollout_pb2.RolloutState | None = None
            rolled_back: rollout_pb2.RolloutState | None = None
            if state.updated_at_unix_ms < row.state_updated_ms:
                return False
            if _older_epoch(state, row.state):
                return False
            merged = rollout_pb2.RolloutState()
            merged.CopyFrom(state)
            if not merged.HasField("spec"):
                merged.spec.ParseFromString(row.spec)
            data = encode(merged)
            if data == row.state:
                return False
            newly_promoted = merged.phase in _PROMOTED and row.phase not in _PROMOTED
            newly_rolled_back = merged.phase == rollout_pb2.ROLLED_BACK != row.phase
            row.state = data
            row.phase = merged.phase
            row.terminal = int(_finished(merged.phase))
            row.state_updated_ms = merged.updated_at_unix_ms
            row.updated_at_ms = now
            promoted = merged if newly_promoted else None
            rolled_back = merged if newly_rolled_back else None
        if promoted is not None and self._on_promoted is not None:
            self._on_promoted(promoted)
        if rolled_back is not None and self._on_rolled_back is not None:
            self._on_rolled_back(rolled_back)
        return True

    # ------------------------------------------------------------ QoS policies

    def put_policy(self, policy: rollout_pb2.QosPolicy, updated_by: str) -> StoredPolicy:
        now = self._clock()
        with self._sessions.begin() as session:
            row = session.get(QosPolicyRow, (policy.model, policy.version))
            if row is None:
                row = QosPolicyRow(model=policy.model, version=policy.version)
                session.add(row)
            row.policy = encode(policy)
            row.updated_by = updated_by
            row.updated_at_ms = now
        return StoredPolicy(policy, updated_by, now)

    # ------------------------------------------------------------ cohort routing

    def put_route_config(self, config: rollout_pb2.RouteConfig, updated_by: str) -> int:
        """Store a model's cohort routing; returns the time it was stored."""
        now = self._clock()
        with self._sessions.begin() as session:
            row = session.get(RouteConfigRow, config.model)
            if row is None:
                row = RouteConfigRow(model=config.model)
                session.add(row)
            row.config = encode(config)
            row.updated_by = updated_by
            row.updated_at_ms = now
        return now

    def get_route_config(self, model: str) -> tuple[rollout_pb2.RouteConfig, str, int] | None:
        """The model's cohort routing, who set it and when; None when never set."""
        with self._sessions() as session:
            row = session.get(RouteConfigRow, model)
            if row is None:
                return None
            return decode(rollout_pb2.RouteConfig, row.config), row.updated_by, row.updated_at_ms

    def get_policy(self, model: str, version: str) -> StoredPolicy | None:
        with self._sessions() as session:
            row = session.get(QosPolicyRow, (model, version))
            if row is None:
                return None
            return StoredPolicy(
                decode(rollout_pb2.QosPolicy, row.policy), row.updated_by, row.updated_at_ms
            )

    # ------------------------------------------------------------ audit copy

    def add_audit(self, records: Iterable[audit_pb2.AuditRecord]) -> int:
        """Insert records not stored yet (by ``decision_id``); returns how many were new."""
        batch = {_key(AuditRow.decision_id, r.decision_id): r for r in records if r.decision_id}
        if not batch:
            return 0
        with self._sessions.begin() as session:
            known = set(
                session.scalars(
                    select(AuditRow.decision_id).where(AuditRow.decision_id.in_(list(batch)))
                ).all()
            )
        added = 0
        for decision_id, record in batch.items():
            if decision_id in known:
                continue
            try:
                with self._sessions.begin() as session:
                    session.add(_audit_row(record))
                    if record.rule == DecisionRule.COMMAND_REJECTED:
                        _end_refused_start(session, record)
                added += 1
            except IntegrityError:
                # Another sink stored it between our read and our insert.
                continue
        return added

    def query_audit(
        self,
        *,
        model: str = "",
        rollout_id: str = "",
        from_ms: int = 0,
        to_ms: int = 0,
        limit: int = 1000,
        kinds: Sequence[int] = (),
        version: str = "",
        newest_first: bool = False,
    ) -> list[audit_pb2.AuditRecord]:
        query = select(AuditRow.record)
        if model:
            query = query.where(AuditRow.model == _key(AuditRow.model, model))
        if rollout_id:
            query = query.where(AuditRow.rollout_id == _key(AuditRow.rollout_id, rollout_id))
        if version:
            query = query.where(AuditRow.version == _key(AuditRow.version, version))
        if from_ms:
            query = query.where(AuditRow.decided_at_ms >= from_ms)
        if to_ms:
            query = query.where(AuditRow.decided_at_ms < to_ms)
        if kinds:
            query = query.where(AuditRow.kind.in_(list(kinds)))
        order = (AuditRow.decided_at_ms, AuditRow.id)
        if newest_first:
            query = query.order_by(*(c.desc() for c in order))
        else:
            query = query.order_by(*order)
        with self._sessions() as session:
            rows = session.scalars(query.limit(limit)).all()
            return [decode(audit_pb2.AuditRecord, data) for data in rows]

    # ------------------------------------------------------------ sink offsets

    def sink_offsets(self, topic: str) -> dict[int, int]:
        with self._sessions() as session:
            rows = session.scalars(select(SinkOffsetRow).where(SinkOffsetRow.topic == topic))
            return {r.partition: r.next_offset for r in rows}

    def save_sink_offset(self, topic: str, partition: int, next_offset: int) -> None:
        with self._sessions.begin() as session:
            row = session.get(SinkOffsetRow, (topic, partition))
            if row is None:
                session.add(
                    SinkOffsetRow(topic=topic, partition=partition, next_offset=next_offset)
                )
            elif next_offset > row.next_offset:
                row.next_offset = next_offset


def _end_refused_start(session: Session, record: audit_pb2.AuditRecord) -> None:
    """A refused START ends its rollout (still PENDING here) as ABORTED with the reason.

    Matched by command id to the START this store sent, so a refused manual
    command never ends a rollout the engine did take.
    """
    command = session.get(CommandRow, record.command_id) if record.command_id else None
    if command is None or command.kind != rollout_pb2.COMMAND_START:
        return
    row = session.get(RolloutRow, _key(RolloutRow.rollout_id, command.rollout_id))
    if row is None or row.phase != rollout_pb2.PENDING:
        return
    state = decode(rollout_pb2.RolloutState, row.state)
    state.phase = rollout_pb2.ABORTED
    state.last_reason = record.reason
    state.updated_at_unix_ms = max(record.decided_at_unix_ms, row.state_updated_ms)
    row.state = encode(state)
    row.phase = state.phase
    row.terminal = 1
    row.state_updated_ms = state.updated_at_unix_ms
    row.updated_at_ms = record.decided_at_unix_ms


def _rollout_row(state: rollout_pb2.RolloutState, now: int) -> RolloutRow:
    """A new row for ``state`` and the spec it embeds."""
    spec = state.spec
    return RolloutRow(
        rollout_id=_key(RolloutRow.rollout_id, state.rollout_id),
        model=_key(RolloutRow.model, state.model),
        baseline_version=_key(RolloutRow.baseline_version, spec.baseline_version),
        candidate_version=_key(RolloutRow.candidate_version, spec.candidate_version),
        phase=state.phase,
        terminal=int(_finished(state.phase)),
        spec=encode(spec),
        state=encode(state),
        state_updated_ms=state.updated_at_unix_ms,
        created_by=_key(RolloutRow.created_by, spec.created_by),
        created_at_ms=spec.created_at_unix_ms or now,
        updated_at_ms=now,
    )


def _command_row(command: rollout_pb2.RolloutCommand) -> CommandRow:
    return CommandRow(
        command_id=command.command_id,
        rollout_id=command.rollout_id,
        model=command.model,
        kind=command.kind,
        issued_by=command.issued_by,
        issued_at_ms=command.issued_at_unix_ms,
        payload=encode(command),
    )


def _width(column: Any) -> int:
    """The declared length of a ``String`` column."""
    return int(column.property.columns[0].type.length)


def _key(column: Any, value: str) -> str:
    """``value`` as stored in ``column``: as is, or hashed when it is longer (:func:`fit`)."""
    return fit(value, _width(column))


def _audit_row(record: audit_pb2.AuditRecord) -> AuditRow:
    return AuditRow(
        decision_id=_key(AuditRow.decision_id, record.decision_id),
        decided_at_ms=record.decided_at_unix_ms,
        model=_key(AuditRow.model, record.model),
        rollout_id=_key(AuditRow.rollout_id, record.rollout_id),
        version=_key(AuditRow.version, record.version),
        kind=record.kind,
        rule=_key(AuditRow.rule, record.rule),
        reason=record.reason,
        record=encode(record),
    )


def open_store(url: str | Engine, migrate: bool = True, clock: Clock = now_ms) -> ControlStore:
    """A :class:`ControlStore` on ``url`` with the schema migrated to the latest revision."""
    engine = create_db_engine(url) if isinstance(url, str) else url
    if migrate:
        upgrade(engine)
    return ControlStore(engine, clock)


def _older_epoch(state: rollout_pb2.RolloutState, stored: bytes) -> bool:
    """Whether ``state`` carries a lower epoch than the stored state (both must carry one)."""
    if not state.HasField("epoch"):
        return False
    before = decode(rollout_pb2.RolloutState, stored)
    return before.HasField("epoch") and state.epoch < before.epoch
