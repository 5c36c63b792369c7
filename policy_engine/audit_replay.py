"""Verify recorded rollout decisions by replaying them through the pure controllers.

Every rollout ``AuditRecord`` carries the whole state before the decision
(evidence, timers, epoch), its window stats, shadow agreement and command, so
each record replays on its own: :func:`verify` rebuilds the inputs, calls
``start`` / ``evaluate`` / ``apply_command`` and compares the replayed record
with the recorded one (kind, rule, reason, state after, epoch, decision id).
Records of QoS decisions, QoS policy changes and rejected commands are not
rollout decisions and are skipped. ``graylane audit verify`` calls these.
"""

from __future__ import annotations

import logging

from graylane import serde
from graylane.errors import SerdeError
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import ClientFactory
from graylane.policy_engine import wire
from graylane.policy_engine.logic.qos import evaluate_qos
from graylane.policy_engine.logic.replay import Mismatch
from graylane.policy_engine.logic.revision import revise
from graylane.policy_engine.logic.rollout import Decision, apply_command, evaluate, start
from graylane.rollouts.errors import PolicyError
from graylane.rollouts.pb import decision_kind_from_pb, decision_rule_from_pb, qos_policy_from_pb
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule
from graylane.v1 import audit_pb2

__all__ = [
    "COMPARED_FIELDS",
    "load_recorded",
    "replay_qos_record",
    "replay_record",
    "verify",
]

log = logging.getLogger(__name__)

COMPARED_FIELDS = ("decision_id", "kind", "rule", "reason", "rollout_after", "epoch")


async def load_recorded(
    factory: ClientFactory,
    model: str,
    rollout_id: str = "",
    from_ms: int = 0,
    to_ms: int = 0,
    *,
    timeout_s: float = 30.0,
) -> list[audit_pb2.AuditRecord]:
    """Audit records of ``model`` (and ``rollout_id`` when given) decided in
    ``[from_ms, to_ms)`` (``to_ms`` 0: up to now), in decision order. A record that
    is no audit record is skipped (logged, counted), never fatal."""
    out: list[audit_pb2.AuditRecord] = []
    audit = factory.layout.audit()
    skipped = 0
    for r in await read_to_end(factory, audit, timeout_s=timeout_s, client_suffix="audit"):
        try:
            rec = serde.decode(audit_pb2.AuditRecord, r.value)
        except SerdeError as exc:  # not an audit record: skipped, never fatal
            log.warning("skipping audit record at %d/%d: %s", r.partition, r.offset, exc)
            skipped += 1
            continue
        if rec.model != model or (rollout_id and rec.rollout_id != rollout_id):
            continue
        at = rec.decided_at_unix_ms
        if at >= from_ms and (not to_ms or at < to_ms):
            out.append(rec)
    if skipped:
        log.warning("skipped %d undecodable records of %s", skipped, audit)
    out.sort(key=lambda r: (r.decided_at_unix_ms, r.epoch))
    return out


def _is_rollout_decision(rec: audit_pb2.AuditRecord) -> bool:
    return (
        decision_kind_from_pb(rec.kind) is not None
        and rec.HasField("rollout_before")
        and rec.HasField("rollout_after")
    )


def replay_record(rec: audit_pb2.AuditRecord) -> Decision:
    """The decision the controllers make today from the record's inputs."""
    before, spec = wire.rollout_state_from_pb(rec.rollout_before)
    at = rec.decided_at_unix_ms
    kind = decision_kind_from_pb(rec.kind)
    if kind is DecisionKind.STARTED:
        return start(spec, at, epoch=before.epoch)
    if decision_rule_from_pb(rec.rule) is DecisionRule.SPEC_UPDATED:
        _, applied = wire.rollout_state_from_pb(rec.rollout_after)
        return revise(before, spec, applied, at, note=rec.note)
    if kind is DecisionKind.MANUAL:
        rule = decision_rule_from_pb(rec.rule)
        command = rule.command if rule is not None else None
        if command is None:
            raise ValueError(f"manual decision with rule {rec.rule!r} names no command")
        return apply_command(before, spec, command, at, note=rec.note)
    stats = {s.version: wire.window_stats_from_pb(s) for s in rec.inputs}
    agreement = wire.agreement_from_pb(rec.agreement) if rec.HasField("agreement") else None
    signals = wire.signals_from_audit(rec, spec.baseline, spec.candidate)
    return evaluate(
        before, spec, stats.get(spec.baseline), stats.get(spec.candidate), agreement, at, signals
    )


# Decisions of the candidate during a rollout follow the baseline's state, which the
# record does not carry; they are not replayed.
_QOS_FOLLOWING = frozenset(
    {
        DecisionRule.LIKE_FOR_LIKE,
        DecisionRule.LIKE_FOR_LIKE_UNAVAILABLE,
        DecisionRule.FOLLOW_BASELINE,
    }
)


def _is_qos_decision(rec: audit_pb2.AuditRecord) -> bool:
    return (
        rec.HasField("qos_before")
        and rec.HasField("qos_after")
        and rec.HasField("qos_policy")
        and rec.rule not in _QOS_FOLLOWING
    )


def replay_qos_record(rec: audit_pb2.AuditRecord) -> audit_pb2.AuditRecord:
    """The QoS controller's decision today from the record's state, policy and window."""
    before = wire.qos_state_from_pb(rec.qos_before)
    policy = qos_policy_from_pb(rec.qos_policy)
    stats = wire.window_stats_from_pb(rec.inputs[0]) if rec.inputs else None
    decision = evaluate_qos(
        before, policy, stats, rec.decided_at_unix_ms, scale_hold=rec.qos_scale_hold
    )
    return wire.qos_decision_to_audit(
        decision, epoch=rec.epoch, rollout_id=rec.rollout_id, actor=rec.actor, policy=policy
    )


def verify(recorded: list[audit_pb2.AuditRecord]) -> list[Mismatch]:
    """Differences between recorded rollout and QoS decisions and their replay (empty: none)."""
    out: list[Mismatch] = []
    for i, rec in enumerate(recorded):
        if not _is_qos_decision(rec):
            continue
        try:
            again = replay_qos_record(rec)
        except (PolicyError, ValueError) as exc:
            out.append(Mismatch(i, "<error>", rec.reason, f"{type(exc).__name__}: {exc}"))
            continue
        for name in ("decision_id", "kind", "rule", "reason", "qos_after"):
            a, b = getattr(rec, name), getattr(again, name)
            if a != b:
                out.append(Mismatch(i, name, a, b))
    for i, rec in enumerate(recorded):
        if not _is_rollout_decision(rec):
            continue
        try:
            decision = replay_record(rec)
        except (PolicyError, ValueError) as exc:
            out.append(Mismatch(i, "<error>", rec.reason, f"{type(exc).__name__}: {exc}"))
            continue
        _, spec = wire.rollout_state_from_pb(rec.rollout_before)
        _, spec_after = wire.rollout_state_from_pb(rec.rollout_after)
        again = wire.decision_to_audit(
            decision,
            spec_after,
            command_id=rec.command_id,
            actor=rec.actor,
            spec_before=spec if spec_after != spec else None,
        )
        for name in COMPARED_FIELDS:
            a, b = getattr(rec, name), getattr(again, name)
            if a != b:
                out.append(Mismatch(i, name, a, b))
    return out
