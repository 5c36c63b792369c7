"""The A/B outcome scenarios of ``graylane bench decisions``: what each row counts."""

from __future__ import annotations

from graylane.app.bench.decisions import DecisionsConfig, _outcome_jobs, outcome_table
from graylane.app.bench.decisions_outcomes import (
    OutcomeScenario,
    outcome_row,
    simulate_outcomes,
)
from graylane.policy_engine.logic.outcomes import OutcomeVerdict


def test_a_5_point_drop_at_50_rated_per_s_is_found_well_within_the_horizon() -> None:
    runs = [simulate_outcomes(OutcomeScenario.OUTCOME_MINUS_5PP, 50.0, seed) for seed in range(5)]
    assert all(r.verdict is OutcomeVerdict.CANDIDATE_WORSE for r in runs)
    row = outcome_row(OutcomeScenario.OUTCOME_MINUS_5PP, runs)
    assert (row["runs"], row["baseline_won"], row["candidate_won"]) == (5, 5, 0)
    p95 = row["decide_s_p95"]
    assert isinstance(p95, float) and p95 < 1800.0
    assert "false_winner_rate" not in row


def test_equal_rates_end_at_the_horizon_and_report_false_winners() -> None:
    runs = [
        simulate_outcomes(OutcomeScenario.OUTCOME_EQUAL, 10.0, seed, horizon_s=600.0)
        for seed in range(3)
    ]
    row = outcome_row(OutcomeScenario.OUTCOME_EQUAL, runs)
    winners = int(str(row["baseline_won"])) + int(str(row["candidate_won"]))
    assert row["false_winner_rate"] == winners / 3
    assert all(r.decided_s == 600.0 for r in runs if r.verdict is OutcomeVerdict.NO_DIFFERENCE)


def test_every_scenario_runs_at_every_rate_and_equal_runs_more() -> None:
    cfg = DecisionsConfig(runs=4, healthy_factor=5, outcome_rates=(10.0, 50.0))
    jobs = {job.name: len(job.seeds) for job in _outcome_jobs(cfg)}
    assert jobs == {
        "outcome_-2pp@10": 4,
        "outcome_-2pp@50": 4,
        "outcome_-5pp@10": 4,
        "outcome_-5pp@50": 4,
        "outcome_equal@10": 20,
        "outcome_equal@50": 20,
    }
    row = outcome_row(OutcomeScenario.OUTCOME_MINUS_2PP, [])
    assert "outcome_-2pp" in outcome_table({"outcome_-2pp@10": row})
