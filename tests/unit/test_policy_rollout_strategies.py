"""Rollout controller strategies: shadow (agreement gated) and A/B split."""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.rollout import (
    routing_of,
)
from graylane.rollouts.spec import Strategy
from graylane.rollouts.vocabulary import DecisionKind, ManualCommand, Phase
from tests.support.rollout_run import SPEC, Run

# -- strategies -----------------------------------------------------------------------


SHADOW = replace(
    SPEC, strategy=Strategy.SHADOW_THEN_CANARY, shadow_share=0.1, shadow_duration_s=30.0
)


def test_shadow_needs_pairs_then_gates_agreement_and_moves_to_canary() -> None:
    run = Run(SHADOW)
    d = run.window()
    assert (d.kind, d.rule) == (DecisionKind.HOLD, "no_data") and "shadow pairs" in d.reason
    d = run.window(agreement=AgreementStats(500, 499))
    assert (d.kind, d.rule) == (DecisionKind.HOLD, "min_dwell")
    assert d.agreement == AgreementStats(500, 499)
    d = run.window(agreement=AgreementStats(700, 699))  # 30 s of shadowing
    assert (d.kind, d.rule) == (DecisionKind.ADVANCE, "all_gates_passed")
    assert d.after.phase is Phase.PROGRESSING and d.after.step_index == 0
    assert d.routing is not None
    assert (d.routing.candidate_weight_percent, d.routing.shadow_version) == (1.0, None)
    assert d.routing.shadow_share == 0.0


def test_shadow_disagreement_fails_and_rolls_back() -> None:
    run = Run(SHADOW)
    d = run.window(agreement=AgreementStats(200, 180))
    assert (d.kind, d.rule) == (DecisionKind.GATE_FAILED, "output_agreement")
    d = run.window(agreement=AgreementStats(400, 360))
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "output_agreement")
    assert d.routing is not None and d.routing.shadow_version is None


def test_shadow_inconclusive_agreement_holds() -> None:
    run = Run(SHADOW)
    d = run.window(agreement=AgreementStats(50, 47))
    assert (d.kind, d.rule) == (DecisionKind.HOLD, "output_agreement")


def test_shadow_pairs_are_a_sample_minimum() -> None:
    spec = replace(SHADOW, shadow_duration_s=1.0)
    run = Run(spec)
    d = run.window(agreement=AgreementStats(20, 20))
    assert d.rule == "min_samples" and "shadow pairs 20/100" in d.reason


def test_shadow_pause_resume_keeps_shadowing() -> None:
    run = Run(SHADOW)
    run.command(ManualCommand.PAUSE)
    d = run.command(ManualCommand.RESUME)
    assert d.after.phase is Phase.SHADOWING
    assert routing_of(SHADOW, d.after).shadow_version == "v2"


AB = replace(SPEC, strategy=Strategy.AB_SPLIT, ab_weight_percent=50.0, ab_duration_s=30.0)


def test_ab_holds_for_its_duration_then_promotes() -> None:
    run = Run(AB)
    kinds = [run.window(cand_n=1000).kind for _ in range(3)]
    assert kinds == [DecisionKind.HOLD, DecisionKind.HOLD, DecisionKind.PROMOTE]
    assert run.decisions[1].rule == "min_dwell"
    assert run.state.phase is Phase.PROMOTED


def test_ab_regression_rolls_back() -> None:
    run = Run(AB)
    run.window(cand_n=1000, p99=40.0)
    d = run.window(cand_n=1000, p99=40.0)
    assert d.kind is DecisionKind.ROLLBACK and d.after.phase is Phase.ROLLED_BACK
