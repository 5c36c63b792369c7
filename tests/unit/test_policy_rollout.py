"""Rollout controller: every transition, hold rule, manual command and strategy."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.rollout import (
    apply_command,
    evaluate,
    pending_state,
    routing_of,
    start,
)
from graylane.policy_engine.logic.rollout_state import (
    TRANSITIONS,
    Decision,
    RolloutState,
    check_transition,
)
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.errors import (
    InputMismatch,
    InvalidSpec,
    InvalidTransition,
    RolloutFinished,
)
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step, Strategy
from graylane.rollouts.vocabulary import DecisionKind, ManualCommand, Phase

STEPS = (
    Step(1.0, 100, 30.0),
    Step(5.0, 100, 30.0),
    Step(25.0, 100, 30.0),
    Step(50.0, 100, 30.0),
    Step(100.0, 0, 0.0),
)
# The fixed-horizon gates' rules (error_rate, p99_latency); sequential ones: own tests.
SPEC = RolloutSpec(
    rollout_id="r1",
    model="m",
    baseline="v1",
    candidate="v2",
    steps=STEPS,
    gates=Gates(mode=GateMode.FIXED),
)
WINDOW = 10_000


def ws(
    version: str,
    start_ms: int,
    requests: int,
    errors: int = 0,
    *,
    p99: float = 20.0,
    p95: float | None = None,
    p50: float | None = None,
    end_ms: int | None = None,
) -> WindowStats:
    return WindowStats(
        model="m",
        version=version,
        variant="fp32",
        window_start_ms=start_ms,
        window_end_ms=start_ms + WINDOW if end_ms is None else end_ms,
        requests=requests,
        errors=errors,
        p50_ms=p50 if p50 is not None else p99 / 2,
        p95_ms=p95 if p95 is not None else p99 * 0.8,
        p99_ms=p99,
        mean_ms=p99 / 2,
        throughput_rps=requests / 10,
    )


def window_pair(
    start_ms: int, base_n: int = 1000, cand_n: int = 200, **cand: float
) -> tuple[WindowStats, WindowStats]:
    errors = int(cand.pop("errors", 0))
    base_errors = int(cand.pop("base_errors", 0))
    candidate = ws(
        "v2",
        start_ms,
        cand_n,
        errors,
        p99=cand.get("p99", 20.0),
        p95=cand.get("p95"),
        p50=cand.get("p50"),
    )
    return ws("v1", start_ms, base_n, base_errors), candidate


class Run:
    """Drives a rollout through disjoint windows, one evaluation per window."""

    def __init__(self, spec: RolloutSpec = SPEC, t0: int = 1_000_000) -> None:
        self.spec = spec
        self.decisions: list[Decision] = [start(spec, t0)]
        self.t = t0

    @property
    def state(self) -> RolloutState:
        return self.decisions[-1].after

    def window(
        self,
        base_n: int = 1000,
        cand_n: int = 200,
        agreement: AgreementStats | None = None,
        **cand: float,
    ) -> Decision:
        baseline, candidate = window_pair(self.t, base_n, cand_n, **cand)
        self.t += WINDOW
        d = evaluate(self.state, self.spec, baseline, candidate, agreement, self.t)
        self.decisions.append(d)
        return d

    def command(self, command: ManualCommand) -> Decision:
        d = apply_command(self.state, self.spec, command, self.t, note="ops")
        self.decisions.append(d)
        return d


# -- spec validation ------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"steps": ()},
        {"steps": (Step(5.0), Step(5.0), Step(100.0))},
        {"steps": (Step(10.0), Step(5.0), Step(100.0))},
        {"steps": (Step(0.0), Step(100.0))},
        {"steps": (Step(50.0), Step(150.0))},
        {"steps": (Step(5.0), Step(50.0))},
        {"steps": (Step(100.0),)},
        {"steps": (Step(5.0, -1), Step(100.0))},
        {"candidate": "v1"},
        {"rollout_id": ""},
        {"gates": Gates(max_p99_ratio=0.5)},
        {"gates": Gates(alpha=0.0)},
        {"gates": Gates(max_error_rate_delta=1.5)},
        {"gates": Gates(min_output_agreement=1.2)},
        {"failures_to_rollback": 0},
        {"strategy": Strategy.SHADOW_THEN_CANARY, "shadow_share": 0.0},
        {"strategy": Strategy.SHADOW_THEN_CANARY, "shadow_duration_s": 0.0},
        {"strategy": Strategy.AB_SPLIT, "ab_weight_percent": 100.0},
        {"strategy": Strategy.AB_SPLIT, "ab_duration_s": -1.0},
    ],
)
def test_invalid_specs_are_refused(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "rollout_id": "r",
        "model": "m",
        "baseline": "v1",
        "candidate": "v2",
        **changes,
    }
    with pytest.raises(InvalidSpec):
        RolloutSpec(**fields)  # type: ignore[arg-type]


def test_default_spec_is_valid() -> None:
    spec = RolloutSpec(rollout_id="r", model="m", baseline="v1", candidate="v2")
    assert [s.weight_percent for s in spec.steps] == [1.0, 5.0, 25.0, 50.0, 100.0]
    assert spec.gates == Gates(1.5, 0.02, 0.01, 0.98)
    assert spec.failures_to_rollback == 2


# -- the transition table ---------------------------------------------------------


def test_transition_table_is_enforced_for_every_pair() -> None:
    for source, target in product(Phase, Phase):
        if source in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.ABORTED):
            with pytest.raises(RolloutFinished):
                check_transition(source, target)
        elif target in TRANSITIONS[source]:
            check_transition(source, target)
        else:
            with pytest.raises(InvalidTransition):
                check_transition(source, target)


def test_terminal_phases_have_no_way_out() -> None:
    for phase in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.ABORTED):
        assert TRANSITIONS[phase] == frozenset()
    assert Phase.PAUSED not in TRANSITIONS[Phase.PENDING]


# -- start ------------------------------------------------------------------------


def test_start_canary() -> None:
    d = start(SPEC, 5_000, epoch=41)
    assert d.kind is DecisionKind.STARTED and d.rule == "started"
    assert d.before.phase is Phase.PENDING
    assert d.after.phase is Phase.PROGRESSING and d.after.step_index == 0
    assert d.routing is not None
    assert d.routing.candidate_weight_percent == 1.0
    assert d.routing.stable_version == "v1" and d.routing.shadow_version is None
    assert d.routing.epoch == d.after.epoch == 42


def test_start_shadow_then_canary_and_ab() -> None:
    shadow = replace(SPEC, strategy=Strategy.SHADOW_THEN_CANARY, shadow_share=0.2)
    d = start(shadow, 0)
    assert d.after.phase is Phase.SHADOWING
    assert d.routing is not None
    assert (d.routing.candidate_weight_percent, d.routing.shadow_version) == (0.0, "v2")
    assert d.routing.shadow_share == 0.2
    ab = replace(SPEC, strategy=Strategy.AB_SPLIT, ab_weight_percent=30.0)
    d = start(ab, 0)
    assert d.after.phase is Phase.AB_HOLDING
    assert d.routing is not None and d.routing.candidate_weight_percent == 30.0


# -- holds ------------------------------------------------------------------------


def test_no_data_holds_and_leaves_the_failure_count() -> None:
    run = Run()
    run.window(p99=35.0)  # one counted failure
    assert run.state.consecutive_failures == 1
    s = run.state
    for baseline, candidate in [
        (None, ws("v2", run.t, 100)),
        (ws("v1", run.t, 100), None),
        (ws("v1", run.t, 100), ws("v2", run.t, 0)),
        (None, None),
    ]:
        d = evaluate(s, SPEC, baseline, candidate, None, run.t + 1)
        assert (d.kind, d.rule) == (DecisionKind.HOLD, "no_data")
        assert d.after.consecutive_failures == 1
        assert d.after.step_index == 0 and d.routing is None


def test_too_few_samples_in_the_window_hold() -> None:
    run = Run()
    d = run.window(cand_n=4)
    assert (d.kind, d.rule) == (DecisionKind.HOLD, "min_samples")
    assert "at least 5" in d.reason


def test_too_few_samples_in_the_step_hold_even_when_dwell_is_met() -> None:
    spec = replace(SPEC, steps=(Step(1.0, 500, 0.0), Step(100.0)))
    run = Run(spec)
    for _ in range(2):
        d = run.window(cand_n=200)
        assert (d.kind, d.rule) == (DecisionKind.HOLD, "min_samples")
        assert "candidate" in d.reason
    d = run.window(cand_n=200)  # 600 >= 500
    assert d.kind is DecisionKind.PROMOTE


def test_baseline_samples_count_too() -> None:
    spec = replace(SPEC, steps=(Step(50.0, 500, 0.0), Step(100.0)))
    run = Run(spec)
    d = run.window(base_n=100, cand_n=1000)
    assert d.rule == "min_samples" and "baseline 100/500" in d.reason


def test_min_dwell_holds() -> None:
    spec = replace(SPEC, steps=(Step(1.0, 10, 35.0), Step(100.0)))
    run = Run(spec)
    for _ in range(3):
        d = run.window()
        assert (d.kind, d.rule) == (DecisionKind.HOLD, "min_dwell")
    d = run.window()  # 40 s since the step began
    assert d.kind is DecisionKind.PROMOTE


def test_a_window_reaching_back_before_the_step_is_not_evidence() -> None:
    run = Run()
    begun = run.state.step_started_ms
    baseline, candidate = window_pair(begun - 4_000)
    d = evaluate(run.state, SPEC, baseline, candidate, None, begun + 6_000)
    assert d.after.evidence.windows == 0
    assert d.rule == "min_samples"


# -- advance and promote ------------------------------------------------------------


def test_advances_through_every_step_to_promotion() -> None:
    run = Run()
    weights = [run.state.candidate_weight_percent]
    for _ in range(60):
        d = run.window()
        if d.routing is not None:
            weights.append(d.routing.candidate_weight_percent)
        if d.after.terminal:
            break
    assert weights == [1.0, 5.0, 25.0, 50.0, 100.0]
    final = run.decisions[-1]
    assert (final.kind, final.rule) == (DecisionKind.PROMOTE, "all_gates_passed")
    assert final.after.phase is Phase.PROMOTED
    assert final.routing is not None and final.routing.stable_version == "v2"
    advances = [d for d in run.decisions if d.kind is DecisionKind.ADVANCE]
    assert [d.after.step_index for d in advances] == [1, 2, 3]
    # Every routing change carries the next epoch.
    epochs = [d.routing.epoch for d in run.decisions if d.routing is not None]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)
    # Each step held until its dwell (30 s = 3 windows) was met.
    holds = [d for d in run.decisions if d.kind is DecisionKind.HOLD]
    assert {d.rule for d in holds} == {"min_dwell"}


def test_advance_resets_the_step_evidence_and_timers() -> None:
    run = Run(replace(SPEC, steps=(Step(1.0, 10, 0.0), Step(5.0, 10, 0.0), Step(100.0))))
    d = run.window()
    assert d.kind is DecisionKind.ADVANCE
    assert d.after.evidence.windows == 0 and d.after.step_started_ms == run.t


# -- gate failures ------------------------------------------------------------------


def test_p99_gate_counts_failures_and_rolls_back_at_n() -> None:
    run = Run()
    d = run.window(p99=35.0)  # 1.75x of 20 ms
    assert (d.kind, d.rule) == (DecisionKind.GATE_FAILED, "p99_ratio")
    assert d.after.consecutive_failures == 1 and d.routing is None
    assert "1.75x" in d.reason
    d = run.window(p99=35.0)
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "p99_ratio")
    assert d.after.phase is Phase.ROLLED_BACK
    assert d.routing is not None and d.routing.candidate_weight_percent == 0.0
    assert d.routing.stable_version == "v1"


def test_a_pass_resets_the_failure_count() -> None:
    run = Run()
    run.window(p99=35.0)
    d = run.window()
    assert d.kind is DecisionKind.HOLD and d.after.consecutive_failures == 0
    d = run.window(p99=35.0)
    assert d.kind is DecisionKind.GATE_FAILED and d.after.consecutive_failures == 1


def test_overlapping_windows_count_one_failure() -> None:
    run = Run()
    base = run.state
    t = run.t
    first = evaluate(base, SPEC, *window_pair(t, p99=35.0), None, t + WINDOW)
    assert first.after.consecutive_failures == 1
    # The window slid by 2 s only: same bad stretch, not a second failure.
    again = evaluate(first.after, SPEC, *window_pair(t + 2_000, p99=35.0), None, t + WINDOW + 2_000)
    assert again.kind is DecisionKind.GATE_FAILED
    assert again.after.consecutive_failures == 1 and "not counted" in again.reason
    disjoint = evaluate(again.after, SPEC, *window_pair(t + WINDOW, p99=35.0), None, t + 2 * WINDOW)
    assert disjoint.kind is DecisionKind.ROLLBACK


def test_baseline_floor_keeps_tiny_latencies_from_failing() -> None:
    run = Run()
    baseline = ws("v1", run.t, 1000, p99=0.2)
    candidate = ws("v2", run.t, 200, p99=0.9)  # 4.5x of 0.2 ms, but under the 1 ms floor
    d = evaluate(run.state, SPEC, baseline, candidate, None, run.t + WINDOW)
    assert d.kind is DecisionKind.HOLD and "p99_ratio pass" in d.reason


def test_small_windows_compare_p95_not_the_maximum() -> None:
    run = Run()
    # 50 requests: p99 is the slowest request (one outlier); p95 is fine.
    d = run.window(cand_n=50, p99=200.0, p95=16.0)
    assert d.kind is DecisionKind.HOLD
    assert "candidate p95" in d.reason and "p99 needs 100" in d.reason


def test_severe_p99_rolls_back_at_once() -> None:
    run = Run()
    d = run.window(p99=80.0, p95=64.0)  # 4x p99 and p95 over the limit too
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "p99_severe")
    assert d.after.phase is Phase.ROLLED_BACK


def test_one_outlier_is_not_severe() -> None:
    run = Run()
    d = run.window(p99=80.0, p95=16.0)  # tail only: p95 is within limits
    assert (d.kind, d.rule) == (DecisionKind.GATE_FAILED, "p99_ratio")


def test_error_gate_fails_on_a_significant_regression() -> None:
    run = Run()
    d = run.window(cand_n=200, errors=10, base_errors=10)  # 5 % vs 1 %, p ~ 5e-4
    assert (d.kind, d.rule) == (DecisionKind.GATE_FAILED, "error_rate")
    assert "+4.00pp" in d.reason


def test_decisive_error_evidence_rolls_back_at_once() -> None:
    # 8 % vs 0 %: p ~ 1e-20. A second window would only serve more errors.
    run = Run()
    d = run.window(cand_n=500, errors=40)
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "error_rate_decisive")
    assert "+8.00pp" in d.reason
    assert d.after.candidate_weight_percent == 0.0


def test_error_gate_severe_rolls_back_at_once() -> None:
    run = Run()
    d = run.window(cand_n=200, errors=100)
    assert (d.kind, d.rule) == (DecisionKind.ROLLBACK, "error_rate_severe")


def test_inconclusive_error_evidence_holds_without_counting() -> None:
    run = Run(replace(SPEC, steps=(Step(1.0, 10, 0.0), Step(100.0))))
    # 8 % of 25 vs 1 %: over the tolerance, but two errors are no evidence yet.
    d = run.window(cand_n=25, errors=2, base_errors=10)
    assert (d.kind, d.rule) == (DecisionKind.HOLD, "error_rate")
    assert "inconclusive" in d.reason and d.after.consecutive_failures == 0


# -- manual commands ------------------------------------------------------------------


def test_pause_freezes_and_resume_returns() -> None:
    run = Run()
    run.window()
    d = run.command(ManualCommand.PAUSE)
    assert (d.kind, d.rule) == (DecisionKind.MANUAL, "manual_pause")
    assert d.after.phase is Phase.PAUSED and d.after.paused_from is Phase.PROGRESSING
    assert d.routing is None and "(ops)" in d.reason
    for _ in range(5):
        d = run.window(p99=500.0, errors=150)  # even a disaster only holds while paused
        assert (d.kind, d.rule) == (DecisionKind.HOLD, "paused")
    with pytest.raises(InvalidTransition):
        run.command(ManualCommand.PAUSE)
    d = run.command(ManualCommand.RESUME)
    assert d.after.phase is Phase.PROGRESSING and d.after.paused_from is None
    assert d.after.step_index == 0 and d.routing is None
    with pytest.raises(InvalidTransition):
        run.command(ManualCommand.RESUME)


def test_manual_promote_and_rollback() -> None:
    run = Run()
    d = run.command(ManualCommand.PROMOTE)
    assert d.after.phase is Phase.PROMOTED
    assert d.routing is not None and d.routing.candidate_weight_percent == 100.0
    assert d.routing.stable_version == "v2"
    run = Run()
    run.command(ManualCommand.PAUSE)
    d = run.command(ManualCommand.ROLLBACK)
    assert d.after.phase is Phase.ROLLED_BACK
    assert d.routing is not None and d.routing.candidate_weight_percent == 0.0


def test_abort_from_pending_and_from_a_running_rollout() -> None:
    pending = pending_state(SPEC, 0)
    d = apply_command(pending, SPEC, ManualCommand.ABORT, 10)
    assert d.after.phase is Phase.ABORTED and d.routing is None
    with pytest.raises(InvalidTransition):
        apply_command(pending, SPEC, ManualCommand.PROMOTE, 10)
    with pytest.raises(InvalidTransition):
        evaluate(pending, SPEC, None, None, None, 10)
    run = Run()
    d = run.command(ManualCommand.ABORT)
    assert d.after.phase is Phase.ABORTED
    assert d.routing is not None and d.routing.candidate_weight_percent == 0.0


@pytest.mark.parametrize(
    "ending", [ManualCommand.PROMOTE, ManualCommand.ROLLBACK, ManualCommand.ABORT]
)
def test_terminal_rollouts_refuse_everything(ending: ManualCommand) -> None:
    run = Run()
    run.command(ending)
    for command in ManualCommand:
        with pytest.raises(RolloutFinished):
            run.command(command)
    with pytest.raises(RolloutFinished):
        run.window()


def test_inputs_must_match_the_spec_and_one_window() -> None:
    run = Run()
    b, c = window_pair(run.t)
    with pytest.raises(InputMismatch):
        evaluate(run.state, SPEC, c, b, None, run.t)
    with pytest.raises(InputMismatch):
        evaluate(run.state, SPEC, b, replace(c, window_start_ms=c.window_start_ms + 2_000), None, 0)
    with pytest.raises(InputMismatch):
        evaluate(run.state, replace(SPEC, rollout_id="other"), b, c, None, run.t)


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


def test_decisions_are_deterministic_values() -> None:
    a, b = Run(), Run()
    for run in (a, b):
        run.window(p99=35.0)
        run.window(cand_n=25, errors=2, base_errors=10)
        run.command(ManualCommand.PAUSE)
    assert a.decisions == b.decisions
