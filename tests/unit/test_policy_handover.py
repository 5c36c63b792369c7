"""A killed policy instance's handover, judged from audit records alone (pure)."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from app.bench.policy_handover import DecisionLedger, judge_takeover
from graylane.kafka.seam import Record
from graylane.v1 import audit_pb2


def _audit(
    model: str, instance: str, generation: int, before: int, after: int, *, rollback: bool = False
) -> Record:
    a = audit_pb2.AuditRecord(
        model=model,
        rollout_id=f"{model}-canary",
        kind=audit_pb2.DECISION_ROLLBACK if rollback else audit_pb2.DECISION_ADVANCE,
    )
    a.decided_by.instance = instance
    a.decided_by.generation = generation
    a.rollout_before.step_index = before
    a.rollout_after.step_index = after
    value = a.SerializeToString()
    return ConsumerRecord("p.audit", 0, 0, 0, 0, None, value, None, 0, len(value), ())


def test_a_clean_handover_resumes_each_model_where_the_dead_instance_left_it() -> None:
    ledger = DecisionLedger()
    for record in (
        _audit("m1", "a", 1, 0, 1),
        _audit("m2", "a", 1, 0, 0),
        _audit("m1", "b", 2, 1, 2),  # after the kill: b takes over at step 1
        _audit("m2", "b", 2, 0, 0),
        _audit("m2", "b", 2, 0, 0, rollback=True),
    ):
        ledger.take(record)
    assert ledger.owner("m1") == "b"
    taken = judge_takeover(ledger, "a", ["m1", "m2"], took_s=3.0, lost=0, detected_ms={"m2": 900.0})
    assert taken.clean, taken
    assert taken.models_moved == 2 and taken.regressions_after == (900.0,)


def test_a_step_lost_two_deciders_a_double_rollback_and_a_miss_are_each_counted() -> None:
    ledger = DecisionLedger()
    for record in (
        _audit("m1", "a", 1, 1, 2),
        _audit("m1", "b", 2, 0, 1),  # resumed from step 0, not 2
        _audit("m2", "a", 1, 0, 0, rollback=True),
        _audit("m2", "c", 1, 0, 0, rollback=True),  # generation 1 by two instances
        _audit("m3", "a", 1, 0, 0),  # nobody took m3
    ):
        ledger.take(record)
    taken = judge_takeover(
        ledger, "a", ["m1", "m2", "m3"], took_s=9.0, lost=1, detected_ms={"m1": None}
    )
    assert not taken.clean
    assert taken.step_changed == 1
    assert taken.double_deciders == 1
    assert taken.duplicate_rollbacks == 1
    assert taken.missed_after == 1 and taken.regressions_after == ()
    assert ledger.handover("m3", "a") is None
