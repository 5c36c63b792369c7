"""The quality cap of a QoS ladder: a rung's measured cost, which rungs a step down may
land on, and the controller holding above a rung that costs too much."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graylane.artifacts.naming import Precision
from graylane.policy_engine.logic.qos import (
    QosDecision,
    QosDecisionKind,
    QosState,
    evaluate_qos,
    initial_qos_state,
    qos_during_rollout,
)
from graylane.policy_engine.logic.quality_cap import (
    RungAdmission,
    capped_floor,
    ladder_verdicts,
    quality_drop,
    rung_verdict,
)
from graylane.registry.records import RegistryError, RungQuality
from graylane.rollouts.errors import InvalidPolicy
from graylane.rollouts.pb import qos_policy_from_pb, qos_policy_to_pb
from graylane.rollouts.qos_policy import QosPolicy, UnmeasuredRung
from tests.support.window_stats import window_stats

# SmolLM2-135M on llama.cpp, scored on graylane/evaluation/sets/smollm2-basic.jsonl:
# f16 0.619, q4_1 0.590, q4_0 0.475.
DROPS = (("q4_0", 0.619 - 0.475), ("q4_1", 0.619 - 0.590))
POLICY = QosPolicy(
    model="m",
    version="v1",
    slo_p99_ms=50.0,
    ladder=("f16", "q4_1", "q4_0", "q2_k"),
    sustain_s=1.0,
    min_dwell_s=1.0,
    rung_quality_drop=DROPS,
    max_quality_drop=0.05,
)
T0 = 1_700_000_000_000


def run(policy: QosPolicy, variant: str, p99_ms: float, seconds: int) -> list[QosDecision]:
    state = replace(initial_qos_state(policy), active_variant=variant)
    out = []
    for second in range(1, seconds + 1):
        d = evaluate_qos(state, policy, window_stats(p99_ms, variant=state.active_variant),
                         T0 + second * 1000)  # fmt: skip
        out.append(d)
        state = d.after
    return out


def test_the_cost_of_a_rung_is_the_reference_score_minus_its_own() -> None:
    assert quality_drop(0.619, 0.475) == pytest.approx(0.144)
    assert quality_drop(0.619, 0.619) == 0.0
    assert quality_drop(0.475, 0.493) == pytest.approx(-0.018)  # a rung may measure better
    record = RungQuality(
        precision=Precision.Q4_0, set_name="smollm2-basic", set_sha256="ab" * 32, items=40,
        score=0.475, ci_low=0.33, ci_high=0.62, reference_precision=Precision.F16,
        reference_score=0.619,
    )  # fmt: skip
    assert record.quality_drop == pytest.approx(0.144)


@pytest.mark.parametrize(
    "changes",
    [{"score": 1.2}, {"ci_low": 0.5}, {"ci_high": 0.4}, {"items": 0}, {"set_sha256": ""}],
)
def test_a_broken_record_is_refused(changes: dict[str, object]) -> None:
    good = dict(
        precision=Precision.Q4_0, set_name="s", set_sha256="ab" * 32, items=4, score=0.45,
        ci_low=0.4, ci_high=0.5, reference_precision=Precision.F16, reference_score=0.6,
    )  # fmt: skip
    with pytest.raises(RegistryError):
        RungQuality(**{**good, **changes})  # type: ignore[arg-type]


def test_verdicts_of_each_rung_under_a_cap() -> None:
    verdicts = {v.variant: v for v in ladder_verdicts(POLICY)}
    assert verdicts["f16"].admission is RungAdmission.UNMEASURED  # the top: always allowed
    assert verdicts["q4_1"].admission is RungAdmission.WITHIN_CAP
    assert verdicts["q4_0"].admission is RungAdmission.OVER_CAP
    assert verdicts["q2_k"].admission is RungAdmission.UNMEASURED
    assert verdicts["q4_0"].describe() == "q4_0 costs 0.144 > cap 0.050"
    assert verdicts["q4_1"].describe() == "q4_1 costs 0.029 <= cap 0.050"
    assert [v.allowed for v in ladder_verdicts(POLICY)] == [True, True, False, True]


def test_unmeasured_rungs_are_refused_only_when_the_policy_says_so() -> None:
    refusing = replace(POLICY, unmeasured_rung=UnmeasuredRung.REFUSED)
    assert rung_verdict(refusing, "q2_k").admission is RungAdmission.UNMEASURED_REFUSED
    assert rung_verdict(refusing, "f16").allowed  # the top rung, unmeasured, still allowed
    no_cap = replace(refusing, max_quality_drop=None)
    assert all(v.allowed for v in ladder_verdicts(no_cap))  # no cap: nothing refused


def test_the_first_refused_rung_is_a_floor() -> None:
    floor = capped_floor(POLICY)
    assert floor.index == 1 and floor.by_cap and floor.refused is not None
    assert floor.refused.variant == "q4_0"
    loose = replace(POLICY, max_quality_drop=0.2)
    assert capped_floor(loose).index == 3 and not capped_floor(loose).by_cap
    # the policy's own floor above the refused rung stays the floor
    floored = replace(POLICY, quality_floor="f16")
    assert capped_floor(floored).index == 0 and not capped_floor(floored).by_cap
    refusing = replace(POLICY, max_quality_drop=0.2, unmeasured_rung=UnmeasuredRung.REFUSED)
    assert capped_floor(refusing).index == 2  # q2_k is unmeasured


def test_a_breach_steps_onto_an_allowed_rung_and_holds_above_a_refused_one() -> None:
    decisions = run(POLICY, "f16", 500.0, 8)
    changes = [d for d in decisions if d.changed]
    assert [d.variant for d in changes] == ["q4_1"]
    assert changes[0].kind is QosDecisionKind.STEP_DOWN
    held = decisions[-1]
    assert (held.kind, held.rule) == (QosDecisionKind.HOLD, "quality_cap")
    assert held.variant == "q4_1" and "q4_0 costs 0.144 > cap 0.050" in held.reason


def test_without_a_cap_the_same_breach_steps_onto_the_costly_rung() -> None:
    decisions = run(replace(POLICY, max_quality_drop=None), "f16", 500.0, 8)
    assert [d.variant for d in decisions if d.changed][:2] == ["q4_1", "q4_0"]


def test_a_rung_found_over_the_cap_is_left_at_once() -> None:
    (d, *_) = run(POLICY, "q4_0", 10.0, 1)
    assert (d.kind, d.rule, d.variant) == (QosDecisionKind.SET, "quality_cap", "q4_1")


def test_a_candidate_does_not_follow_the_baseline_onto_a_rung_over_its_cap() -> None:
    base = QosState(model="m", version="v0", active_variant="q4_0")
    candidate = QosState(model="m", version="v1", active_variant="q4_1")
    d = qos_during_rollout(candidate, base, T0, POLICY)
    assert (d.rule, d.variant) == ("like_for_like_unavailable", "q4_1")


def test_the_cap_travels_on_the_wire() -> None:
    refusing = replace(POLICY, unmeasured_rung=UnmeasuredRung.REFUSED)
    assert qos_policy_from_pb(qos_policy_to_pb(refusing)) == refusing
    uncapped = replace(POLICY, max_quality_drop=None, rung_quality_drop=())
    pb = qos_policy_to_pb(uncapped)
    assert not pb.HasField("max_quality_drop")
    assert qos_policy_from_pb(pb) == uncapped
    zero = replace(POLICY, max_quality_drop=0.0)  # a cap of 0: no drop at all
    assert qos_policy_from_pb(qos_policy_to_pb(zero)).max_quality_drop == 0.0


@pytest.mark.parametrize(
    "changes",
    [
        {"max_quality_drop": -0.1},
        {"max_quality_drop": float("nan")},
        {"rung_quality_drop": (("int8", 0.1),)},
        {"rung_quality_drop": (("q4_0", 2.0),)},
    ],
)
def test_a_broken_cap_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicy):
        replace(POLICY, **changes)  # type: ignore[arg-type]


def test_the_control_plane_fills_each_ladder_rungs_measured_drop() -> None:
    from graylane.services.controlplane.logic.rung_quality import ladder_quality_drops

    measured = {"f16": 0.0, "q4_0": 0.144, "int8": 0.2}  # int8 is not on this ladder
    given = {"q4_0": 0.01, "q2_k": 0.126}  # a hand-written figure stays where none is measured
    drops = ladder_quality_drops(["f16", "q4_1", "q4_0", "q2_k"], measured, given)
    assert drops == {"f16": 0.0, "q4_0": 0.144, "q2_k": 0.126}


def test_the_builder_refuses_a_rung_by_its_drop_or_its_failed_calls() -> None:
    from graylane.builder.rung_quality import rung_refusal
    from graylane.evaluation.summary import Summary

    def summary(target: str, mean: float, errors: int = 0) -> Summary:
        return Summary(target, 40, mean, mean - 0.1, mean + 0.1, int(mean * 40), errors)

    reference = summary("f16", 0.619)
    assert rung_refusal(reference, summary("q4_1", 0.590), 0.05, "s") is None
    refused = rung_refusal(reference, summary("q4_0", 0.475), 0.05, "s")
    assert refused == "quality drop 0.144 > 0.05 on s (0.475 vs the reference f16's 0.619)"
    failed = rung_refusal(reference, summary("q2_k", 0.6, errors=3), 0.05, "s")
    assert failed is not None and "3 of 40 calls failed" in failed
    unjudged = rung_refusal(summary("f16", 0.6, errors=1), summary("q4_1", 0.6), 0.05, "s")
    assert unjudged is not None and "no score of the reference" in unjudged
