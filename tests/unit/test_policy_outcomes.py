"""The A/B test on user outcomes: what its statistics promise, over many seeds, and what
an A/B rollout does with its verdicts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from graylane.policy_engine.logic.outcomes import (
    MIN_RATED_PER_ARM,
    ArmTally,
    OutcomeTally,
    OutcomeVerdict,
    judge_outcomes,
)
from graylane.policy_engine.logic.rollout import RolloutSignals, evaluate, start
from graylane.rollouts.spec import Strategy
from graylane.rollouts.vocabulary import DecisionKind, Phase
from tests.support.rollout_run import SPEC, WINDOW, window_pair

ALPHA = 0.05
LOOK_EVERY = 25
"""Ratings (both arms together) between two looks: the controller looks often."""


def _arm(ups: int, rated: int) -> ArmTally:
    return ArmTally(rated, float(ups), float(ups))


def first_verdict(
    seed: int, base_rate: float, cand_rate: float, horizon: int
) -> tuple[OutcomeVerdict, int]:
    """Thumbs from a 50/50 split, judged every LOOK_EVERY ratings: the first verdict and
    the ratings it took (the horizon's no-difference if none came before)."""
    rng = np.random.default_rng(seed)
    arm = rng.random(horizon) < 0.5  # True: the candidate served
    up = rng.random(horizon) < np.where(arm, cand_rate, base_rate)
    cand_rated = np.cumsum(arm)
    cand_up = np.cumsum(arm & up)
    base_up = np.cumsum(~arm & up)
    for i in range(LOOK_EVERY - 1, horizon, LOOK_EVERY):
        n = i + 1
        tally = OutcomeTally(
            baseline=_arm(int(base_up[i]), n - int(cand_rated[i])),
            candidate=_arm(int(cand_up[i]), int(cand_rated[i])),
        )
        test = judge_outcomes(tally, ALPHA, at_horizon=n == horizon)
        if test.decided:
            return test.verdict, n
    raise AssertionError("the horizon always decides")


def test_equal_arms_name_a_false_winner_in_at_most_alpha_of_runs() -> None:
    """No difference, 400 seeds, a look every 25 ratings up to 5,000: the share of runs
    that name a winner stays under alpha (5 %) although the test is looked at 200 times."""
    runs = 400
    winners = 0
    for seed in range(runs):
        verdict, _ = first_verdict(seed, 0.7, 0.7, horizon=5_000)
        winners += verdict is not OutcomeVerdict.NO_DIFFERENCE
    assert winners / runs <= ALPHA, f"{winners} false winners in {runs} runs"


def test_a_candidate_5_points_worse_loses_and_never_wins() -> None:
    """70 % vs 65 % thumbs up: found worse before 20,000 ratings in at least 95 % of 60
    seeds, never named the better one."""
    verdicts = [first_verdict(1000 + s, 0.70, 0.65, horizon=20_000) for s in range(60)]
    worse = [n for v, n in verdicts if v is OutcomeVerdict.CANDIDATE_WORSE]
    assert not any(v is OutcomeVerdict.CANDIDATE_BETTER for v, _ in verdicts)
    assert len(worse) >= 57, verdicts


def test_a_candidate_5_points_better_wins() -> None:
    verdicts = [first_verdict(2000 + s, 0.65, 0.70, horizon=20_000)[0] for s in range(20)]
    assert verdicts.count(OutcomeVerdict.CANDIDATE_BETTER) >= 19
    assert OutcomeVerdict.CANDIDATE_WORSE not in verdicts


def test_no_verdict_before_each_arm_has_its_minimum() -> None:
    few = MIN_RATED_PER_ARM - 1
    tally = OutcomeTally(baseline=_arm(few, few), candidate=_arm(0, few))
    test = judge_outcomes(tally, ALPHA)
    assert test.verdict is OutcomeVerdict.UNDECIDED
    assert test.log_likelihood_ratio > test.threshold  # the evidence is there; the rule waits
    enough = OutcomeTally(baseline=_arm(50, 50), candidate=_arm(0, 50))
    assert judge_outcomes(enough, ALPHA).verdict is OutcomeVerdict.CANDIDATE_WORSE


def test_the_confidence_sequence_excludes_zero_exactly_when_the_test_rejects() -> None:
    for ups in range(300, 400, 7):
        tally = OutcomeTally(baseline=_arm(350, 500), candidate=_arm(ups, 500))
        test = judge_outcomes(tally, ALPHA)
        assert (test.low > 0 or test.high < 0) == test.decided, test
        assert test.low <= test.difference <= test.high


def test_scores_are_tested_like_thumbs_and_bad_values_are_refused() -> None:
    arm = ArmTally().add(0.25).add(0.75)
    assert (arm.rated, arm.mean) == (2, 0.5)
    assert arm.variance == pytest.approx(0.0625)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            ArmTally().add(bad)
    with pytest.raises(ValueError):
        judge_outcomes(OutcomeTally(), 0.0)


# -- what an A/B rollout does with the verdicts ---------------------------------------

AB = replace(SPEC, strategy=Strategy.AB_SPLIT, ab_weight_percent=50.0, ab_duration_s=60.0)
T0 = 1_000_000


def _ab_window(i: int, tally: OutcomeTally, p99: float = 20.0):  # type: ignore[no-untyped-def]
    state = start(AB, T0).after
    baseline, candidate = window_pair(T0 + i * WINDOW, 1000, 1000, p99=p99)
    return evaluate(
        state,
        AB,
        baseline,
        candidate,
        None,
        T0 + (i + 1) * WINDOW,
        RolloutSignals(outcomes=tally),
    )


def test_a_worse_candidate_is_rolled_back_with_the_evidence() -> None:
    tally = OutcomeTally(baseline=_arm(700, 1000), candidate=_arm(600, 1000))
    d = _ab_window(0, tally)
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "outcome_worse")
    assert d.after.phase is Phase.ROLLED_BACK and d.routing is not None
    assert d.outcome_test is not None
    assert d.outcome_test.verdict is OutcomeVerdict.CANDIDATE_WORSE
    assert "baseline wins" in d.reason


def test_a_better_candidate_is_promoted_before_the_horizon_while_guardrails_pass() -> None:
    tally = OutcomeTally(baseline=_arm(600, 1000), candidate=_arm(700, 1000))
    d = _ab_window(0, tally)
    assert (d.kind, d.rule) == (DecisionKind.PROMOTE, "outcome_better")
    assert d.after.phase is Phase.PROMOTED
    # A latency regression is a guardrail: no promotion however it is rated.
    slow = _ab_window(0, tally, p99=40.0)
    assert slow.kind is DecisionKind.GATE_FAILED


def test_no_difference_holds_until_the_horizon_then_ends_as_no_difference() -> None:
    tally = OutcomeTally(baseline=_arm(700, 1000), candidate=_arm(698, 1000))
    held = _ab_window(0, tally)
    assert (held.kind, held.rule) == (DecisionKind.HOLD, "min_dwell")
    assert held.outcome_test is not None and not held.outcome_test.decided
    ended = _ab_window(5, tally)  # 60 s after the start
    assert (ended.kind, ended.rule) == (DecisionKind.PROMOTE, "outcome_no_difference")
    assert ended.outcome_test is not None
    assert ended.outcome_test.verdict is OutcomeVerdict.NO_DIFFERENCE
