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
   must be met, else HOLD; then, when the next step requires an evaluation, it
   must have passed (else HOLD, :mod:`~graylane.policy_engine.logic.step_evaluation`);
   then ADVANCE to the next step, or PROMOTE when the
   next step is the final 100 % (there is no baseline left to compare at
   100 %, so reaching it is the promotion), or after an A/B hold.

In an A/B hold the outcome test on rated answers
(:mod:`~graylane.policy_engine.logic.outcomes`) decides too: found worse, the candidate
is rolled back right after the liveness checks (``outcome_worse``); found better, it is
promoted at step 5 without waiting for the horizon (``outcome_better``); the gates stay
the guardrails either way.

Steps 4 and 5 (what the gate verdicts lead to) are :func:`on_failure` and
:func:`on_pass`; :func:`judge` runs the gates of the spec's ``GateMode``.

A rollback or abort sends the candidate to 0 % in one routing plan; a
promotion gives it 100 % and makes it the stable version.

Bake period (``spec.bake_s`` > 0): the promotion moves the rollout to BAKING
instead of PROMOTED, with the baseline window just judged kept as the reference
(:mod:`~graylane.policy_engine.logic.bake` explains that choice). Each evaluation
while BAKING judges the promoted version's window against it: a gate failure
counts as in step 4 and rolls back (routing and stable back to the baseline, rule
of the failing gate, "during bake" in the reason); once ``bake_s`` has passed
without one, the rollout ends PROMOTED under rule ``baked`` (no routing change).
A manual ROLLBACK during the bake rolls back the same way, a manual PROMOTE ends
the bake at once; PAUSE and ABORT are refused. A manual PROMOTE never bakes.

Approval steps: a step with a ``pause`` whose gates, samples and dwell are met
does not advance; it pauses (rule ``approval_pause``, weights frozen, gates not
judged) until RESUME approves it, or until its duration runs out (rule
``approval_elapsed``). The next passing evaluation then advances.

Manual commands (:func:`apply_command`): PAUSE
freezes the weights (evaluations only HOLD); RESUME returns to the phase
paused from, keeping its step, timers and evidence (the candidate kept serving
at its weight meanwhile); PROMOTE and ROLLBACK act at once; ABORT ends the
rollout (candidate to 0 %). A command that the :data:`TRANSITIONS` table does
not allow raises :class:`InvalidTransition`; a terminal rollout raises
:class:`RolloutFinished` (a subclass) for both commands and evaluations, so a
caller cannot mistake a finished rollout for a holding one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TypedDict

from graylane.policy_engine.logic.agreement import AgreementStats, SchemaMismatch
from graylane.policy_engine.logic.bake import (
    BakeAction,
    bake_gates,
    bake_left_ms,
    bake_reference,
    judge_bake,
)
from graylane.policy_engine.logic.gates import (
    GateResult,
    SequentialEvidence,
    StepEvidence,
    Verdict,
    advance_sequential,
    agreement_gate,
    backlog_gate,
    error_gate,
    generation_latency_gates,
    generative,
    length_drift_gate,
    on_service_time,
    sequential_gates,
    service_latency_gate,
)
from graylane.policy_engine.logic.liveness import (
    LivenessAction,
    VersionLiveness,
    check_rollout_liveness,
)
from graylane.policy_engine.logic.metric_gates import MetricReading, metric_results, overdue
from graylane.policy_engine.logic.outcomes import (
    OutcomeTally,
    OutcomeTest,
    OutcomeVerdict,
    judge_outcomes,
)
from graylane.policy_engine.logic.step_evaluation import (
    EvaluationOutcome,
    evaluation_hold,
    target_step,
)
from graylane.policy_engine.logic.text_agreement import TextAgreementStats, text_agreement_gate
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.errors import InputMismatch, InvalidTransition, RolloutFinished
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Strategy
from graylane.rollouts.vocabulary import (
    ACTIVE_PHASES,
    TERMINAL_PHASES,
    DecisionKind,
    DecisionRule,
    ManualCommand,
    Phase,
)
from graylane.routing.table import RoutingPlan, split_plan

__all__ = [
    "GATE_MIN_WINDOW_REQUESTS",
    "TRANSITIONS",
    "Carry",
    "Decision",
    "Evaluation",
    "RolloutSignals",
    "RolloutState",
    "apply_command",
    "approve",
    "check_rollout",
    "check_transition",
    "evaluate",
    "judge",
    "on_failure",
    "on_pass",
    "pending_state",
    "rollback",
    "routing_of",
    "start",
    "summary_of",
    "transition",
]


@dataclass(frozen=True, kw_only=True)
class RolloutSignals:
    """Everything :func:`~graylane.policy_engine.logic.rollout.evaluate` may use besides windows.

    ``baseline_step`` / ``candidate_step`` are the stats of the newest step whose
    telemetry has arrived (the core reads it at
    :meth:`~graylane.policy_engine.logic.window.SlidingWindow.settled_ms`); without
    them the sequential gates consume whole windows that do not overlap.
    """

    baseline_step: WindowStats | None = None
    candidate_step: WindowStats | None = None
    baseline_liveness: VersionLiveness | None = None
    candidate_liveness: VersionLiveness | None = None
    metrics: tuple[MetricReading, ...] = ()
    """The newest reading of each of the spec's metric gates (PromQL)."""
    outcomes: OutcomeTally | None = None
    """A/B rollouts: the rated outcomes of each arm since the rollout began."""
    evaluation: EvaluationOutcome | None = None
    """The finished evaluation of the step the next advance moves onto (if it needs one)."""
    text_agreement: TextAgreementStats | None = None
    """While shadowing: the sampled pairs compared by text since the phase began."""


_ENDINGS = TERMINAL_PHASES

TRANSITIONS: Mapping[Phase, frozenset[Phase]] = MappingProxyType(
    {
        Phase.PENDING: frozenset(
            {Phase.SHADOWING, Phase.PROGRESSING, Phase.AB_HOLDING, Phase.ABORTED}
        ),
        Phase.SHADOWING: frozenset({Phase.PROGRESSING, Phase.PAUSED}) | _ENDINGS,
        # PROGRESSING -> PROGRESSING is the move to the next step.
        Phase.PROGRESSING: frozenset({Phase.PROGRESSING, Phase.PAUSED, Phase.BAKING}) | _ENDINGS,
        Phase.AB_HOLDING: frozenset({Phase.PAUSED, Phase.BAKING}) | _ENDINGS,
        Phase.PAUSED: ACTIVE_PHASES | _ENDINGS,
        # Baking ends baked (PROMOTED) or rolled back; it cannot be paused or aborted.
        Phase.BAKING: frozenset({Phase.PROMOTED, Phase.ROLLED_BACK}),
        Phase.PROMOTED: frozenset(),
        Phase.ROLLED_BACK: frozenset(),
        Phase.ABORTED: frozenset(),
    }
)
"""Every allowed phase change; anything else raises :class:`InvalidTransition`."""


def check_transition(source: Phase, target: Phase) -> None:
    """Raise unless ``source -> target`` is in :data:`TRANSITIONS`."""
    if source in TERMINAL_PHASES:
        raise RolloutFinished(f"the rollout is {source.value}; it accepts no further change")
    if target not in TRANSITIONS[source]:
        raise InvalidTransition(f"a rollout cannot go from {source.value} to {target.value}")


@dataclass(frozen=True, kw_only=True)
class RolloutState:
    rollout_id: str
    model: str
    phase: Phase
    step_index: int = 0
    candidate_weight_percent: float = 0.0
    shadow_share: float = 0.0
    phase_started_ms: int = 0
    step_started_ms: int = 0
    consecutive_failures: int = 0
    # End of the candidate window behind the last counted failure: a failure
    # counts again only on a window that does not overlap it.
    failure_window_end_ms: int = 0
    paused_from: Phase | None = None
    # Approval steps: the step whose pause holds the rollout (-1: none), the last
    # step approved (-1: none), and when a timed approval pause ends (0: by resume).
    approval_step: int = -1
    approved_step: int = -1
    pause_until_ms: int = 0
    last_reason: str = ""
    epoch: int = 0
    updated_ms: int = 0
    evidence: StepEvidence = field(default_factory=StepEvidence)
    # The sequential gates' tests: kept across steps (the whole rollout is one test).
    sequential: SequentialEvidence = field(default_factory=SequentialEvidence)
    # A/B rollouts: the arms' rated outcomes as of the last decision (restart recovery).
    outcomes: OutcomeTally = field(default_factory=OutcomeTally)
    # BAKING: when the bake period ends, and the previous stable's last window before
    # the promotion, the reference of every bake window (see logic/bake.py).
    bake_until_ms: int = 0
    bake_reference: WindowStats | None = None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    def bake_left_ms(self, now_ms: int) -> int:
        """While BAKING, how long the bake has to go; 0 otherwise."""
        return bake_left_ms(self.bake_until_ms, now_ms) if self.phase is Phase.BAKING else 0


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One controller decision, with the inputs that drove it.

    ``routing`` is None when the traffic split does not change.
    """

    kind: DecisionKind
    rule: DecisionRule
    reason: str
    at_ms: int
    before: RolloutState
    after: RolloutState
    routing: RoutingPlan | None = None
    inputs: tuple[WindowStats, ...] = ()
    agreement: AgreementStats | None = None
    command: ManualCommand | None = None
    note: str = ""
    signals: RolloutSignals | None = None
    outcome_test: OutcomeTest | None = None
    """A/B rollouts: the outcome test as it stood at this decision (the audit's evidence)."""


def pending_state(spec: RolloutSpec, now_ms: int, *, epoch: int = 0) -> RolloutState:
    """The state of a rollout that exists but has not started."""
    return RolloutState(
        rollout_id=spec.rollout_id,
        model=spec.model,
        phase=Phase.PENDING,
        phase_started_ms=now_ms,
        step_started_ms=now_ms,
        epoch=epoch,
        updated_ms=now_ms,
        last_reason="created",
    )


def routing_of(spec: RolloutSpec, state: RolloutState) -> RoutingPlan:
    """The traffic split ``state`` stands for."""
    promoted = state.phase in (Phase.PROMOTED, Phase.BAKING)
    shadowing = state.shadow_share > 0.0
    return split_plan(
        model=spec.model,
        rollout_id=spec.rollout_id,
        stable_version=spec.candidate if promoted else spec.baseline,
        baseline=spec.baseline,
        candidate=spec.candidate,
        candidate_weight_percent=state.candidate_weight_percent,
        shadow_version=spec.candidate if shadowing else None,
        shadow_share=state.shadow_share,
        epoch=state.epoch,
    )


def check_rollout(state: RolloutState, spec: RolloutSpec) -> None:
    """Raise unless ``state`` belongs to ``spec`` and is still open."""
    if state.rollout_id != spec.rollout_id:
        raise InputMismatch(f"state of {state.rollout_id!r} with spec of {spec.rollout_id!r}")
    if state.terminal:
        raise RolloutFinished(f"rollout {state.rollout_id!r} is {state.phase.value}")


def transition(
    state: RolloutState,
    spec: RolloutSpec,
    now_ms: int,
    kind: DecisionKind,
    rule: DecisionRule,
    reason: str,
    *,
    phase: Phase,
    step_index: int,
    weight: float,
    shadow_share: float,
    before: RolloutState | None = None,
    inputs: tuple[WindowStats, ...] = (),
    agreement: AgreementStats | None = None,
    command: ManualCommand | None = None,
    note: str = "",
    signals: RolloutSignals | None = None,
) -> Decision:
    """Move to ``phase`` with a new traffic split: one routing intent, the next epoch.

    The step's timers, evidence and failure streak start over (a rollback
    keeps its failure count on record). ``before`` is the state the decision
    started from when it differs from ``state`` (evidence added on the way).
    """
    check_transition(state.phase, phase)
    after = replace(
        state,
        phase=phase,
        step_index=step_index,
        candidate_weight_percent=weight,
        shadow_share=shadow_share,
        phase_started_ms=now_ms if phase is not state.phase else state.phase_started_ms,
        step_started_ms=now_ms,
        consecutive_failures=0 if phase is not Phase.ROLLED_BACK else state.consecutive_failures,
        failure_window_end_ms=0,
        paused_from=None,
        approval_step=-1,
        pause_until_ms=0,
        last_reason=reason,
        epoch=state.epoch + 1,
        updated_ms=now_ms,
        evidence=StepEvidence(),
    )
    return Decision(
        kind=kind,
        rule=rule,
        reason=reason,
        at_ms=now_ms,
        before=before if before is not None else state,
        after=after,
        routing=routing_of(spec, after),
        inputs=inputs,
        agreement=agreement,
        command=command,
        note=note,
        signals=signals,
    )


class Carry(TypedDict):
    before: RolloutState
    inputs: tuple[WindowStats, ...]
    agreement: AgreementStats | None
    signals: RolloutSignals | None


class Evaluation:
    """What every decision of one evaluation shares."""

    def __init__(
        self,
        state: RolloutState,
        spec: RolloutSpec,
        now_ms: int,
        inputs: tuple[WindowStats, ...],
        agreement: AgreementStats | None,
        signals: RolloutSignals | None = None,
    ) -> None:
        self.before = state
        self.spec = spec
        self.now_ms = now_ms
        self.inputs = inputs
        self.agreement = agreement
        self.signals = signals
        self.outcome: OutcomeTest | None = None

    def decide(
        self,
        kind: DecisionKind,
        rule: DecisionRule,
        reason: str,
        after: RolloutState,
    ) -> Decision:
        return Decision(
            kind=kind,
            rule=rule,
            reason=reason,
            at_ms=self.now_ms,
            before=self.before,
            after=replace(after, last_reason=reason, updated_ms=self.now_ms),
            inputs=self.inputs,
            agreement=self.agreement,
            signals=self.signals,
        )

    def carry(self) -> Carry:
        """What a phase change takes from this evaluation into its decision."""
        return {
            "before": self.before,
            "inputs": self.inputs,
            "agreement": self.agreement,
            "signals": self.signals,
        }

    def hold(self, state: RolloutState, rule: DecisionRule, reason: str) -> Decision:
        return self.decide(DecisionKind.HOLD, rule, reason, state)


def summary_of(results: list[GateResult]) -> str:
    return " | ".join(f"{r.rule} {r.verdict.value}: {r.detail}" for r in results)


def on_failure(
    ctx: Evaluation, state: RolloutState, candidate: WindowStats, failed: list[GateResult]
) -> Decision:
    spec = ctx.spec
    first = failed[0]
    detail = summary_of(failed)
    severe = [r for r in failed if r.severe]
    if severe:
        return rollback(ctx, state, severe[0].rule, f"severe regression: {summary_of(severe)}")
    if state.consecutive_failures and candidate.window_start_ms < state.failure_window_end_ms:
        return ctx.decide(
            DecisionKind.GATE_FAILED,
            first.rule,
            f"gate failed, not counted (window overlaps the last counted failure; "
            f"{state.consecutive_failures}/{spec.failures_to_rollback}): {detail}",
            state,
        )
    failures = state.consecutive_failures + 1
    counted = replace(
        state, consecutive_failures=failures, failure_window_end_ms=candidate.window_end_ms
    )
    if failures >= spec.failures_to_rollback:
        return rollback(ctx, counted, first.rule, f"{failures} consecutive gate failures: {detail}")
    return ctx.decide(
        DecisionKind.GATE_FAILED,
        first.rule,
        f"gate failed ({failures}/{spec.failures_to_rollback}): {detail}",
        counted,
    )


def rollback(ctx: Evaluation, state: RolloutState, rule: DecisionRule, reason: str) -> Decision:
    """Send the candidate to 0 % at once under ``rule`` (during a bake: the previous
    stable version takes the whole traffic back and is stable again)."""
    spec = ctx.spec
    what = (
        f"rolled back {spec.candidate} during bake, {spec.baseline} at 100% and stable again"
        if state.phase is Phase.BAKING
        else f"rolled back {spec.candidate} to 0%"
    )
    return transition(
        state,
        ctx.spec,
        ctx.now_ms,
        DecisionKind.ROLLBACK,
        rule,
        f"{what}: {reason}",
        phase=Phase.ROLLED_BACK,
        step_index=state.step_index,
        weight=0.0,
        shadow_share=0.0,
        **ctx.carry(),
    )


def on_pass(ctx: Evaluation, state: RolloutState, summary: str) -> Decision:
    spec, now = ctx.spec, ctx.now_ms
    ev = state.evidence
    if state.phase is Phase.PROGRESSING:
        step = spec.steps[state.step_index]
        need_samples, need_ms, since = (
            step.min_samples,
            step.min_dwell_s * 1000,
            state.step_started_ms,
        )
        where = f"step {state.step_index + 1}/{len(spec.steps)} ({step.weight_percent:g}%)"
    else:
        need_samples, since = spec.phase_min_samples, state.phase_started_ms
        shadow = state.phase is Phase.SHADOWING
        need_ms = (spec.shadow_duration_s if shadow else spec.ab_duration_s) * 1000
        where = "shadow phase" if shadow else "A/B hold"
    pairs = ctx.agreement.pairs if ctx.agreement is not None else None
    text = ctx.signals.text_agreement if ctx.signals is not None else None
    if pairs is not None and text is not None:
        pairs += text.pairs
    short = [
        f"{side} {n}/{need_samples}"
        for side, n in (
            ("candidate", ev.candidate_requests),
            ("baseline", ev.baseline_requests),
            ("shadow pairs", pairs),
        )
        if n is not None and n < need_samples
    ]
    if short:
        return ctx.hold(
            state,
            DecisionRule.MIN_SAMPLES,
            f"gates pass; {where} needs more samples ({', '.join(short)}): {summary}",
        )
    waited = now - since
    outcome = ctx.outcome
    if outcome is not None and (outcome.decided or outcome.tally.rated):
        summary = f"{outcome.describe()} | {summary}"
    if outcome is not None and outcome.verdict is OutcomeVerdict.CANDIDATE_BETTER:
        return _advance(ctx, state, "A/B on outcomes", summary, DecisionRule.OUTCOME_BETTER)
    if waited < need_ms:
        return ctx.hold(
            state,
            DecisionRule.MIN_DWELL,
            f"gates pass; {where} dwelt {waited / 1000:g} s of {need_ms / 1000:g} s: {summary}",
        )
    rule = DecisionRule.ALL_GATES_PASSED
    if outcome is not None and outcome.tally.rated:
        rule = DecisionRule.OUTCOME_NO_DIFFERENCE
    evaluation = ctx.signals.evaluation if ctx.signals is not None else None
    target = target_step(spec, state.phase, state.step_index)
    held = evaluation_hold(spec, target, evaluation, spec.rollout_id)
    if held is not None:
        return ctx.hold(state, held.rule, f"gates pass; {held.reason}")
    if state.phase is Phase.PROGRESSING:
        pause = spec.steps[state.step_index].pause
        if pause is not None and state.approved_step != state.step_index:
            return _await_approval(ctx, state, pause.duration_s, where, summary)
    return _advance(ctx, state, where, summary, rule)


def _await_approval(
    ctx: Evaluation, state: RolloutState, duration_s: float | None, where: str, summary: str
) -> Decision:
    """Pause an approval step whose conditions are met: weights frozen until approved."""
    check_transition(state.phase, Phase.PAUSED)
    until = ctx.now_ms + round(duration_s * 1000) if duration_s is not None else 0
    wait = f"for {duration_s:g} s or until resumed" if duration_s else "until resumed"
    after = replace(
        state,
        phase=Phase.PAUSED,
        paused_from=state.phase,
        approval_step=state.step_index,
        pause_until_ms=until,
    )
    reason = f"{where} passed; paused for approval {wait}: {summary}"
    return ctx.decide(DecisionKind.HOLD, DecisionRule.APPROVAL_PAUSE, reason, after)


def approve(state: RolloutState) -> RolloutState:
    """The state after an approval pause ends: back to the phase it paused, step approved."""
    if state.paused_from is None:
        raise InvalidTransition(f"cannot resume a rollout that is {state.phase.value}")
    check_transition(Phase.PAUSED, state.paused_from)
    return replace(
        state,
        phase=state.paused_from,
        paused_from=None,
        approved_step=state.approval_step if state.approval_step >= 0 else state.approved_step,
        approval_step=-1,
        pause_until_ms=0,
    )


def _advance(
    ctx: Evaluation,
    state: RolloutState,
    where: str,
    summary: str,
    rule: DecisionRule = DecisionRule.ALL_GATES_PASSED,
) -> Decision:
    spec = ctx.spec
    if state.phase is Phase.SHADOWING:
        return transition(
            state,
            spec,
            ctx.now_ms,
            DecisionKind.ADVANCE,
            DecisionRule.ALL_GATES_PASSED,
            f"{where} passed; canary step 1/{len(spec.steps)} at "
            f"{spec.steps[0].weight_percent:g}%: {summary}",
            phase=Phase.PROGRESSING,
            step_index=0,
            weight=spec.steps[0].weight_percent,
            shadow_share=0.0,
            **ctx.carry(),
        )
    nxt = state.step_index + 1
    final = state.phase is Phase.AB_HOLDING or spec.steps[nxt].weight_percent >= 100.0
    if final:
        reference = bake_reference(ctx.inputs, spec.baseline) if spec.bake_s > 0 else None
        baking = reference is not None
        bake = (
            f"; baking {spec.bake_s:g} s against {spec.baseline}'s last window "
            f"({reference.requests} requests)"
            if reference is not None
            else ""
        )
        decision = transition(
            state,
            spec,
            ctx.now_ms,
            DecisionKind.PROMOTE,
            rule,
            f"{where} passed; promoted {spec.candidate} to 100% and stable{bake}: {summary}",
            phase=Phase.BAKING if baking else Phase.PROMOTED,
            step_index=len(spec.steps) - 1 if state.phase is Phase.PROGRESSING else 0,
            weight=100.0,
            shadow_share=0.0,
            **ctx.carry(),
        )
        if not baking:
            return decision
        until = ctx.now_ms + round(spec.bake_s * 1000)
        after = replace(decision.after, bake_until_ms=until, bake_reference=reference)
        return replace(decision, after=after)
    return transition(
        state,
        spec,
        ctx.now_ms,
        DecisionKind.ADVANCE,
        DecisionRule.ALL_GATES_PASSED,
        f"{where} passed; step {nxt + 1}/{len(spec.steps)} at "
        f"{spec.steps[nxt].weight_percent:g}%: {summary}",
        phase=Phase.PROGRESSING,
        step_index=nxt,
        weight=spec.steps[nxt].weight_percent,
        shadow_share=0.0,
        **ctx.carry(),
    )


def judge(
    baseline: WindowStats,
    candidate: WindowStats,
    evidence: StepEvidence,
    sequential: SequentialEvidence,
    gates: Gates,
    *,
    behind: str = "",
) -> list[GateResult]:
    """The latency and error gates of ``gates.mode``, then the backlog check.

    Generations are judged on TTFT and TPOT (not whole-request latency, which is
    mostly output length), and their output lengths and endings on the drift gate,
    listed first so that a drift that holds names the hold.
    """
    gen = generative(baseline, candidate)
    if gates.mode is GateMode.SEQUENTIAL:
        results = sequential_gates(baseline, candidate, sequential, gates)
    elif gen:
        results = [
            *generation_latency_gates(baseline, candidate, gates),
            error_gate(baseline, candidate, evidence, gates),
        ]
    else:
        results = [
            service_latency_gate(baseline, candidate, gates),
            error_gate(baseline, candidate, evidence, gates),
        ]
    drift = (
        [length_drift_gate(baseline, candidate, gates)]
        if baseline.generation is not None or candidate.generation is not None
        else []
    )
    backlog = backlog_gate(baseline, candidate, gates, behind)
    if backlog is None:
        return [*drift, *results]
    # A queue lengthens end-to-end latency and, for generations, time to first token
    # (it counts from the request's creation): a capacity problem, do not fail on it.
    queued = {DecisionRule.TTFT_P99_RATIO, DecisionRule.TTFT_SEQUENTIAL}
    if not gen and not on_service_time(baseline, candidate):
        queued |= {DecisionRule.P99_RATIO, DecisionRule.P99_SEVERE}
    # Longer answers load a version more: a drift names the hold before its backlog.
    return [*drift, backlog, *(r for r in results if r.rule not in queued)]


def apply_command(
    state: RolloutState,
    spec: RolloutSpec,
    command: ManualCommand,
    now_ms: int,
    *,
    note: str = "",
) -> Decision:
    """Apply an operator's command; ``note`` (who / why) goes into the reason."""
    check_rollout(state, spec)
    rule = command.rule
    suffix = f" ({note})" if note else ""
    kind = DecisionKind.MANUAL

    def decided(reason: str, after: RolloutState) -> Decision:
        return Decision(
            kind=kind,
            rule=rule,
            reason=reason,
            at_ms=now_ms,
            before=state,
            after=after,
            command=command,
            note=note,
        )

    if command is ManualCommand.PAUSE:
        check_transition(state.phase, Phase.PAUSED)
        reason = (
            f"paused at {state.phase.value}, {spec.candidate} frozen at "
            f"{state.candidate_weight_percent:g}%{suffix}"
        )
        after = replace(
            state,
            phase=Phase.PAUSED,
            paused_from=state.phase,
            last_reason=reason,
            updated_ms=now_ms,
        )
        return decided(reason, after)
    if command is ManualCommand.RESUME:
        if state.phase is not Phase.PAUSED or state.paused_from is None:
            raise InvalidTransition(f"cannot resume a rollout that is {state.phase.value}")
        approved = (
            f"approved step {state.approval_step + 1}/{len(spec.steps)}, "
            if state.approval_step >= 0
            else ""
        )
        reason = f"{approved}resumed {state.paused_from.value}{suffix}"
        after = replace(approve(state), last_reason=reason, updated_ms=now_ms)
        return decided(reason, after)
    if command is ManualCommand.PROMOTE:
        target, weight = Phase.PROMOTED, 100.0
        reason = f"promoted {spec.candidate} to 100% and stable by command{suffix}"
    elif command is ManualCommand.ROLLBACK:
        target, weight = Phase.ROLLED_BACK, 0.0
        reason = f"rolled back {spec.candidate} to 0% by command{suffix}"
    else:
        target, weight = Phase.ABORTED, 0.0
        reason = f"aborted the rollout of {spec.candidate}; candidate at 0%{suffix}"
    if state.phase is Phase.PENDING:
        # Nothing was routed yet: end without a routing intent.
        check_transition(state.phase, target)
        after = replace(state, phase=target, last_reason=reason, updated_ms=now_ms)
        return decided(reason, after)
    return transition(
        state,
        spec,
        now_ms,
        kind,
        rule,
        reason,
        phase=target,
        step_index=state.step_index,
        weight=weight,
        shadow_share=0.0,
        command=command,
        note=note,
    )


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
    signals: RolloutSignals | None = None,
) -> Decision:
    """Judge the candidate over one window and decide the next move.

    While shadowing, ``candidate`` is the candidate's shadow-lane stats and
    ``agreement`` the shadow pairs since the phase began. ``signals`` carries
    liveness (an unresponsive candidate rolls back, an unresponsive baseline
    holds: rules ``candidate_unresponsive`` / ``baseline_unresponsive``,
    judged before ``no_data``) and the newest step's stats for the
    sequential gates.

    In an A/B hold, ``signals.outcomes`` (the arms' rated outcomes) is judged by the
    anytime-valid outcome test (:mod:`~graylane.policy_engine.logic.outcomes`): a
    candidate found worse is rolled back at once (rule ``outcome_worse``, liveness
    first); one found better is promoted as soon as the guardrail gates pass (rule
    ``outcome_better``); at ``ab_duration_s`` without a difference the hold ends as
    before, promoted with the gates passing (rule ``outcome_no_difference`` when
    anything was rated). The test's evidence rides on the decision.
    """
    check_rollout(state, spec)
    if state.phase is Phase.PENDING:
        raise InvalidTransition("the rollout has not started; call start() first")
    outcome = _outcome_test(state, spec, signals, now_ms)
    decision = _evaluate(state, spec, baseline, candidate, agreement, now_ms, signals, outcome)
    if outcome is None:
        return decision
    after = replace(decision.after, outcomes=outcome.tally)
    return replace(decision, outcome_test=outcome, after=after)


def _outcome_test(
    state: RolloutState, spec: RolloutSpec, signals: RolloutSignals | None, now_ms: int
) -> OutcomeTest | None:
    if state.phase is not Phase.AB_HOLDING or signals is None or signals.outcomes is None:
        return None
    horizon = now_ms - state.phase_started_ms >= spec.ab_duration_s * 1000
    return judge_outcomes(signals.outcomes, spec.gates.alpha, at_horizon=horizon)


def _evaluate(
    state: RolloutState,
    spec: RolloutSpec,
    baseline: WindowStats | None,
    candidate: WindowStats | None,
    agreement: AgreementStats | None,
    now_ms: int,
    signals: RolloutSignals | None,
    outcome: OutcomeTest | None,
) -> Decision:
    inputs = tuple(s for s in (baseline, candidate) if s is not None)
    shadowing = state.phase is Phase.SHADOWING
    ctx = Evaluation(state, spec, now_ms, inputs, agreement if shadowing else None, signals)
    ctx.outcome = outcome
    if state.phase is Phase.PAUSED:
        from_phase = state.paused_from.value if state.paused_from else "?"
        if state.approval_step >= 0 and 0 < state.pause_until_ms <= now_ms:
            step = f"step {state.approval_step + 1}/{len(spec.steps)}"
            reason = f"{step} approval pause elapsed; resumed {from_phase}"
            return ctx.decide(
                DecisionKind.HOLD, DecisionRule.APPROVAL_ELAPSED, reason, approve(state)
            )
        if state.approval_step >= 0:
            return ctx.hold(
                state,
                DecisionRule.PAUSED,
                f"step {state.approval_step + 1}/{len(spec.steps)} waits for approval "
                "(`graylane rollout resume`); weights frozen",
            )
        return ctx.hold(state, DecisionRule.PAUSED, f"paused (from {from_phase}); weights frozen")
    if state.phase is Phase.BAKING:
        return _evaluate_bake(ctx, state, candidate, signals)
    live = check_rollout_liveness(
        signals.baseline_liveness if signals else None,
        signals.candidate_liveness if signals else None,
        now_ms,
        round(spec.gates.unresponsive_s * 1000),
    )
    if live.action is LivenessAction.HOLD:
        return ctx.hold(state, DecisionRule.BASELINE_UNRESPONSIVE, live.reason)
    if live.action is LivenessAction.ROLLBACK:
        return rollback(ctx, state, DecisionRule.CANDIDATE_UNRESPONSIVE, live.reason)
    if outcome is not None and outcome.verdict is OutcomeVerdict.CANDIDATE_WORSE:
        return rollback(
            ctx, state, DecisionRule.OUTCOME_WORSE, f"baseline wins: {outcome.describe()}"
        )
    if shadowing and agreement is not None and agreement.mismatch is not None:
        return _incomparable(ctx, state, agreement.mismatch)
    missing = _missing(baseline, candidate, spec)
    text = signals.text_agreement if signals is not None and shadowing else None
    text_pairs = text.pairs if text is not None else 0
    if shadowing and (agreement is None or agreement.pairs + text_pairs == 0):
        unseeded = agreement.unseeded if agreement is not None else 0
        missing.append(
            f"no comparable shadow pairs ({unseeded} generations sampled without a seed)"
            if unseeded
            else "no shadow pairs"
        )
    if missing or baseline is None or candidate is None:
        return ctx.hold(state, DecisionRule.NO_DATA, "no data: " + ", ".join(missing))
    _check_inputs(baseline, candidate, spec)

    evidence = _accumulate(state, baseline, candidate)
    current = replace(state, evidence=evidence)
    if spec.gates.mode is GateMode.SEQUENTIAL:
        sequential = advance_sequential(state.sequential, spec.gates, baseline, candidate, signals)
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
    if shadowing and agreement is not None and (agreement.pairs or not text_pairs):
        results.append(agreement_gate(agreement, spec.gates))
    if text is not None and text_pairs:
        results.append(text_agreement_gate(text, spec.gates))
    if spec.gates.metrics:
        readings = signals.metrics if signals is not None else ()
        stalled = overdue(spec.gates.metrics, readings, now_ms)
        if stalled is not None:
            gate, reading = stalled
            return _pause_inconclusive(ctx, current, gate.name, reading, now_ms)
        results.extend(metric_results(spec.gates.metrics, readings))
    failed = [r for r in results if r.verdict is Verdict.FAIL]
    if failed:
        return on_failure(ctx, current, candidate, failed)
    unsure = [r for r in results if r.verdict is Verdict.INCONCLUSIVE]
    summary = summary_of(results)
    if unsure:
        return ctx.hold(current, unsure[0].rule, f"inconclusive, holding: {summary}")
    passed = replace(current, consecutive_failures=0, failure_window_end_ms=0)
    return on_pass(ctx, passed, summary)


def _evaluate_bake(
    ctx: Evaluation,
    state: RolloutState,
    candidate: WindowStats | None,
    signals: RolloutSignals | None,
) -> Decision:
    """Judge one window of the promoted version against the frozen reference (see
    :mod:`~graylane.policy_engine.logic.bake`): roll back, end baked, or keep baking."""
    spec, now_ms = ctx.spec, ctx.now_ms
    reference = state.bake_reference
    live = check_rollout_liveness(
        None,
        signals.candidate_liveness if signals else None,
        now_ms,
        round(spec.gates.unresponsive_s * 1000),
    )
    if live.action is LivenessAction.ROLLBACK:
        return rollback(ctx, state, DecisionRule.CANDIDATE_UNRESPONSIVE, live.reason)
    results: list[GateResult] = []
    judged = ""
    if reference is None:
        judged = "no reference window of the previous stable version"
    elif candidate is None or candidate.requests < GATE_MIN_WINDOW_REQUESTS:
        served = 0 if candidate is None else candidate.requests
        judged = (
            f"window has {served} requests of {spec.candidate}; "
            f"gates need at least {GATE_MIN_WINDOW_REQUESTS}"
        )
    else:
        ctx.inputs = (reference, candidate)
        results = judge(
            reference, candidate, StepEvidence(), SequentialEvidence(), bake_gates(spec.gates)
        )
        if spec.gates.metrics:
            readings = signals.metrics if signals is not None else ()
            results.extend(metric_results(spec.gates.metrics, readings))
    verdict = judge_bake(results, bake_until_ms=state.bake_until_ms, now_ms=now_ms, judged=judged)
    if verdict.action is BakeAction.FAILED and candidate is not None:
        return on_failure(ctx, state, candidate, list(verdict.failed))
    if verdict.action is BakeAction.BAKED:
        check_transition(state.phase, Phase.PROMOTED)
        after = replace(state, phase=Phase.PROMOTED, consecutive_failures=0)
        reason = f"baked: {spec.candidate} stays stable after {spec.bake_s:g} s; {verdict.reason}"
        return ctx.decide(DecisionKind.PROMOTE, DecisionRule.BAKED, reason, after)
    if results and all(r.verdict is Verdict.PASS for r in results):
        state = replace(state, consecutive_failures=0, failure_window_end_ms=0)
    return ctx.hold(state, DecisionRule.BAKING, verdict.reason)


def _pause_inconclusive(
    ctx: Evaluation, state: RolloutState, gate: str, reading: MetricReading, now_ms: int
) -> Decision:
    """Pause: a metric gate has read nothing usable for longer than it allows."""
    check_transition(state.phase, Phase.PAUSED)
    held_s = (now_ms - reading.inconclusive_since_ms) / 1000.0
    reason = (
        f"paused at {state.phase.value}: metric gate {gate} inconclusive for {held_s:.0f} s "
        f"({reading.inconclusive}); weights frozen until resumed"
    )
    after = replace(state, phase=Phase.PAUSED, paused_from=state.phase)
    return ctx.decide(DecisionKind.HOLD, DecisionRule.METRIC_INCONCLUSIVE, reason, after)


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
