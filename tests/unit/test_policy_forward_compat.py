"""Forward-compatible readers of the policy engine: every topic it reads (telemetry,
shadow results, commands, routing, rollouts, scale, precision, the QoS policies among the
commands, the lease topic, audit) takes records of a newer writer. An unknown field is
ignored; an unknown enum value is kept as its number or, where the record cannot be
interpreted without it, the record is skipped and counted; nothing raises."""

from __future__ import annotations

import asyncio

import pytest

from graylane import serde
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.policy_engine import audit_replay, wire
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.isolation import RecordGuard
from graylane.policy_engine.lease import claims_of
from graylane.policy_engine.logic.rollout import start
from graylane.policy_engine.messages import (
    Command,
    CommandRejected,
    RecordSkipped,
    RecordSource,
    SkipReason,
)
from graylane.policy_engine.service import telemetry_into
from graylane.policy_engine.state import VersionKey
from graylane.rollouts.errors import InvalidSpec
from graylane.rollouts.pb import gate_mode_from_pb, rollout_spec_to_pb, strategy_from_pb
from graylane.rollouts.spec import GateMode, RolloutSpec, Step, Strategy
from graylane.routing.convert import table_to_pb
from graylane.routing.table import table_for_weights
from graylane.settings import Settings
from graylane.topics import TopicLayout
from graylane.v1 import (
    audit_pb2,
    control_pb2,
    inference_pb2,
    rollout_pb2,
    telemetry_pb2,
    tensor_pb2,
)
from tests.support.memory_kafka import MemoryBroker, MemoryFactory
from tests.support.newer_records import UNKNOWN, varint, with_enum, with_unknown_fields


def spec(model: str = "gpt", rollout_id: str = "r1") -> RolloutSpec:
    return RolloutSpec(
        rollout_id=rollout_id,
        model=model,
        baseline="v1",
        candidate="v2",
        steps=(Step(10.0, 5, 1.0), Step(100.0, 0, 0.0)),
    )


def telemetry() -> bytes:
    h = LatencyHistogram()
    h.record(5.0)
    return serde.encode(
        telemetry_pb2.BatchTelemetry(
            model="gpt",
            version="v1",
            variant="fp32",
            completed_at_unix_ms=1_000,
            request_count=1,
            latency=histogram_to_pb(h),
        )
    )


# --- telemetry -------------------------------------------------------------------------


def test_telemetry_with_unknown_fields_is_taken() -> None:
    core = PolicyCore()
    value = telemetry()
    latency = telemetry_pb2.BatchTelemetry.DESCRIPTOR.fields_by_name["latency"].number
    nested = serde.encode(telemetry_pb2.BatchTelemetry.FromString(value).latency)
    newer = with_unknown_fields(value) + varint(latency << 3 | 2)
    newer += varint(len(with_unknown_fields(nested))) + with_unknown_fields(nested)
    assert telemetry_into(core, newer, RecordGuard(), 1_000) is None
    assert core.acks.served_at[VersionKey("gpt", "v1")] == {"fp32": 1_000}


# --- shadow results --------------------------------------------------------------------


def shadow_result(dtype: int = tensor_pb2.FLOAT32, status: int = inference_pb2.OK) -> bytes:
    result = inference_pb2.InferenceResult(
        request_id="r",
        version="v2",
        status=inference_pb2.OK,
        shadow_pair_id="0-1-2",
        outputs=[tensor_pb2.Tensor(name="logits", dtype=tensor_pb2.FLOAT32, shape=[1, 2])],
    )
    result.outputs[0].data = b"\x00" * 8
    value = serde.encode(result)
    tensor_dtype = tensor_pb2.Tensor.DESCRIPTOR.fields_by_name["dtype"].number
    outputs = inference_pb2.InferenceResult.DESCRIPTOR.fields_by_name["outputs"].number
    status_field = inference_pb2.InferenceResult.DESCRIPTOR.fields_by_name["status"].number
    if dtype != tensor_pb2.FLOAT32:
        tensor = with_enum(serde.encode(result.outputs[0]), tensor_dtype, dtype)
        del result.outputs[:]
        value = serde.encode(result) + varint(outputs << 3 | 2) + varint(len(tensor)) + tensor
    if status != inference_pb2.OK:
        value = with_enum(value, status_field, status)
    return value


def test_a_shadow_result_with_an_unknown_dtype_keeps_its_number_in_the_schema() -> None:
    """Unknown dtype values used to raise in ``DType.Name``: the result was skipped, and a
    newer worker's outputs could never be compared."""
    out = wire.shadow_of(shadow_result(dtype=UNKNOWN), RecordGuard(), 5)
    assert not isinstance(out, RecordSkipped)
    assert out.schema is not None and out.schema[0].dtype == f"dtype_{UNKNOWN}"
    assert out.pair_id == "0-1-2" and not out.error


def test_a_shadow_result_with_an_unknown_status_or_unknown_fields_is_read() -> None:
    out = wire.shadow_of(shadow_result(status=UNKNOWN), RecordGuard(), 5)
    assert not isinstance(out, RecordSkipped) and out.error  # not OK: not an answer
    same = wire.shadow_of(with_unknown_fields(shadow_result()), RecordGuard(), 5)
    plain = wire.shadow_of(shadow_result(), RecordGuard(), 5)
    assert same == plain and not isinstance(same, RecordSkipped)


# --- commands --------------------------------------------------------------------------

KIND = rollout_pb2.RolloutCommand.DESCRIPTOR.fields_by_name["kind"].number


def start_command(s: RolloutSpec | None = None) -> rollout_pb2.RolloutCommand:
    return rollout_pb2.RolloutCommand(
        command_id="c1",
        model="gpt",
        kind=rollout_pb2.COMMAND_START,
        spec=rollout_spec_to_pb(s or spec()),
        issued_at_unix_ms=3,
    )


def test_a_command_of_an_unknown_kind_is_rejected_and_audited_not_fatal() -> None:
    value = with_enum(serde.encode(rollout_pb2.RolloutCommand(command_id="c9", model="gpt")), KIND)
    out = wire.command_of(value, RecordGuard(), 7)
    assert isinstance(out, CommandRejected) and f"unknown command kind {UNKNOWN}" in out.reason
    records = wire.records_of([out], TopicLayout(prefix="t"))
    audit = serde.decode(audit_pb2.AuditRecord, records[0].value)
    assert audit.command_id == "c9" and "rejected" in audit.reason


def test_a_start_with_unknown_fields_is_taken_as_it_is() -> None:
    newer = with_unknown_fields(serde.encode(start_command()))
    out = wire.command_of(newer, RecordGuard(), 7)
    assert isinstance(out, Command) and out.spec == spec()


@pytest.mark.parametrize("field", ["strategy", "mode"])
def test_a_start_with_an_unknown_strategy_or_gate_mode_is_rejected_not_run_otherwise(
    field: str,
) -> None:
    """An unknown strategy used to become CANARY and an unknown gate mode the default mode:
    the engine would run a rollout other than the one its writer asked for."""
    pb = start_command()
    if field == "strategy":
        pb.spec.strategy = UNKNOWN  # type: ignore[assignment]
    else:
        pb.spec.gates.mode = UNKNOWN  # type: ignore[assignment]
    out = wire.command_of(serde.encode(pb), RecordGuard(), 7)
    assert isinstance(out, CommandRejected) and "not known to this build" in out.reason


def test_unspecified_strategy_and_gate_mode_still_take_the_defaults() -> None:
    assert strategy_from_pb(0) is Strategy.CANARY and gate_mode_from_pb(0) is None
    assert gate_mode_from_pb(rollout_pb2.GATE_MODE_FIXED) is GateMode.FIXED
    with pytest.raises(InvalidSpec):
        strategy_from_pb(UNKNOWN)


# --- control topics at restore -----------------------------------------------------------


def rollout_state(s: RolloutSpec) -> rollout_pb2.RolloutState:
    return wire.rollout_state_to_pb(start(s, 1_000).after, s)


def test_restore_takes_unknown_fields_and_skips_what_an_unknown_enum_leaves_uninterpretable() -> (
    None
):
    table = table_to_pb(table_for_weights(model="gpt", stable_version="v1", epoch=4))
    phase = rollout_pb2.RolloutState.DESCRIPTOR.fields_by_name["phase"].number
    paused_from = rollout_pb2.RolloutState.DESCRIPTOR.fields_by_name["paused_from"].number
    newer_strategy = rollout_state(spec("gpt", "r-strategy"))
    newer_strategy.spec.strategy = UNKNOWN  # type: ignore[assignment]
    rollouts = {
        b"r1": with_unknown_fields(serde.encode(rollout_state(spec()))),
        b"r-phase": with_enum(serde.encode(rollout_state(spec("p", "r-phase"))), phase),
        b"r-paused": with_enum(serde.encode(rollout_state(spec("q", "r-paused"))), paused_from),
        b"r-strategy": serde.encode(newer_strategy),
    }
    precision = {
        b"gpt/v1": with_unknown_fields(
            serde.encode(control_pb2.PrecisionCommand(model="gpt", version="v1", variant="int8"))
        )
    }
    reason = control_pb2.ScaleRequest.DESCRIPTOR.fields_by_name["reason"].number
    scale_value = serde.encode(
        control_pb2.ScaleRequest(model="gpt", version="v1", desired_replicas=3, epoch=2)
    )
    scale = {
        b"gpt/v1": with_unknown_fields(with_enum(scale_value, reason)),
        b"gpt/v2": b"\xff\xfe garbage",
    }
    qos = rollout_pb2.RolloutCommand(
        kind=rollout_pb2.COMMAND_SET_QOS_POLICY,
        qos_policy=rollout_pb2.QosPolicy(
            model="gpt", version="v1", slo_p99_ms=100.0, ladder=["fp32", "int8"]
        ),
    )
    commands = [
        with_unknown_fields(serde.encode(qos)),
        with_enum(serde.encode(rollout_pb2.RolloutCommand(model="gpt")), KIND),
        None,
    ]
    restored = wire.restore_values(
        {b"gpt": with_unknown_fields(serde.encode(table))},
        precision,
        rollouts,
        RecordGuard(),
        5_000,
        scale=scale,
        commands=commands,
    )
    assert [s.rollout_id for s, _ in restored.states] == ["r1"]
    assert restored.epochs == {"gpt": 4} and set(restored.tables) == {"gpt"}
    assert restored.precision == {VersionKey("gpt", "v1"): ("int8", 0)}
    assert restored.scale == {VersionKey("gpt", "v1"): (3, 2, 0)}
    assert [(p.model, p.version) for p in restored.qos_policies] == [("gpt", "v1")]
    got = {(s.source, s.key, s.reason) for s in restored.skipped}
    assert got == {
        (RecordSource.ROLLOUTS, "r-phase", SkipReason.INVALID),
        (RecordSource.ROLLOUTS, "r-paused", SkipReason.INVALID),
        (RecordSource.ROLLOUTS, "r-strategy", SkipReason.INVALID),
        (RecordSource.SCALE, "gpt/v2", SkipReason.UNDECODABLE),
    }
    phase_skip = next(s for s in restored.skipped if s.key == "r-phase")
    assert f"phase {UNKNOWN}, unknown to this build" in phase_skip.detail
    fresh = PolicyCore()
    restored.apply(fresh)
    assert set(fresh.rollouts) == {"gpt"}


# --- the lease topic ---------------------------------------------------------------------


def lease(holder: str, term: int) -> bytes:
    return serde.encode(
        control_pb2.PolicyLease(holder=holder, term=term, at_unix_ms=1_000, ttl_ms=6_000)
    )


def test_the_lease_fold_skips_and_counts_bad_records_and_ignores_unknown_fields() -> None:
    """An undecodable record on the lease topic used to raise out of ``LeaseKeeper.read``:
    at start the engine died (and died again on every restart), while running it fenced."""
    records = claims_of(
        [
            b"\xff\xfe not a lease",
            with_unknown_fields(lease("a", 1)),
            None,
            lease("", 2),  # no holder: no claim
            lease("a", 1),
        ]
    )
    assert records.skipped == 2
    assert [(c.holder, c.term) for c in records.claims] == [("a", 1), ("a", 1)]


# --- audit, read back by ``audit verify`` ------------------------------------------------


def test_audit_read_back_skips_undecodable_records_and_keeps_unknown_kinds_out_of_replay() -> None:
    broker = MemoryBroker()
    factory = MemoryFactory(broker, Settings(topic_prefix="t"))
    topic = factory.layout.audit()
    broker.create_topic(topic, 1)
    s = spec()
    decision = start(s, 1_000)
    good = serde.encode(wire.decision_to_audit(decision, s))
    kind = audit_pb2.AuditRecord.DESCRIPTOR.fields_by_name["kind"].number
    newer = with_enum(with_unknown_fields(good), kind)
    for value in (b"\xff\xfe garbage", with_unknown_fields(good), newer):
        broker.append(topic, value, key=b"gpt")
    recorded = asyncio.run(audit_replay.load_recorded(factory, "gpt", timeout_s=5.0))
    assert len(recorded) == 2 and recorded[1].kind == UNKNOWN
    assert audit_replay.verify(recorded) == []  # the unknown kind is no rollout decision


def test_a_decision_of_an_unknown_kind_is_not_replayed() -> None:
    s = spec()
    rec = wire.decision_to_audit(start(s, 1_000), s)
    rec = replace_kind(rec, UNKNOWN)
    assert audit_replay.verify([rec]) == []


def replace_kind(rec: audit_pb2.AuditRecord, kind: int) -> audit_pb2.AuditRecord:
    out = audit_pb2.AuditRecord()
    out.CopyFrom(rec)
    out.kind = kind  # type: ignore[assignment]
    return out
