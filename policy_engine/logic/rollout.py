"""The rollout controller: a pure state machine.

Every function here maps (state, spec, inputs, ``now_ms``) to a
:class:`Decision` holding the state before and after, so a recorded sequence
of inputs replays to the same decisions.

``evaluate`` in an active phase, in order:

1. ``paused`` -> HOLD. ``incomparable`` (shadowing): a shadow pair whose
   output schemas differ ends the rollout as ABORTED (candidate to 0 %, never
   promoted), both schemas in the reason. ``no_data``: a side without stats or requests (or, when
   shadowing, no shadow pairs yet) -> HOLD. Failures are neither counted nor
   reset: no data is not evidence.
2. The window is added to the step's evidence when it does not overlap what
   was counted before (see :class:`StepEvidence`).
3. ``min_samples`` (window): fewer than 5 requests on a side -> HOLD; no gate
   can judge that little.
4. Gates (see :mod:`graylane.policy_engine.logic.gates`). A severe failure -> ROLLBACK
   at once. Another failure -> GATE_FAILED and ``consecutive_failures + 1``,
   and ROLLBACK when it reaches ``failures_to_rollback`` (default 2). A failure
   counts only on a candidate window that does not overlap the window of the
   last counted failure, so one bad stretch of traffic seen through five
   overlapping 10 s windows is one failure, not five. An inconclusive gate ->
   HOLD (no advance, counter unchanged).
5. All gates pass -> the counter resets to 0; then ``min_samples`` (the step's
   evidence on both sides, and shadow pairs) and ``min_dwell`` (the step's
   ``min_dwell_s``; ``shadow_duration_s`` / ``ab_duration_s`` in those phases)
   must be met, else HOLD; then ADVANCE to the next step, or PROMOTE when the
   next step is the final 100 % (there is no baseline left to compare at
   100 %, so reaching it is the promotion), or after an A/B hold.

Steps 4 and 5 (what the gate verdicts lead to) are in
:mod:`graylane.policy_engine.logic.rollout_verdicts`.

A rollback or abort sends the candidate to 0 % in one routing intent; a
promotion gives it 100 % and makes it the stable version.

Manual commands (:func:`apply_command`, in ``rollout_commands``): PAUSE
freezes the weights (evaluations only HOLD); RESUME returns to the phase
paused from, keeping its step, timers and evidence (the candidate kept serving
at its weight meanwhile); PROMOTE and ROLLBACK act at once; ABORT ends the
rollout (candidate to 0 %). A command that the :data:`TRANSITIONS` table does
not allow raises :class:`InvalidTransition`; a terminal rollout raises
:class:`RolloutFinished` (a subclass) for both commands and evaluations, so a
caller cannot mistake a finished rollout for a holding one.
"""

from __future__ import annotations

from dataclasses import replace

from graylane.policy_engine.logic.agreement import AgreementStats, SchemaMismatch
from graylane.policy_engine.logic.facts import RolloutFacts
from graylane.policy_engine.logic.gates import (
    agreement_gate,
)
from graylane.policy_engine.logic.load_gates import judge
from graylane.policy_engine.logic.rollout_commands import apply_command
from graylane.policy_engine.logic.rollout_moves import (
    check_rollout,
    pending_state,
    routing_of,
    transition,
)
from graylane.policy_engine.logic.rollout_state import Decision, RolloutState, StepEvidence
from graylane.policy_engine.logic.rollout_verdicts import (
    Evaluation,
    on_failure,
    on_pass,
    rollback,
    summary_of,
)
from graylane.policy_engine.logic.sequential_gates import advance_sequential
from graylane.policy_engine.logic.significance import Verdict
from graylane.policy_engine.logic.unresponsive import LivenessAction, check_rollout_liveness
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.errors import InputMismatch, InvalidTransition
from graylane.rollouts.spec import GateMode, RolloutSpec, Strategy
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase

__all__ = [
    "GATE_MIN_WINDOW_REQUESTS",
    "apply_command",
    "evaluate",
    "pending_state",
    "routing_of",
    "start",
]


GATE_MIN_WINDOW_REQUESTS = 5


def start(spec: RolloutSpec, now_ms: int, *, epoch: int = 0) -> Decision:
    """Start a rollout; ``epoch`` is the last epoch of the model's routing table."""
    before = pending_state(spec, now_ms, epoch=epoch)
    if spec.strategy is Strategy.SHADOW_THEN_CANARY:
        phase, weight, share = Phase.SHADOWING, 0.0, spec.shadow_share
        what = (
            f"shadowing {share:.0%} of traffic to {spec.candidate} for {spec.shadow_duration_s:g} s"
        )
    elif spec.strategy is Strategy.AB_SPLIT:
        phase, weight, share = Phase.AB_HOLDING, spec.ab_weight_percent, 0.0
        what = f"A/B split: {spec.candidate} at {weight:g}% for {spec.ab_duration_s:g} s"
    else:
        phase, weight, share = Phase.PROGRESSING, spec.steps[0].weight_percent, 0.0
        what = f"canary step 1/{len(spec.steps)}: {spec.candidate} at {weight:g}%"
    reason = f"started {spec.strategy.value} of {spec.candidate} against {spec.baseline}: {what}"
    return transition(
        before,
        spec,
        now_ms,
        DecisionKind.STARTED,
        DecisionRule.STARTED,
        reason,
        phase=phase,
        step_index=0,
        weight=weight,
        shadow_share=share,
    )


# -- evaluation ---------------------------------------------------------------


def evaluate(
    state: RolloutState,
    spec: RolloutSpec,
    baseline: WindowStats | None,
    candidate: WindowStats | None,
    agreement: AgreementStats | None,
    now_ms: int,
    facts: RolloutFacts | None = None,
) -> Decision:
    """Judge the candidate over one window and decide the next move.

    While shadowing, ``candidate`` is the candidate's shadow-lane stats and
    ``agreement`` the shadow pairs since the phase began. ``facts`` carries
    liveness (an unresponsive candidate rolls back, an unresponsive baseline
    holds: rules ``candidate_unresponsive`` / ``baseline_unresponsive``,
    judged before ``no_data``) and the newest step's stats for the
    sequential gates.
    """
    check_rollout(state, spec)
    if state.phase is Phase.PENDING:
        raise InvalidTransition("the rollout has not started; call start() first")
    inputs = tuple(s for s in (baseline, candidate) if s is not None)
    shadowing = state.phase is Phase.SHADOWING
    ctx = Evaluation(state, spec, now_ms, inputs, agreement if shadowing else None, facts)
    if state.phase is Phase.PAUSED:
        from_phase = state.paused_from.value if state.paused_from else "?"
        return ctx.hold(state, DecisionRule.PAUSED, f"paused (from {from_phase}); weights frozen")
    live = check_rollout_liveness(
        facts.baseline_liveness if facts else None,
        facts.candidate_liveness if facts else None,
        now_ms,
        round(spec.gates.unresponsive_s * 1000),
    )
    if live.action is LivenessAction.HOLD:
        return ctx.hold(state, DecisionRule.BASELINE_UNRESPONSIVE, live.reason)
    if live.action is LivenessAction.ROLLBACK:
        return rollback(ctx, state, DecisionRule.CANDIDATE_UNRESPONSIVE, live.reason)
    if shadowing and agreement is not None and agreement.mismatch is not None:
        return _incomparable(ctx, state, agreement.mismatch)
    missing = _missing(baseline, candidate, spec)
    if shadowing and (agreement is None or agreement.pairs == 0):
        missing.append("no shadow pairs")
    if missing or baseline is None or candidate is None:
        return ctx.hold(state, DecisionRule.NO_DATA, "no data: " + ", ".join(missing))
    _check_inputs(baseline, candidate, spec)

    evidence = _accumulate(state, baseline, candidate)
    current = replace(state, evidence=evidence)
    if spec.gates.mode is GateMode.SEQUENTIAL:
        sequential = advance_sequential(state.sequential, spec.gates, baseline, candidate, facts)
        current = replace(current, sequential=sequential)
    smallest = min(baseline.requests, candidate.requests)
    if smallest < GATE_MIN_WINDOW_REQUESTS:
        return ctx.hold(
            current,
            DecisionRule.MIN_SAMPLES,
            f"window has {candidate.requests} candidate / {baseline.requests} baseline "
            f"requests; gates need at least {GATE_MIN_WINDOW_REQUESTS} on each side",
        )

    results = judge(
        baseline,
        candidate,
        evidence,
        current.sequential,
        spec.gates,
        behind=live.candidate_behind,
    )
    if shadowing and agreement is not None:
        results.append(agreement_gate(agreement, spec.gates))
    failed = [r for r in results if r.verdict is Verdict.FAIL]
    if failed:
        return on_failure(ctx, current, candidate, failed)
    unsure = [r for r in results if r.verdict is Verdict.INCONCLUSIVE]
    summary = summary_of(results)
    if unsure:
        return ctx.hold(current, unsure[0].rule, f"inconclusive, holding: {summary}")
    passed = replace(current, consecutive_failures=0, failure_window_end_ms=0)
    return on_pass(ctx, passed, summary)


def _incomparable(ctx: Evaluation, state: RolloutState, mismatch: SchemaMismatch) -> Decision:
    """Stop the shadow phase: answers of different schemas cannot agree or disagree."""
    return transition(
        state,
        ctx.spec,
        ctx.now_ms,
        DecisionKind.GATE_FAILED,
        DecisionRule.INCOMPARABLE,
        f"shadow stopped, {ctx.spec.candidate} not promoted: outputs are incomparable ({mismatch})",
        phase=Phase.ABORTED,
        step_index=state.step_index,
        weight=0.0,
        shadow_share=0.0,
        **ctx.carry(),
    )


def _missing(
    baseline: WindowStats | None, candidate: WindowStats | None, spec: RolloutSpec
) -> list[str]:
    out: list[str] = []
    for side, stats, version in (
        ("baseline", baseline, spec.baseline),
        ("candidate", candidate, spec.candidate),
    ):
        if stats is None:
            out.append(f"no {side} stats for {version}")
        elif stats.requests == 0:
            out.append(f"{side} {version} served no requests in the window")
    return out


def _check_inputs(baseline: WindowStats, candidate: WindowStats, spec: RolloutSpec) -> None:
    if (baseline.model, baseline.version) != (spec.model, spec.baseline):
        raise InputMismatch(f"baseline stats are of {baseline.model}/{baseline.version}")
    if (candidate.model, candidate.version) != (spec.model, spec.candidate):
        raise InputMismatch(f"candidate stats are of {candidate.model}/{candidate.version}")
    if (baseline.window_start_ms, baseline.window_end_ms) != (
        candidate.window_start_ms,
        candidate.window_end_ms,
    ):
        raise InputMismatch("baseline and candidate stats cover different windows")


def _accumulate(state: RolloutState, baseline: WindowStats, candidate: WindowStats) -> StepEvidence:
    ev = state.evidence
    if candidate.window_start_ms < max(state.step_started_ms, ev.through_ms):
        return ev
    return StepEvidence(
        candidate_requests=ev.candidate_requests + candidate.requests,
        candidate_errors=ev.candidate_errors + candidate.errors,
        baseline_requests=ev.baseline_requests + baseline.requests,
        baseline_errors=ev.baseline_errors + baseline.errors,
        windows=ev.windows + 1,
        through_ms=candidate.window_end_ms,
    )
