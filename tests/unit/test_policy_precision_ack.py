"""Precision acknowledgements: a switch is confirmed from telemetry, or audited as refused."""

from __future__ import annotations

from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.precision_ack import AckVerdict, PendingSwitch, judge_switch
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    PrecisionAck,
    PrecisionPublication,
)
from graylane.policy_engine.state import VersionKey
from graylane.policy_engine.wire import records_of
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule
from graylane.serde import decode
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2
from tests.unit.test_policy_core import MODEL, batch

SWITCH = PendingSwitch(MODEL, "v1", "fp16", 5, 10_000, "fp32")


def test_judge_switch() -> None:
    # served after the switch: confirmed at once
    assert judge_switch(SWITCH, {"fp16": 10_500}, 11_000) == (AckVerdict.CONFIRMED, "fp16")
    # served before the switch only: not a confirmation
    assert judge_switch(SWITCH, {"fp16": 9_000}, 11_000)[0] is AckVerdict.PENDING
    # the old variant keeps serving: refused only once the bound has passed
    served = {"fp32": 24_000}
    assert judge_switch(SWITCH, served, 24_999)[0] is AckVerdict.PENDING
    assert judge_switch(SWITCH, served, 25_000) == (AckVerdict.REFUSED, "fp32")
    # nothing served at all is no evidence (a dead worker is not a refusal)
    assert judge_switch(SWITCH, {}, 90_000)[0] is AckVerdict.PENDING


def _qos_core() -> PolicyCore:
    """A core with a QoS policy (SLO 20 ms, fp32 -> fp16 -> int8) set at time 0."""
    policy = QosPolicy(
        model=MODEL,
        version="v1",
        slo_p99_ms=20.0,
        ladder=("fp32", "fp16", "int8"),
        sustain_s=2.0,
        min_dwell_s=3.0,
    )
    core = PolicyCore(window_ms=2000, step_ms=1000)
    core.on_command(Command(kind=CommandKind.SET_QOS_POLICY, model=MODEL, qos_policy=policy), 0)
    return core


def _run(follow: bool) -> list[PrecisionAck]:
    core = _qos_core()
    acks: list[PrecisionAck] = []
    variant = "fp32"
    for t in range(0, 40_000, 250):
        core.on_telemetry(batch("v1", t, n=12, ms=60.0, variant=variant))
        if t % 1000 == 0:
            for o in core.tick(t):
                if isinstance(o, PrecisionPublication) and follow:
                    variant = o.decision.variant
                if isinstance(o, PrecisionAck):
                    acks.append(o)
    if not follow:  # the controller is back on what the workers serve
        assert core.qos.states[VersionKey(MODEL, "v1")].active_variant in ("fp32", "fp16")
        assert all(a.served == "fp32" for a in acks)
    return acks


def test_a_followed_switch_is_confirmed() -> None:
    acks = _run(follow=True)
    assert acks and (acks[0].variant, acks[0].served) == ("fp16", "fp16")
    assert all(a.rule is DecisionRule.PRECISION_CONFIRMED for a in acks)
    assert all(a.variant == a.served for a in acks)


def test_an_ignored_switch_is_refused_and_audited() -> None:
    acks = _run(follow=False)
    assert acks and acks[0].rule is DecisionRule.PRECISION_REFUSED
    assert (acks[0].variant, acks[0].served) == ("fp16", "fp32")
    rec = decode(audit_pb2.AuditRecord, records_of(acks[:1], TopicLayout(prefix="p"))[0].value)
    assert rec.rule == "precision_refused" and "still serve fp32" in rec.reason


def test_audit_verify_replays_qos_decisions() -> None:
    from graylane.policy_engine.audit_replay import verify
    from graylane.policy_engine.messages import QosAudit

    core = _qos_core()
    audits: list[QosAudit] = []
    variant = "fp32"
    for t in range(0, 40_000, 250):
        slow = t < 12_000
        core.on_telemetry(
            batch("v1", t, n=12 if slow else 3, ms=60.0 if slow else 3.0, variant=variant)
        )
        if t % 1000 == 0:
            for o in core.tick(t):
                if isinstance(o, PrecisionPublication):
                    variant = o.decision.variant
                if isinstance(o, QosAudit):
                    audits.append(o)
    records = [
        decode(audit_pb2.AuditRecord, r.value) for r in records_of(audits, TopicLayout(prefix="p"))
    ]
    assert len(records) >= 4 and all(r.HasField("qos_policy") for r in records)
    assert {r.rule for r in records} >= {"sustain", "p99_breach"}
    assert verify(records) == []
    tampered = audit_pb2.AuditRecord()
    tampered.CopyFrom(next(r for r in records if r.rule == "p99_breach"))
    tampered.qos_after.active_variant = "int8"
    found = verify([tampered])
    assert [m.field for m in found] == ["qos_after"]
