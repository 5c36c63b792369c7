"""The policy engine's orchestrator, without I/O: telemetry in, publications out.

:class:`PolicyCore` composes the sliding window and the state owners of
:mod:`graylane.policy_engine.state` (rollouts, routing, QoS, precision acks,
scaling) with the liveness tracker, and decides. The streaming adapter
(``graylane.policy_engine.service``) feeds it decoded inputs and publishes the
:data:`Output` items it returns, converting them to the wire at the edge
(``graylane.policy_engine.wire``); both kinds are in
:mod:`graylane.policy_engine.messages`.

Choices worth knowing:

- **Epochs rise per key** (:class:`~graylane.policy_engine.state.Epochs`).
  The routing epoch of a model is ``max(seen) + 1`` over every table this
  engine (or an earlier run, see :meth:`restore`) wrote;
  a rollout's state is lifted to the model's current epoch before each
  decision, so its next routing intent always outranks the last table. The
  precision epoch of (model, version) rises the same way.
- **Holds are audited when they matter.** A HOLD is recorded (and the
  rollout's state republished) when its rule differs from the rollout's
  previous decision, or when it changes the carried state beyond the reason
  text and timestamp (evidence gathered, a failure streak). Each audit
  record carries the whole state before and after, so every recorded decision
  replays on its own (``graylane.policy_engine.audit_replay``) even though most
  same-rule holds are left out. QoS holds are recorded on a rule change only.
- **One rollout per model.** A START for a model with an active rollout, an
  unknown rollout id or a command the state machine refuses is recorded as a
  ``command_rejected`` audit record and changes nothing, except that a
  refused START also ends its own rollout as ABORTED (published, with the
  reason), so it never stays PENDING. A START for a
  rollout id seen before is a redelivery and is ignored.
- **Replicas**: after QoS, each tick decides the desired replicas per
  version (off unless the scale policy allows more than ``min_replicas``); a
  QoS step up waits until the replicas are settled. A replica's capacity is
  the QoS policy's calibrated capacity of the running variant scaled by the
  QoS state's contention factor, else learned.
  A breach is QoS's or the window's own: right after a step down QoS's timers
  restart while the window still shows the load that made it step, so an
  overload the floor cannot carry scales out at the same tick.
- **A/B on outcomes**: each rated answer (:meth:`on_outcome`) joins the ledger of
  its model's AB_SPLIT rollout by the version that served it; each evaluation hands
  the tally to the rollout controller, which tests it. Each decision's state carries
  the tallies, so a restarted engine goes on from them (the ids rated before the
  restart are not remembered).
- **QoS during a rollout**: the candidate follows the baseline's variant
  (``qos_during_rollout``); without a QoS policy on the baseline the
  candidate's precision is frozen for the rollout.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from functools import partial

from graylane.policy_engine.isolation import RecordGuard
from graylane.policy_engine.logic.agreement import ShadowOutput
from graylane.policy_engine.logic.liveness import LivenessTracker, OffsetSample
from graylane.policy_engine.logic.metric_gates import (
    MetricReading,
    MetricTarget,
    next_reading,
    render,
)
from graylane.policy_engine.logic.outcomes import OutcomeLedger, RatedOutcome
from graylane.policy_engine.logic.precision_ack import (
    AckVerdict,
    PendingSwitch,
    judge_switch,
)
from graylane.policy_engine.logic.qos import (
    QosDecisionKind,
    QosState,
    breach_rule,
    effective_capacity,
    evaluate_qos,
    qos_during_rollout,
)
from graylane.policy_engine.logic.quality_cap import capped_floor
from graylane.policy_engine.logic.revision import revise
from graylane.policy_engine.logic.rollout import (
    Decision,
    RolloutSignals,
    RolloutState,
    apply_command,
    evaluate,
    pending_state,
    start,
)
from graylane.policy_engine.logic.scale import (
    ScalePolicy,
    ScaleSignals,
    evaluate_scale,
    initial_scale_state,
    scale_unsettled,
)
from graylane.policy_engine.logic.step_evaluation import (
    EvaluationOutcome,
    EvaluationRequest,
    EvaluationVerdict,
    evaluation_due,
    target_step,
)
from graylane.policy_engine.logic.window import (
    DEFAULT_STEP_MS,
    DEFAULT_WINDOW_MS,
    Lane,
    SlidingWindow,
    TelemetrySample,
    WindowKey,
    WindowStats,
)
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    CommandRejected,
    Output,
    PrecisionAck,
    PrecisionPublication,
    QosAudit,
    QosPolicySet,
    RecordSource,
    RolloutAudit,
    RolloutPublication,
    RoutingAudit,
    RoutingPublication,
    ScaleAudit,
    ScalePublication,
)
from graylane.policy_engine.state import (
    ActiveRollout,
    PrecisionAcks,
    Qos,
    Rollouts,
    Routing,
    Scaling,
    VersionKey,
)
from graylane.rollouts.errors import PolicyError
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec, Strategy
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, ManualCommand, Phase
from graylane.routing.table import (
    InvalidRouteRule,
    RouteTable,
    RoutingPlan,
    plan_of_table,
    stable_plan,
)

__all__ = ["EVALUATION_RETRY_MS", "PolicyCore"]

EVALUATION_RETRY_MS = 60_000
"""How long after an unusable step evaluation (its set unreadable, too few answers) the
engine runs it again."""


log = logging.getLogger(__name__)


_COMPARED = tuple(
    f.name for f in fields(RolloutState) if f.name not in {"last_reason", "updated_ms"}
)


def _significant(before: RolloutState, after: RolloutState) -> bool:
    """Whether ``after`` differs from ``before`` beyond reason text and timestamp."""
    return any(getattr(before, name) != getattr(after, name) for name in _COMPARED)


class PolicyCore:
    """Every decision of the policy engine, fed by plain data."""

    def __init__(
        self,
        window_ms: int = DEFAULT_WINDOW_MS,
        step_ms: int = DEFAULT_STEP_MS,
        *,
        scale_policy: ScalePolicy | None = None,
    ) -> None:
        self.window = SlidingWindow(window_ms, step_ms)
        self.rollouts = Rollouts()
        self.routing = Routing()
        self.qos = Qos()
        self.acks = PrecisionAcks()
        self.scaling = Scaling(policy=scale_policy or ScalePolicy())
        self.liveness = LivenessTracker()  # per version: routed vs answered, topic lag
        self.guard = RecordGuard()
        self.metric_readings: dict[str, dict[str, MetricReading]] = {}
        """Per model with an active rollout: the newest reading of each metric gate."""
        self.outcomes: dict[str, OutcomeLedger] = {}  # by rollout id: A/B rollouts' outcomes

    # -- inputs ------------------------------------------------------------------

    def on_telemetry(self, sample: TelemetrySample, received_ms: int | None = None) -> bool:
        """Take one batch's telemetry; ``received_ms`` (default: its completion) marks the
        version alive on the engine's clock."""
        key = VersionKey(sample.model, sample.version)
        self.acks.on_batch(key, sample.variant, sample.completed_at_ms)
        at = sample.completed_at_ms if received_ms is None else received_ms
        self.liveness.on_telemetry(sample.model, sample.version, at)
        self.window.note_arrival(sample.completed_at_ms, at)
        return self.window.add(sample)

    def on_offsets(self, key: VersionKey, sample: OffsetSample) -> None:
        """A probe of the version topic's end and its worker group's committed offsets."""
        self.liveness.on_offsets(key.model, key.version, sample)

    def liveness_targets(self) -> list[VersionKey]:
        """The versions whose topics the adapter probes: those of active rollouts."""
        return self.rollouts.versions()

    def metric_targets(self) -> list[MetricTarget]:
        """The metric gates of active rollouts, their queries rendered: what the adapter
        asks Prometheus before each tick."""
        out: list[MetricTarget] = []
        for model, active in sorted(self.rollouts.items()):
            spec = active.spec
            if active.state.terminal:
                continue
            for gate in spec.gates.metrics:
                query = render(
                    gate.query, model=model, baseline=spec.baseline, candidate=spec.candidate
                )
                out.append(MetricTarget(model, gate.name, query))
        return out

    def on_metric(
        self, target: MetricTarget, value: float | None, why: str, at_ms: int
    ) -> MetricReading:
        """One metric gate's read: a value, or why there is none (kept as a streak)."""
        readings = self.metric_readings.setdefault(target.model, {})
        reading = next_reading(readings.get(target.gate), target.gate, value, why, at_ms)
        readings[target.gate] = reading
        return reading

    def on_shadow_result(self, model: str, output: ShadowOutput) -> None:
        tracker = self.rollouts.tracker(model)
        if tracker is not None:
            tracker.add(output)
        text = self.rollouts.text_tracker(model)
        if text is not None:
            text.add(output)

    def evaluations_due(self, now_ms: int) -> list[EvaluationRequest]:
        """The step evaluations active rollouts need and have no usable outcome of: run
        them (the adapter) and hand back what they found (:meth:`on_evaluation`). An
        unusable outcome is due again :data:`EVALUATION_RETRY_MS` after it finished."""
        due = []
        for model in sorted(self.rollouts):
            active = self.rollouts[model]
            state = active.state
            request = evaluation_due(active.spec, state.phase, state.step_index, state.paused_from)
            if request is None:
                continue
            done = active.evaluation
            if done is not None and done.step_index == request.step_index:
                unusable = done.verdict is EvaluationVerdict.UNUSABLE
                if not unusable or now_ms - done.finished_at_ms < EVALUATION_RETRY_MS:
                    continue
            due.append(request)
        return due

    def on_evaluation(self, outcome: EvaluationOutcome) -> bool:
        """A finished step evaluation; the next tick's decision judges it. False when its
        rollout is no longer active (the outcome is dropped)."""
        return self.rollouts.note_evaluation(outcome)

    def on_outcome(self, outcome: RatedOutcome) -> bool:
        """Join a rated answer to the A/B rollout of its model (False: not counted)."""
        active = self.rollouts.get(outcome.model)
        if active is None or active.state.terminal or active.spec.strategy is not Strategy.AB_SPLIT:
            return False
        return self._ledger(active.spec, active.state).add(outcome)

    def _ledger(self, spec: RolloutSpec, state: RolloutState) -> OutcomeLedger:
        """The rollout's ledger; a restored rollout's goes on from its state's tallies."""
        ledger = self.outcomes.get(spec.rollout_id)
        if ledger is None:
            ledger = OutcomeLedger(spec.baseline, spec.candidate, tally=state.outcomes)
            self.outcomes[spec.rollout_id] = ledger
        return ledger

    def set_scale_policy(self, policy: ScalePolicy) -> None:
        self.scaling.policy = policy

    def note_partitions(self, counts: Mapping[VersionKey, int]) -> None:
        """Partition counts of version topics, read by the adapter (they bound replicas)."""
        self.scaling.note_partitions(counts)

    def scaled_versions(self) -> list[VersionKey]:
        """Versions with live telemetry or a scale state: those whose partitions matter."""
        live = self.window.keys()  # a SlidingWindow, not a dict
        keys = {VersionKey(k.model, k.version) for k in live}
        return sorted(keys | set(self.scaling.states))

    def restore(
        self,
        states: Sequence[tuple[RolloutState, RolloutSpec]] = (),
        routing_epochs: Mapping[str, int] | None = None,
        precision: Mapping[VersionKey, tuple[str, int]] | None = None,
        qos_policies: Sequence[QosPolicy] = (),
        tables: Mapping[str, RouteTable] | None = None,
        scale: Mapping[VersionKey, tuple[int, int, int]] | None = None,
    ) -> None:
        """Rebuild from the compacted topics (and the QoS policies on record).

        ``tables`` (the last routing table per model) give back the cohort
        rules and pinning every later table carries, and the current weights;
        ``scale`` holds the last request per version as (desired, epoch, at_ms).
        """
        for model, epoch in (routing_epochs or {}).items():
            self.routing.epochs.note(model, epoch)
        for table in (tables or {}).values():
            self.routing.set_plan(plan_of_table(table))
        for key, (variant, epoch) in (precision or {}).items():
            self.qos.note_precision(key, variant, epoch)
        for state, spec in sorted(states, key=lambda s: s[0].updated_ms):
            if state.terminal:
                self.rollouts.note_finished(state)
                continue
            self.routing.epochs.note(state.model, state.epoch)
            self.rollouts.keep(state, spec, None)
        for policy in qos_policies:
            self.qos.set_policy(policy)
        for key, (desired, epoch, at_ms) in (scale or {}).items():
            self.scaling.restore(key, desired, epoch, at_ms)

    # -- commands ------------------------------------------------------------------

    def on_command(self, cmd: Command, now_ms: int) -> list[Output]:
        if cmd.kind is CommandKind.START:
            return self._start(cmd, now_ms)
        if cmd.kind is CommandKind.UPDATE_SPEC:
            return self._update_spec(cmd, now_ms)
        if cmd.kind is CommandKind.REVERT:
            return self._revert(cmd, now_ms)
        if cmd.kind is CommandKind.SET_ROUTE_CONFIG:
            return self._set_route_config(cmd, now_ms)
        if cmd.kind is CommandKind.SET_QOS_POLICY:
            if cmd.qos_policy is None:
                return [CommandRejected(command=cmd, reason="no QoS policy", at_ms=now_ms)]
            key = VersionKey(cmd.qos_policy.model, cmd.qos_policy.version)
            before = self.qos.states.get(key)
            after = self.qos.set_policy(cmd.qos_policy)
            return [
                QosPolicySet(
                    policy=cmd.qos_policy,
                    before=before,
                    after=after,
                    at_ms=now_ms,
                    command_id=cmd.command_id,
                    actor=cmd.issued_by,
                )
            ]
        return self._manual(cmd, now_ms)

    def _start(self, cmd: Command, now_ms: int) -> list[Output]:
        spec = cmd.spec
        if spec is None:
            return [CommandRejected(command=cmd, reason="START without a spec", at_ms=now_ms)]
        if self.rollouts.seen(spec.rollout_id):
            log.info("rollout %s seen before; START ignored (redelivery)", spec.rollout_id)
            return []
        active = self.rollouts.get(spec.model)
        if active is not None:
            reason = f"{spec.model} already has the active rollout {active.spec.rollout_id}"
            return self._refuse_start(cmd, spec, reason, now_ms)
        decision = start(spec, now_ms, epoch=self.routing.epochs.current(spec.model))
        self.rollouts.keep(decision.after, spec, decision.rule)
        return self._outputs_of(decision, spec, command_id=cmd.command_id, actor=cmd.issued_by)

    def _refuse_start(
        self, cmd: Command, spec: RolloutSpec, reason: str, now_ms: int
    ) -> list[Output]:
        """Audit the refusal and end the refused rollout as ABORTED with the reason.

        Its store row (PENDING since the control plane took the request) then
        ends too, instead of blocking the model; the id counts as seen, so a
        redelivered START is ignored.
        """
        ended = replace(
            pending_state(spec, now_ms, epoch=self.routing.epochs.current(spec.model)),
            phase=Phase.ABORTED,
            last_reason=f"start rejected: {reason}",
            updated_ms=now_ms,
        )
        self.rollouts.note_finished(ended)
        return [
            CommandRejected(command=cmd, reason=reason, at_ms=now_ms),
            RolloutPublication(state=ended, spec=spec),
        ]

    def _manual(self, cmd: Command, now_ms: int) -> list[Output]:
        active = self.rollouts.get(cmd.model)
        if active is None or cmd.manual is None or active.spec.rollout_id != cmd.rollout_id:
            what = "finished" if cmd.rollout_id in self.rollouts.finished else "not active"
            return [
                CommandRejected(
                    command=cmd, reason=f"rollout {cmd.rollout_id!r} is {what}", at_ms=now_ms
                )
            ]
        state = self._lift(active)
        try:
            decision = apply_command(state, active.spec, cmd.manual, now_ms, note=cmd.note)
        except PolicyError as exc:
            return [CommandRejected(command=cmd, reason=str(exc), at_ms=now_ms)]
        return self._outputs_of(
            decision, active.spec, command_id=cmd.command_id, actor=cmd.issued_by
        )

    def _update_spec(self, cmd: Command, now_ms: int) -> list[Output]:
        """An applied document's new spec for the active rollout (see ``logic/revision.py``)."""
        active = self.rollouts.get(cmd.model)
        if active is None or cmd.spec is None or active.spec.rollout_id != cmd.rollout_id:
            what = "finished" if cmd.rollout_id in self.rollouts.finished else "not active"
            reason = f"rollout {cmd.rollout_id!r} is {what}; its spec is not updated"
            return [CommandRejected(command=cmd, reason=reason, at_ms=now_ms)]
        try:
            decision = revise(self._lift(active), active.spec, cmd.spec, now_ms, note=cmd.note)
        except PolicyError as exc:
            return [CommandRejected(command=cmd, reason=str(exc), at_ms=now_ms)]
        spec = replace(
            cmd.spec, created_at_ms=active.spec.created_at_ms, created_by=active.spec.created_by
        )
        return self._outputs_of(
            decision,
            spec,
            command_id=cmd.command_id,
            actor=cmd.issued_by,
            spec_before=active.spec,
        )

    def _revert(self, cmd: Command, now_ms: int) -> list[Output]:
        """Route 100 % to ``cmd.target_version`` in one routing update.

        During a rollout that is its rollback (the baseline is the stable
        version), recorded as a manual rollback with the operator's note.
        """
        target = cmd.target_version
        if not target:
            return [CommandRejected(command=cmd, reason="revert names no version", at_ms=now_ms)]
        active = self.rollouts.get(cmd.model)
        if active is not None:
            if target != active.spec.baseline:
                reason = (
                    f"rollout {active.spec.rollout_id} is active: a revert returns to its "
                    f"baseline {active.spec.baseline}, not {target}"
                )
                return [CommandRejected(command=cmd, reason=reason, at_ms=now_ms)]
            note = f"revert to {target}" + (f": {cmd.note}" if cmd.note else "")
            rollback = replace(
                cmd,
                kind=CommandKind.MANUAL,
                manual=ManualCommand.ROLLBACK,
                rollout_id=active.spec.rollout_id,
                note=note,
            )
            return self._manual(rollback, now_ms)
        last = self.routing.plan(cmd.model)
        was = f" from {last.stable_version}" if last is not None else ""
        reason = f"reverted {cmd.model} to {target}{was}: 100% to {target}"
        if cmd.note:
            reason += f" ({cmd.note})"
        plan = stable_plan(cmd.model, target, self.routing.epochs.current(cmd.model) + 1)
        return self._routing_change(cmd, plan, DecisionRule.STABLE_REVERTED, reason, now_ms)

    def _set_route_config(self, cmd: Command, now_ms: int) -> list[Output]:
        """Take the model's cohort rules and republish its current table with them."""
        last = self.routing.plan(cmd.model)
        if last is None and not cmd.target_version:
            reason = f"{cmd.model} has no routing table yet and the command names no stable version"
            return [CommandRejected(command=cmd, reason=reason, at_ms=now_ms)]
        epoch = self.routing.epochs.current(cmd.model) + 1
        split = (
            replace(last, epoch=epoch)
            if last is not None
            else stable_plan(cmd.model, cmd.target_version, epoch)
        )
        try:
            plan = split.with_cohort(cmd.rules, cmd.allow_pinning)
        except InvalidRouteRule as exc:
            return [CommandRejected(command=cmd, reason=str(exc), at_ms=now_ms)]
        rules = ", ".join(
            f"{r.name}: {','.join(f'{k}={v}' for k, v in r.match_tags)} -> {r.version}"
            for r in plan.rules
        )
        reason = (
            f"cohort routing of {cmd.model}: rules [{rules or 'none'}], "
            f"pins {'allowed' if plan.allow_pinning else 'refused'}"
        )
        self.routing.set_plan(plan)  # the model's cohort now: the publication below keeps it
        return self._routing_change(cmd, plan, DecisionRule.ROUTE_CONFIG_SET, reason, now_ms)

    def _routing_change(
        self, cmd: Command, plan: RoutingPlan, rule: DecisionRule, reason: str, now_ms: int
    ) -> list[Output]:
        """Publish ``plan`` (the model's cohort rules kept) and audit the change."""
        plan = self.routing.publish(plan)
        return [
            RoutingPublication(plan=plan, reason=reason, at_ms=now_ms),
            RoutingAudit(
                model=plan.model,
                version=plan.stable_version,
                rule=rule,
                reason=reason,
                epoch=plan.epoch,
                at_ms=now_ms,
                command_id=cmd.command_id,
                actor=cmd.issued_by,
            ),
        ]

    # -- evaluation ----------------------------------------------------------------

    def tick(self, now_ms: int) -> list[Output]:
        """Evaluate every active rollout, every QoS policy, then the replicas, at ``now_ms``."""
        out: list[Output] = []
        guard = self.guard.run  # one failing rollout or QoS key never stops the others
        for model in sorted(self.rollouts):
            active = self.rollouts[model]
            out += guard(
                partial(self._evaluate_rollout, active, now_ms),
                RecordSource.ROLLOUT_DECISION,
                now_ms,
                model=model,
                rollout_id=active.spec.rollout_id,
            )
        for key in sorted(self.qos.policies):
            out += guard(
                partial(self._evaluate_qos, key, now_ms),
                RecordSource.QOS_DECISION,
                now_ms,
                model=key.model,
                version=key.version,
            )
        out += guard(partial(self._evaluate_scaling, now_ms), RecordSource.SCALE_DECISION, now_ms)
        out += guard(partial(self._check_acks, now_ms), RecordSource.PRECISION_ACKS, now_ms)
        self.window.evict(now_ms)
        self.rollouts.expire_trackers(now_ms)
        return out

    def _evaluate_rollout(self, active: ActiveRollout, now_ms: int) -> list[Output]:
        spec = active.spec
        state = self._lift(active)
        shadowing = state.phase is Phase.SHADOWING or (
            state.phase is Phase.PAUSED and state.paused_from is Phase.SHADOWING
        )
        lane = Lane.SHADOW if shadowing else Lane.LIVE
        baseline = self.window.stats_by_version(spec.model, spec.baseline, now_ms)
        candidate = self.window.stats_by_version(spec.model, spec.candidate, now_ms, lane)
        tracker = self.rollouts.tracker(spec.model)
        agreement = None
        if shadowing and tracker is not None:
            agreement = tracker.stats(since_ms=state.phase_started_ms)
        text_tracker = self.rollouts.text_tracker(spec.model)
        text_agreement = None
        if shadowing and text_tracker is not None:
            text_agreement = text_tracker.stats(
                spec.gates.max_similarity_drop, since_ms=state.phase_started_ms
            )
        # The sequential gates' increment: the newest step whose telemetry has arrived.
        settled_ms = self.window.settled_ms(now_ms)
        signals = RolloutSignals(
            baseline_step=self.window.step_stats_by_version(spec.model, spec.baseline, settled_ms),
            candidate_step=self.window.step_stats_by_version(
                spec.model, spec.candidate, settled_ms, lane
            ),
            baseline_liveness=self.liveness.version_liveness(spec.model, spec.baseline),
            candidate_liveness=self.liveness.version_liveness(spec.model, spec.candidate),
            metrics=self._metrics_of(spec),
            outcomes=(
                self._ledger(spec, state).tally if spec.strategy is Strategy.AB_SPLIT else None
            ),
            evaluation=_evaluation_for_next_step(active, state),
            text_agreement=text_agreement,
        )
        decision = evaluate(state, spec, baseline, candidate, agreement, now_ms, signals)
        quiet = decision.kind is DecisionKind.HOLD and decision.rule == active.last_rule
        if quiet and not _significant(decision.before, decision.after):
            self.rollouts.keep(decision.after, spec, active.last_rule)
            return []
        return self._outputs_of(decision, spec)

    def _metrics_of(self, spec: RolloutSpec) -> tuple[MetricReading, ...]:
        read = self.metric_readings.get(spec.model, {})
        return tuple(read[g.name] for g in spec.gates.metrics if g.name in read)

    def _outputs_of(
        self,
        decision: Decision,
        spec: RolloutSpec,
        *,
        command_id: str = "",
        actor: str = "",
        spec_before: RolloutSpec | None = None,
    ) -> list[Output]:
        after = decision.after
        out: list[Output] = [
            RolloutAudit(
                decision=decision,
                spec=spec,
                command_id=command_id,
                actor=actor or "policy-engine",
                spec_before=spec_before,
            )
        ]
        if decision.routing is not None:
            plan = self.routing.publish(decision.routing)
            out.append(RoutingPublication(plan=plan, reason=decision.reason, at_ms=decision.at_ms))
        out.append(RolloutPublication(state=after, spec=spec))
        if after.terminal:
            self.liveness.forget(spec.model)
            self.metric_readings.pop(spec.model, None)
            self.outcomes.pop(spec.rollout_id, None)
        self.rollouts.keep(after, spec, decision.rule)
        return out

    def _lift(self, active: ActiveRollout) -> RolloutState:
        """The state at the model's current routing epoch (never below it)."""
        epoch = max(active.state.epoch, self.routing.epochs.current(active.spec.model))
        return replace(active.state, epoch=epoch)

    def _evaluate_qos(self, key: VersionKey, now_ms: int) -> list[Output]:
        out: list[Output] = []
        policy, state = self.qos.policies[key], self.qos.states[key]
        active = self.rollouts.get(key.model)
        rollout_id = ""
        # While baking, the promoted candidate is the stable version: its own QoS decides.
        baking = active is not None and active.state.phase is Phase.BAKING
        if active is not None and key.version == active.spec.candidate and not baking:
            rollout_id = active.spec.rollout_id
            base = self.qos.states.get(VersionKey(key.model, active.spec.baseline))
            if base is None:
                return out  # frozen: nothing to compare like-for-like with
            decision = qos_during_rollout(state, base, now_ms, policy)
        else:
            if active is not None:
                rollout_id = active.spec.rollout_id
            stats = self.window.stats(
                WindowKey(key.model, key.version, state.active_variant), now_ms
            )
            decision = evaluate_qos(
                state, policy, stats, now_ms, scale_hold=self._scale_hold(key, now_ms)
            )
        self.qos.decided(key, decision.after)
        changed = decision.changed or decision.kind is QosDecisionKind.SET
        if self.qos.quiet(key, decision.rule) and not changed:
            return out
        epoch = self.qos.precision.current(key)
        if decision.changed:
            epoch += 1
            self.qos.note_precision(key, decision.variant, epoch)
            out.append(PrecisionPublication(decision=decision, epoch=epoch))
            self.acks.expect(
                key,
                PendingSwitch(
                    key.model,
                    key.version,
                    decision.variant,
                    epoch,
                    now_ms,
                    decision.before.active_variant,
                ),
            )
        out.append(QosAudit(decision=decision, epoch=epoch, rollout_id=rollout_id, policy=policy))
        return out

    def _check_acks(self, now_ms: int) -> list[Output]:
        """Confirm switches the workers followed; audit ``precision_refused`` for the others.

        A refused switch puts the QoS state back on the variant actually served,
        so the controller no longer believes in a switch that did not happen.
        """
        out: list[Output] = []
        acks = self.acks
        for key in sorted(acks.pending):
            switch = acks.pending[key]
            served = acks.served_at.get(key, {})
            verdict, variant = judge_switch(switch, served, now_ms, acks.bound_ms)
            if verdict is AckVerdict.PENDING:
                continue
            acks.settle(key)
            model, version = key.model, key.version
            if verdict is AckVerdict.CONFIRMED:
                rule = DecisionRule.PRECISION_CONFIRMED
                reason = f"{model} {version} serves {variant} (switch at epoch {switch.epoch})"
            else:
                rule = DecisionRule.PRECISION_REFUSED
                reason = (
                    f"{model} {version} did not follow the switch to {switch.variant} within "
                    f"{acks.bound_ms / 1000:g} s; its workers still serve {variant}"
                )
                self.qos.served(key, variant)
            out.append(
                PrecisionAck(
                    model=model,
                    version=version,
                    variant=switch.variant,
                    served=variant,
                    rule=rule,
                    reason=reason,
                    epoch=switch.epoch,
                    at_ms=now_ms,
                )
            )
        return out

    # -- replicas --------------------------------------------------------------------

    def _scale_hold(self, key: VersionKey, now_ms: int) -> str:
        """Why the version's replicas are not settled ("" when they are, or not scaled)."""
        state = self.scaling.states.get(key)
        if state is None or not self.scaling.policy.enabled:
            return ""
        stats = self.window.stats_by_version(key.model, key.version, now_ms)
        return scale_unsettled(state, self.scaling.policy, stats.workers if stats else 0, now_ms)

    def _scale_signals(
        self, key: VersionKey, stats: WindowStats | None, now_ms: int
    ) -> ScaleSignals:
        qos_state, qos_policy = self.qos.states.get(key), self.qos.policies.get(key)
        floor_breach = breaching = False
        variant = stats.variant if stats is not None else ""
        floor_capacity: float | None = None
        if qos_state is not None and qos_policy is not None and qos_policy.enabled:
            floor_breach = _floor_breach(qos_state, qos_policy, now_ms)
            # the window's own breach too: a step down clears QoS's timers at once, while
            # the window still shows the load that made it step
            breaching = qos_state.breach_since_ms is not None or (
                stats is not None
                and breach_rule(stats, qos_policy, qos_state.active_variant, qos_state.contention)
                is not None
            )
            served_by = stats.variant if stats is not None else ""
            variant = served_by if served_by in qos_policy.ladder else qos_state.active_variant
            floor_variant = qos_policy.ladder[
                min(capped_floor(qos_policy).index, len(qos_policy.ladder) - 1)
            ]
            floor_capacity = _stack_capacity(qos_policy, qos_state, floor_variant)
        scaling = self.scaling
        gen = stats.generation if stats is not None else None
        return ScaleSignals(
            model=key.model,
            version=key.version,
            floor_breach=floor_breach,
            breaching=breaching,
            throughput_rps=stats.throughput_rps if stats is not None else 0.0,
            offered_rps=max(stats.offered_rps, stats.step_offered_rps)
            if stats is not None
            else 0.0,
            floor_capacity_rps=floor_capacity or 0.0,
            lag=stats.lag if stats is not None else 0,
            replicas=stats.workers if stats is not None else 0,
            partitions=scaling.partitions.get(key, 0),
            variant=variant,
            replica_capacity_rps=_stack_capacity(qos_policy, qos_state, variant) or 0.0,
            waiting_sequences=gen.waiting_sequences if gen is not None else 0,
            kv_cache_occupancy=gen.kv_cache_occupancy if gen is not None else 0.0,
        )

    def _evaluate_scaling(self, now_ms: int) -> list[Output]:
        """One replica decision per scaled version; outputs for the changes."""
        scaling = self.scaling
        policy = scaling.policy
        if not policy.enabled:
            return []
        live = self.window.keys()  # a SlidingWindow, not a dict
        keys = {VersionKey(k.model, k.version) for k in live}
        keys |= set(self.qos.policies) | set(scaling.states)
        out: list[Output] = []
        for key in sorted(keys):
            stats = self.window.stats_by_version(key.model, key.version, now_ms)
            signals = self._scale_signals(key, stats, now_ms)
            state = scaling.states.get(key)
            if state is None:
                state = initial_scale_state(
                    key.model,
                    key.version,
                    policy,
                    replicas=signals.replicas,
                    partitions=signals.partitions,
                )
            decision = evaluate_scale(state, policy, signals, now_ms)
            scaling.decided(key, decision.after)
            if not decision.changed:
                continue
            epoch = scaling.epochs.next(key)
            out += [
                ScalePublication(decision=decision, epoch=epoch),
                ScaleAudit(decision=decision, epoch=epoch),
            ]
        return out


def _evaluation_for_next_step(
    active: ActiveRollout, state: RolloutState
) -> EvaluationOutcome | None:
    """The rollout's finished evaluation when it is of the step an advance moves onto."""
    done = active.evaluation
    if done is None:
        return None
    target = target_step(active.spec, state.phase, state.step_index)
    return done if target == done.step_index else None


def _floor_breach(state: QosState, policy: QosPolicy, now_ms: int) -> bool:
    if state.active_variant not in policy.ladder or state.breach_since_ms is None:
        return False
    at_floor = policy.ladder.index(state.active_variant) >= capped_floor(policy).index
    return at_floor and now_ms - state.breach_since_ms >= policy.sustain_s * 1000


def _stack_capacity(policy: QosPolicy | None, state: QosState | None, variant: str) -> float | None:
    """The QoS policy's calibrated capacity of ``variant`` as it holds here, by the QoS
    state's contention (measured on its active variant)."""
    calibrated = policy.capacity_of(variant) if policy is not None else None
    if calibrated is None or policy is None:
        return None
    if state is None:
        return calibrated
    return effective_capacity(
        calibrated, state.contention, policy.capacity_of(state.active_variant)
    )
