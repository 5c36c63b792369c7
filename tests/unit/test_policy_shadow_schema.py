"""Shadow schema check: answers of different output schemas are incomparable, never promoted."""

from __future__ import annotations

from graylane.policy_engine import wire
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.agreement import (
    AgreementStats,
    AgreementTracker,
    OutputField,
    SchemaMismatch,
    ShadowOutput,
    describe_schema,
)
from graylane.policy_engine.logic.rollout import evaluate, start
from graylane.policy_engine.logic.window import WindowStats
from graylane.policy_engine.messages import Command, CommandKind, RolloutAudit
from graylane.policy_engine.wire import shadow_output_of
from graylane.rollouts.spec import RolloutSpec, Step, Strategy
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase
from graylane.v1 import inference_pb2, tensor_pb2

TEN = (OutputField("logits", "float32", (1, 10)),)
ELEVEN = (OutputField("logits", "float32", (1, 11)),)
RENAMED = (OutputField("scores", "float32", (1, 10)),)
HALF = (OutputField("logits", "float16", (1, 10)),)

SPEC = RolloutSpec(
    rollout_id="r1",
    model="m",
    baseline="v1",
    candidate="v2",
    steps=(Step(10.0, 10, 1.0), Step(100.0, 0, 0.0)),
    strategy=Strategy.SHADOW_THEN_CANARY,
    shadow_share=0.5,
    shadow_duration_s=1.0,
)


def out(
    rid: str, version: str, schema: tuple[OutputField, ...] | None, label: int = 1
) -> ShadowOutput:
    return ShadowOutput(request_id=rid, version=version, at_ms=0, label=label, schema=schema)


def test_same_schema_pairs_and_compares() -> None:
    t = AgreementTracker("v1", "v2")
    t.add(out("a", "v1", TEN))
    assert t.add(out("a", "v2", TEN)) is not None
    assert t.stats() == AgreementStats(1, 1) and t.stats().comparable


def test_shape_name_and_dtype_mismatches_are_incomparable() -> None:
    for other in (ELEVEN, RENAMED, HALF):
        t = AgreementTracker("v1", "v2")
        t.add(out("a", "v1", TEN))
        # same label: a meaningless "agreement" that must not be counted
        assert t.add(out("a", "v2", other)) is None
        stats = t.stats()
        assert stats.pairs == 0 and not stats.comparable
        assert stats.mismatch == SchemaMismatch(describe_schema(TEN), describe_schema(other))
        assert "logits:float32[1,10]" in str(stats.mismatch)


def test_unknown_schema_or_error_is_not_a_mismatch() -> None:
    t = AgreementTracker("v1", "v2")
    t.add(out("a", "v1", TEN))
    assert t.add(out("a", "v2", None)) is not None
    t.add(ShadowOutput(request_id="b", version="v1", at_ms=0, error=True, schema=()))
    assert t.add(out("b", "v2", ELEVEN)) is not None
    assert t.stats().comparable


def test_schema_is_read_from_result_tensors_in_name_order() -> None:
    pb = inference_pb2.InferenceResult(request_id="r", version="v2")
    pb.outputs.add(name="b", dtype=tensor_pb2.INT64, shape=[1])
    pb.outputs.add(name="a", dtype=tensor_pb2.FLOAT32, shape=[1, 3])
    got = shadow_output_of(pb, 5)
    assert got.schema is not None
    assert describe_schema(got.schema) == "a:float32[1,3] b:int64[1]"


def _window(version: str) -> WindowStats:
    return WindowStats(
        model="m", version=version, variant="fp32", window_start_ms=0, window_end_ms=10_000,
        requests=500, errors=0, p50_ms=5.0, p95_ms=8.0, p99_ms=10.0, mean_ms=5.0,
        throughput_rps=50.0,
    )  # fmt: skip


def test_an_incomparable_shadow_stops_and_is_never_promoted() -> None:
    state = start(SPEC, 0).after
    mismatch = SchemaMismatch("logits:float32[1,10]", "logits:float32[1,11]")
    # plenty of perfectly "agreeing" pairs and dwell met: still not promoted
    d = evaluate(
        state, SPEC, _window("v1"), _window("v2"), AgreementStats(900, 900, mismatch), 60_000
    )
    assert d.rule is DecisionRule.INCOMPARABLE and d.kind is DecisionKind.GATE_FAILED
    assert d.after.phase is Phase.ABORTED
    assert "logits:float32[1,10]" in d.reason and "logits:float32[1,11]" in d.reason
    assert d.routing is not None and d.routing.shadow_version is None
    assert d.routing.candidate_weight_percent == 0.0


def test_incomparable_is_audited_with_both_schemas_and_replays() -> None:
    state = start(SPEC, 0).after
    mismatch = SchemaMismatch("a:float32[1,10]", "b:float32[1,10]")
    d = evaluate(state, SPEC, _window("v1"), _window("v2"), AgreementStats(0, 0, mismatch), 5_000)
    rec = wire.decision_to_audit(d, SPEC, command_id="", actor="policy-engine")
    assert (rec.agreement.baseline_schema, rec.agreement.candidate_schema) == (
        "a:float32[1,10]",
        "b:float32[1,10]",
    )
    assert wire.agreement_from_pb(rec.agreement) == AgreementStats(0, 0, mismatch)


def test_core_stops_the_shadow_on_the_first_incomparable_pair() -> None:
    core = PolicyCore()
    core.on_command(Command(kind=CommandKind.START, model="m", rollout_id="r1", spec=SPEC), 0)
    core.on_shadow_result("m", out("q", "v1", TEN))
    core.on_shadow_result("m", out("q", "v2", ELEVEN))
    outs = core.tick(1_000)
    audits = [o for o in outs if isinstance(o, RolloutAudit)]
    assert [a.decision.rule for a in audits] == [DecisionRule.INCOMPARABLE]
    assert "m" not in core.rollouts and core.rollouts.finished["r1"].phase is Phase.ABORTED
