"""What one evaluation's gate verdicts lead to: hold, advance a step, promote, fail, roll back.

:class:`Evaluation` carries what every decision of one evaluation shares; the
controller (:mod:`graylane.policy_engine.logic.rollout`) builds it and hands
the verdicts to :func:`on_failure` / :func:`on_pass`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.facts import RolloutFacts
from graylane.policy_engine.logic.gates import GateResult
from graylane.policy_engine.logic.rollout_moves import transition
from graylane.policy_engine.logic.rollout_state import Decision, RolloutState
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase

__all__ = ["Carry", "Evaluation", "on_failure", "on_pass", "rollback", "summary_of"]


class Carry(TypedDict):
    before: RolloutState
    inputs: tuple[WindowStats, ...]
    agreement: AgreementStats | None
    facts: RolloutFacts | None


class Evaluation:
    """What every decision of one evaluation shares."""

    def __init__(
        self,
        state: RolloutState,
        spec: RolloutSpec,
        now_ms: int,
        inputs: tuple[WindowStats, ...],
        agreement: AgreementStats | None,
        facts: RolloutFacts | None = None,
    ) -> None:
        self.before = state
        self.spec = spec
        self.now_ms = now_ms
        self.inputs = inputs
        self.agreement = agreement
        self.facts = facts

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
            facts=self.facts,
        )

    def carry(self) -> Carry:
        """What a phase change takes from this evaluation into its decision."""
        return {
            "before": self.before,
            "inputs": self.inputs,
            "agreement": self.agreement,
            "facts": self.facts,
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
    """Send the candidate to 0 % at once under ``rule``."""
    return transition(
        state,
        ctx.spec,
        ctx.now_ms,
        DecisionKind.ROLLBACK,
        rule,
        f"rolled back {ctx.spec.candidate} to 0%: {reason}",
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
    if waited < need_ms:
        return ctx.hold(
            state,
            DecisionRule.MIN_DWELL,
            f"gates pass; {where} dwelt {waited / 1000:g} s of {need_ms / 1000:g} s: {summary}",
        )
    return _advance(ctx, state, where, summary)


def _advance(ctx: Evaluation, state: RolloutState, where: str, summary: str) -> Decision:
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
        return transition(
            state,
            spec,
            ctx.now_ms,
            DecisionKind.PROMOTE,
            DecisionRule.ALL_GATES_PASSED,
            f"{where} passed; promoted {spec.candidate} to 100% and stable: {summary}",
            phase=Phase.PROMOTED,
            step_index=len(spec.steps) - 1 if state.phase is Phase.PROGRESSING else 0,
            weight=100.0,
            shadow_share=0.0,
            **ctx.carry(),
        )
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
