"""graylane.pbmap: one declared table per dataclass <-> protobuf pair, used both ways."""

from __future__ import annotations

import enum
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_from_pb, histogram_to_pb
from graylane.pbmap import EnumTable, Field, Flat, MappingError, PbMap
from graylane.v1 import audit_pb2, control_pb2, outcome_pb2


@dataclass(frozen=True)
class Arm:
    rated: int = 0
    total: float = 0.0
    squares: float = 0.0


@dataclass(frozen=True)
class Lag:
    at_ms: int
    lag: int
    committed: int | None = None


@dataclass(frozen=True)
class Live:
    version: str
    routed_since_telemetry: int = 0
    first_routed_ms: int | None = None
    lag: tuple[Lag, ...] = ()
    note: str = "kept here"


@dataclass(frozen=True)
class Qos:
    model: str
    breach_since_ms: int | None = None
    contention: float = 1.0


@dataclass(frozen=True)
class Mismatch:
    baseline: str
    candidate: str


@dataclass(frozen=True)
class Agreement:
    pairs: int = 0
    mismatch: Mismatch | None = None


def _or_zero(value: int | None) -> int:
    return value or 0


def _or_none(value: int) -> int | None:
    return value or None


def _or_one(value: float) -> float:
    return value or 1.0


ARM = PbMap(Arm, outcome_pb2.ArmOutcomes)
LAG = PbMap(
    Lag, audit_pb2.LagSample, {"at_ms": Field("at_unix_ms"), "committed": Field(absent=None)}
)
LIVE = PbMap(
    Live,
    audit_pb2.VersionLiveness,
    {
        "first_routed_ms": Field("first_routed_since_telemetry_unix_ms", absent=None),
        "lag": LAG.repeated(),
    },
    local=("note",),
)
QOS = PbMap(
    Qos,
    audit_pb2.QosState,
    {
        "breach_since_ms": Field("breach_since_unix_ms", to_pb=_or_zero, from_pb=_or_none),
        "contention": Field(from_pb=_or_one),
    },
)
MISMATCH = PbMap(
    Mismatch,
    audit_pb2.ShadowAgreement,
    {"baseline": Field("baseline_schema"), "candidate": Field("candidate_schema")},
)


def _has_mismatch(pb: audit_pb2.ShadowAgreement) -> bool:
    return bool(pb.baseline_schema or pb.candidate_schema)


AGREEMENT = PbMap(
    Agreement, audit_pb2.ShadowAgreement, {"mismatch": MISMATCH.flat(when=_has_mismatch)}
)


def test_a_plain_pair_round_trips_field_by_field() -> None:
    arm = Arm(rated=3, total=2.5, squares=4.0)
    pb = ARM.to_pb(arm)
    assert pb == outcome_pb2.ArmOutcomes(rated=3, total=2.5, squares=4.0)
    assert ARM.from_pb(pb) == arm
    assert ARM.from_pb(outcome_pb2.ArmOutcomes()) == Arm()


def test_a_renamed_field_travels_under_its_wire_name() -> None:
    pb = LAG.to_pb(Lag(at_ms=1700, lag=5))
    assert pb.at_unix_ms == 1700
    assert LAG.from_pb(audit_pb2.LagSample(at_unix_ms=42, lag=1)) == Lag(42, 1)


def test_converters_run_in_their_direction() -> None:
    assert QOS.to_pb(Qos("m")).breach_since_unix_ms == 0
    assert QOS.to_pb(Qos("m", breach_since_ms=9)).breach_since_unix_ms == 9
    assert QOS.from_pb(audit_pb2.QosState(model="m")) == Qos("m", None, 1.0)
    back = QOS.from_pb(audit_pb2.QosState(model="m", breach_since_unix_ms=9, contention=2.0))
    assert back == Qos("m", 9, 2.0)


def test_a_missing_optional_field_reads_as_its_absent_value() -> None:
    assert not LAG.to_pb(Lag(1, 2)).HasField("committed")
    assert LAG.from_pb(audit_pb2.LagSample(at_unix_ms=1, lag=2)).committed is None
    zero = LAG.to_pb(Lag(1, 2, committed=0))
    assert zero.HasField("committed")  # 0 is a value, not "absent"
    assert LAG.from_pb(zero).committed == 0


def test_nested_repeated_and_local_fields() -> None:
    live = Live("v2", 3, first_routed_ms=None, lag=(Lag(1, 2), Lag(3, 4, 0)), note="not sent")
    pb = LIVE.to_pb(live)
    assert [s.at_unix_ms for s in pb.lag] == [1, 3]
    assert not pb.HasField("first_routed_since_telemetry_unix_ms")
    back = LIVE.from_pb(pb)
    assert back.lag == live.lag and isinstance(back.lag, tuple)
    assert back.note == "kept here"  # local: the dataclass default ...
    assert LIVE.from_pb(pb, note="given") == Live("v2", 3, None, live.lag, "given")  # ... or given


def test_a_flat_value_sits_in_the_message_own_fields() -> None:
    pb = AGREEMENT.to_pb(Agreement(4, Mismatch("a:f32[1]", "a:f16[1]")))
    assert (pb.pairs, pb.baseline_schema, pb.candidate_schema) == (4, "a:f32[1]", "a:f16[1]")
    assert AGREEMENT.from_pb(pb) == Agreement(4, Mismatch("a:f32[1]", "a:f16[1]"))
    assert AGREEMENT.from_pb(AGREEMENT.to_pb(Agreement(4))) == Agreement(4)


def test_the_caller_adds_wire_fields_the_table_does_not_name() -> None:
    pb = QOS.to_pb(Qos("m"), active_variant="int8")
    assert (pb.model, pb.active_variant) == ("m", "int8")
    assert QOS.from_pb(pb) == Qos("m")  # and ignored on the way in


def test_a_field_the_caller_works_out_is_written_but_not_read() -> None:
    given = PbMap(
        Lag,
        audit_pb2.LagSample,
        {"at_ms": Field("at_unix_ms", read=False), "committed": Field(absent=None)},
    )
    assert given.to_pb(Lag(5, 1)).at_unix_ms == 5
    assert given.from_pb(audit_pb2.LagSample(at_unix_ms=5, lag=1), at_ms=6) == Lag(6, 1)
    with pytest.raises(TypeError):
        given.from_pb(audit_pb2.LagSample(at_unix_ms=5, lag=1))


@pytest.mark.parametrize(
    ("fields", "local", "says"),
    [
        ({"at_msec": Field("at_unix_ms")}, (), "not fields of Lag"),  # a typo on our side
        ({"at_ms": Field("at_unix_msec")}, (), "no field 'at_unix_msec' on the wire"),
        ({}, (), "no field 'at_ms' on the wire"),  # a dataclass field left unmapped
        ({"at_ms": Field("at_unix_ms"), "lag": Field(absent=0)}, (), "does not track presence"),
        ({"at_ms": Field("at_unix_ms")}, ("at_ms",), "both mapped and local"),
        ({"at_ms": Field("at_unix_ms", read=False, absent=None)}, (), "no absent value"),
    ],
)
def test_a_bad_table_raises_when_it_is_declared(
    fields: dict[str, Field | Flat], local: tuple[str, ...], says: str
) -> None:
    with pytest.raises(MappingError, match=says):
        PbMap(Lag, audit_pb2.LagSample, fields, local=local)


def test_a_flat_value_of_another_message_is_refused() -> None:
    with pytest.raises(MappingError, match="sits in another message"):
        PbMap(Live, audit_pb2.VersionLiveness, {"lag": ARM.flat()}, local=("first_routed_ms",))


def test_a_message_field_needs_its_converters() -> None:
    with pytest.raises(MappingError, match="'lag' is a message field"):
        PbMap(
            Live,
            audit_pb2.VersionLiveness,
            {"first_routed_ms": Field("first_routed_since_telemetry_unix_ms", absent=None)},
            local=("note",),
        )


def test_a_typo_in_a_module_table_fails_its_import(tmp_path: Path) -> None:
    source = tmp_path / "typo_mapping.py"
    source.write_text(
        "from dataclasses import dataclass\n"
        "from graylane.pbmap import Field, PbMap\n"
        "from graylane.v1 import audit_pb2\n\n"
        "@dataclass(frozen=True)\n"
        "class Sample:\n"
        "    at_ms: int\n"
        "    lag: int\n\n"
        'SAMPLE = PbMap(Sample, audit_pb2.LagSample, {"at_ms": Field("at_unix_sm")})\n'
    )
    spec = importlib.util.spec_from_file_location("typo_mapping", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        with pytest.raises(MappingError, match="at_unix_sm"):
            spec.loader.exec_module(module)
    finally:
        sys.modules.pop("typo_mapping", None)


class Reason(enum.Enum):
    FLOOR = "floor"
    LOAD = "load"


REASONS = EnumTable(
    {
        Reason.FLOOR: control_pb2.SCALE_REASON_FLOOR_BREACH,
        Reason.LOAD: control_pb2.SCALE_REASON_LOW_LOAD,
    },
    unset=control_pb2.SCALE_REASON_UNSPECIFIED,
)


def test_an_enum_table_maps_both_ways() -> None:
    for member in Reason:
        assert REASONS.from_pb(REASONS.to_pb(member)) is member
    assert REASONS.to_pb(None) == control_pb2.SCALE_REASON_UNSPECIFIED
    assert REASONS.from_pb(control_pb2.SCALE_REASON_UNSPECIFIED) is None
    assert REASONS.from_pb(999) is None  # a newer writer's value


def test_an_enum_table_refuses_a_shared_number() -> None:
    with pytest.raises(MappingError):
        EnumTable({Reason.FLOOR: 1, Reason.LOAD: 1})
    with pytest.raises(MappingError):
        EnumTable({Reason.FLOOR: 0})


@dataclass(frozen=True)
class Generations:
    generations: int
    ttft: LatencyHistogram | None = None


GENERATIONS = PbMap(
    Generations,
    audit_pb2.GenerationWindow,
    {"ttft": Field(to_pb=histogram_to_pb, from_pb=histogram_from_pb, absent=None)},
)


def test_an_optional_sub_message_goes_in_as_its_converter_built_it() -> None:
    """Copied in, not rebuilt: even a serialization that does not sort map keys (a bake
    reference's) gives the bytes of the hand-built message."""
    histogram = LatencyHistogram()
    for ms in (1.0, 2.0, 3.0, 250.0, 7.5):
        histogram.record(ms)
    built = audit_pb2.GenerationWindow(generations=2)
    built.ttft.CopyFrom(histogram_to_pb(histogram))
    mapped = GENERATIONS.to_pb(Generations(2, histogram))
    assert mapped.SerializeToString() == built.SerializeToString()
    assert not GENERATIONS.to_pb(Generations(2)).HasField("ttft")
    assert GENERATIONS.from_pb(mapped).ttft == histogram
    assert GENERATIONS.from_pb(audit_pb2.GenerationWindow(generations=2)).ttft is None
