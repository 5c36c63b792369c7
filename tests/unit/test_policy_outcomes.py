"""The A/B test on user outcomes: what its statistics promise, over many seeds, and what
an A/B rollout does with its verdicts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from graylane.policy_engine.audit_replay import verify
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.outcomes import (
    MIN_RATED_PER_ARM,
    ArmTally,
    OutcomeLedger,
    OutcomeTally,
    OutcomeVerdict,
    RatedOutcome,
    judge_outcomes,
)
from graylane.policy_engine.logic.rollout import RolloutSignals, evaluate, start
from graylane.policy_engine.messages import RolloutPublication
from graylane.policy_engine.wire import records_of, rollout_state_from_pb, rollout_state_to_pb
from graylane.rollouts.spec import RolloutSpec, Strategy
from graylane.rollouts.vocabulary import DecisionKind, Phase
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2
from tests.support.rollout_run import SPEC, WINDOW, window_pair
from tests.unit.test_policy_core import MODEL, audits, batch, start_cmd

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


# -- the join, in the engine's core, and the audit ------------------------------------


def _rated(request_id: str, version: str, value: float) -> RatedOutcome:
    return RatedOutcome(
        request_id=request_id, model="gpt", version=version, tenant="t", value=value
    )


def test_the_ledger_joins_by_version_counts_the_first_rating_and_passes_over_the_rest() -> None:
    ledger = OutcomeLedger("v1", "v2", remember=3)
    assert ledger.add(_rated("a", "v1", 1.0)) and ledger.add(_rated("b", "v2", 0.0))
    assert not ledger.add(_rated("a", "v1", 0.0))  # rated twice: the first one counts
    assert not ledger.add(_rated("c", "v0", 1.0))  # neither arm
    with pytest.raises(ValueError):
        ledger.add(_rated("d", "v2", 2.0))
    assert ledger.add(_rated("d", "v2", 1.0))  # the refused value left no trace
    assert not ledger.add(_rated("e", "v2", 1.0))  # past the bound of remembered ids
    t = ledger.tally
    assert (t.baseline.rated, t.baseline.mean, t.candidate.rated, t.candidate.mean) == (
        1,
        1.0,
        2,
        0.5,
    )
    assert (t.duplicates, t.unjoined) == (1, 2)


def test_the_core_rolls_back_a_candidate_users_rate_worse_and_the_audit_replays() -> None:
    spec = RolloutSpec(
        rollout_id="ab",
        model=MODEL,
        baseline="v1",
        candidate="v2",
        strategy=Strategy.AB_SPLIT,
        ab_duration_s=3600.0,
    )
    core = PolicyCore(window_ms=4000, step_ms=1000)
    core.restore([], {MODEL: 1}, {})
    out = core.on_command(start_cmd(spec), 100_000)
    rng = np.random.default_rng(7)
    i = 0
    for t in range(100_000, 400_000, 250):
        core.on_telemetry(batch("v1", t))
        core.on_telemetry(batch("v2", t))
        for _ in range(5):  # 20 rated answers a second
            version = "v2" if rng.random() < 0.5 else "v1"
            up = rng.random() < (0.60 if version == "v2" else 0.75)
            core.on_outcome(replace(_rated(f"r{i}", version, float(up)), model=MODEL))
            i += 1
        if t % 1000 == 0:
            out.extend(core.tick(t))
        if MODEL not in core.rollouts:
            break
    assert core.rollouts.finished["ab"].phase is Phase.ROLLED_BACK
    last = audits(out)[-1]
    assert last.decision.rule == "outcome_worse"
    layout = TopicLayout(prefix="p")
    recs = [
        audit_pb2.AuditRecord.FromString(r.value)
        for r in records_of(out, layout)
        if r.topic == layout.audit()
    ]
    evidence = recs[-1].outcomes
    assert evidence.verdict == "candidate_worse" and evidence.difference < 0
    assert evidence.high < 0 and evidence.candidate.rated >= MIN_RATED_PER_ARM
    assert verify(recs) == []
    # The finished rollout's ledger is gone; outcomes for it are no longer counted.
    assert core.outcomes == {} and not core.on_outcome(replace(_rated("x", "v2", 1.0), model=MODEL))


def test_a_restarted_engine_goes_on_with_the_tallies_on_record() -> None:
    spec = RolloutSpec(
        rollout_id="ab",
        model=MODEL,
        baseline="v1",
        candidate="v2",
        strategy=Strategy.AB_SPLIT,
        ab_duration_s=3600.0,
    )
    first = PolicyCore(window_ms=4000, step_ms=1000)
    first.restore([], {MODEL: 1}, {})
    out = first.on_command(start_cmd(spec), 100_000)
    for i in range(40):  # 20 rated per arm: far from a verdict
        first.on_outcome(replace(_rated(f"r{i}", "v2" if i % 2 else "v1", 1.0), model=MODEL))
    for t in range(100_000, 110_000, 250):
        first.on_telemetry(batch("v1", t))
        first.on_telemetry(batch("v2", t))
        if t % 1000 == 0:
            out.extend(first.tick(t))
    published = [o for o in out if isinstance(o, RolloutPublication)][-1].state
    assert (published.outcomes.baseline.rated, published.outcomes.candidate.rated) == (20, 20)
    # What the compacted rollouts topic holds, read back by a new engine.
    state, restored_spec = rollout_state_from_pb(rollout_state_to_pb(published, spec))
    assert state.outcomes == OutcomeTally(baseline=_arm(20, 20), candidate=_arm(20, 20))
    second = PolicyCore(window_ms=4000, step_ms=1000)
    second.restore([(state, restored_spec)], {MODEL: state.epoch}, {})
    assert second.on_outcome(replace(_rated("after", "v2", 0.0), model=MODEL))
    tally = second.outcomes["ab"].tally
    assert (tally.baseline.rated, tally.candidate.rated, tally.candidate.total) == (20, 21, 20.0)
