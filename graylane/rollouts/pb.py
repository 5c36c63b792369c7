"""Protobuf (``graylane.v1``) <-> the rollout vocabulary, specs and QoS policies: one mapping each.

proto3 cannot tell an unset scalar from zero. In specs and policies a zero in a
field whose dataclass default is non-zero means *unset* and takes the default
(an empty step list takes the default steps, an unspecified strategy is
CANARY, an unspecified gate mode the default mode). Gate fields for which zero
is a valid value (``error_budget``, ``backlog_queue_ms``, ``p99_floor_ms``)
are proto3 ``optional``: absent means the default. Step fields are taken as
they are. Fields the wire has no room for are lost on the way out: the
policy's ``up_load_fraction`` / ``ceiling_ttl_s``.

Enum values this build does not know (a newer writer's) never raise where a
value can be left out (a phase, a command kind, a decision kind map to None),
but a spec with an unknown strategy or gate mode is refused
(:class:`~graylane.rollouts.errors.InvalidSpec`): running it as another
strategy or under other gates would not be the rollout its writer asked for.
"""

from __future__ import annotations

from graylane.rollouts.errors import InvalidSpec
from graylane.rollouts.qos_policy import QosPolicy, UnmeasuredRung
from graylane.rollouts.spec import (
    DEFAULT_STEPS,
    DriftAction,
    GateMode,
    Gates,
    MetricComparison,
    MetricGate,
    RolloutSpec,
    Step,
    StepEvaluation,
    StepPause,
    Strategy,
    WebhookFormat,
    WebhookTarget,
)
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, ManualCommand, Phase
from graylane.v1 import audit_pb2, rollout_pb2

__all__ = [
    "decision_kind_from_pb",
    "decision_kind_to_pb",
    "decision_rule_from_pb",
    "drift_action_from_pb",
    "drift_action_to_pb",
    "gate_mode_from_pb",
    "gate_mode_to_pb",
    "manual_command_from_pb",
    "manual_command_to_pb",
    "metric_gate_from_pb",
    "metric_gate_to_pb",
    "phase_from_pb",
    "phase_to_pb",
    "qos_policy_from_pb",
    "qos_policy_to_pb",
    "rollout_spec_from_pb",
    "rollout_spec_to_pb",
    "strategy_from_pb",
    "strategy_to_pb",
    "webhooks_from_pb",
]

# -- enums ------------------------------------------------------------------------

_PHASE_TO_PB = {
    Phase.PENDING: rollout_pb2.PENDING,
    Phase.SHADOWING: rollout_pb2.SHADOWING,
    Phase.PROGRESSING: rollout_pb2.PROGRESSING,
    Phase.AB_HOLDING: rollout_pb2.AB_HOLDING,
    Phase.PAUSED: rollout_pb2.PAUSED,
    Phase.BAKING: rollout_pb2.BAKING,
    Phase.PROMOTED: rollout_pb2.PROMOTED,
    Phase.ROLLED_BACK: rollout_pb2.ROLLED_BACK,
    Phase.ABORTED: rollout_pb2.ABORTED,
}
_PHASE_FROM_PB: dict[int, Phase] = {v: k for k, v in _PHASE_TO_PB.items()}

_COMMAND_TO_PB = {
    ManualCommand.PAUSE: rollout_pb2.COMMAND_PAUSE,
    ManualCommand.RESUME: rollout_pb2.COMMAND_RESUME,
    ManualCommand.PROMOTE: rollout_pb2.COMMAND_PROMOTE,
    ManualCommand.ROLLBACK: rollout_pb2.COMMAND_ROLLBACK,
    ManualCommand.ABORT: rollout_pb2.COMMAND_ABORT,
}
_COMMAND_FROM_PB: dict[int, ManualCommand] = {v: k for k, v in _COMMAND_TO_PB.items()}

_KIND_TO_PB = {
    DecisionKind.STARTED: audit_pb2.DECISION_ROLLOUT_STARTED,
    DecisionKind.ADVANCE: audit_pb2.DECISION_ADVANCE,
    DecisionKind.HOLD: audit_pb2.DECISION_HOLD,
    DecisionKind.GATE_FAILED: audit_pb2.DECISION_GATE_FAILED,
    DecisionKind.ROLLBACK: audit_pb2.DECISION_ROLLBACK,
    DecisionKind.PROMOTE: audit_pb2.DECISION_PROMOTE,
    DecisionKind.MANUAL: audit_pb2.DECISION_MANUAL_COMMAND,
}
_KIND_FROM_PB: dict[int, DecisionKind] = {v: k for k, v in _KIND_TO_PB.items()}

_STRATEGY_TO_PB = {
    Strategy.CANARY: rollout_pb2.CANARY,
    Strategy.SHADOW_THEN_CANARY: rollout_pb2.SHADOW_THEN_CANARY,
    Strategy.AB_SPLIT: rollout_pb2.AB_SPLIT,
}
_STRATEGY_FROM_PB: dict[int, Strategy] = {v: k for k, v in _STRATEGY_TO_PB.items()}

_GATE_MODE_TO_PB = {
    GateMode.FIXED: rollout_pb2.GATE_MODE_FIXED,
    GateMode.SEQUENTIAL: rollout_pb2.GATE_MODE_SEQUENTIAL,
}
_GATE_MODE_FROM_PB: dict[int, GateMode] = {v: k for k, v in _GATE_MODE_TO_PB.items()}
_DRIFT_TO_PB = {
    DriftAction.REPORT: rollout_pb2.DRIFT_REPORT,
    DriftAction.HOLD: rollout_pb2.DRIFT_HOLD,
    DriftAction.ROLLBACK: rollout_pb2.DRIFT_ROLLBACK,
}
_DRIFT_FROM_PB: dict[int, DriftAction] = {v: k for k, v in _DRIFT_TO_PB.items()}


def phase_to_pb(phase: Phase | None) -> rollout_pb2.RolloutPhase:
    """None (no phase) is ``ROLLOUT_PHASE_UNSPECIFIED``."""
    return rollout_pb2.ROLLOUT_PHASE_UNSPECIFIED if phase is None else _PHASE_TO_PB[phase]


def phase_from_pb(value: int) -> Phase | None:
    """None for ``ROLLOUT_PHASE_UNSPECIFIED`` and values this build does not know."""
    return _PHASE_FROM_PB.get(value)


def manual_command_to_pb(command: ManualCommand) -> rollout_pb2.CommandKind:
    return _COMMAND_TO_PB[command]


def manual_command_from_pb(kind: int) -> ManualCommand | None:
    """None for START, SET_QOS_POLICY and unknown kinds: they are not manual commands."""
    return _COMMAND_FROM_PB.get(kind)


def decision_kind_to_pb(kind: DecisionKind) -> audit_pb2.DecisionKind:
    return _KIND_TO_PB[kind]


def decision_kind_from_pb(kind: int) -> DecisionKind | None:
    """None for QoS kinds (PRECISION_CHANGE), command rejections and unknown kinds."""
    return _KIND_FROM_PB.get(kind)


def decision_rule_from_pb(rule: str) -> DecisionRule | None:
    """The rule of an audit record; None for a rule this build does not know."""
    try:
        return DecisionRule(rule)
    except ValueError:
        return None


def strategy_to_pb(strategy: Strategy) -> rollout_pb2.RolloutStrategy:
    return _STRATEGY_TO_PB[strategy]


def strategy_from_pb(value: int) -> Strategy:
    """An unspecified strategy is CANARY; :class:`InvalidSpec` for one this build does not know."""
    if value == rollout_pb2.ROLLOUT_STRATEGY_UNSPECIFIED:
        return Strategy.CANARY
    strategy = _STRATEGY_FROM_PB.get(value)
    if strategy is None:
        raise InvalidSpec(f"rollout strategy {value} is not known to this build")
    return strategy


def drift_action_to_pb(action: DriftAction) -> rollout_pb2.DriftAction:
    return _DRIFT_TO_PB[action]


def drift_action_from_pb(value: int) -> DriftAction | None:
    """None for ``DRIFT_ACTION_UNSPECIFIED`` (the default); :class:`InvalidSpec` for an
    action this build does not know."""
    if value == rollout_pb2.DRIFT_ACTION_UNSPECIFIED:
        return None
    action = _DRIFT_FROM_PB.get(value)
    if action is None:
        raise InvalidSpec(f"length drift action {value} is not known to this build")
    return action


def gate_mode_to_pb(mode: GateMode) -> rollout_pb2.GateMode:
    return _GATE_MODE_TO_PB[mode]


def gate_mode_from_pb(value: int) -> GateMode | None:
    """None for ``GATE_MODE_UNSPECIFIED`` (the default); :class:`InvalidSpec` for a mode
    this build does not know."""
    if value == rollout_pb2.GATE_MODE_UNSPECIFIED:
        return None
    mode = _GATE_MODE_FROM_PB.get(value)
    if mode is None:
        raise InvalidSpec(f"gate mode {value} is not known to this build")
    return mode


# -- rollout spec -----------------------------------------------------------------


def _or(value: float, default: float) -> float:
    return value if value else default


def _step_evaluation_to_pb(ev: StepEvaluation | None) -> rollout_pb2.StepEvaluation | None:
    if ev is None:
        return None
    return rollout_pb2.StepEvaluation(
        set_path=ev.set_path, max_drop_vs_stable=ev.max_drop_vs_stable, set_sha256=ev.set_sha256
    )


def _step_evaluation_from_pb(step: rollout_pb2.RolloutStep) -> StepEvaluation | None:
    if not step.HasField("evaluation"):
        return None
    ev = step.evaluation
    return StepEvaluation(ev.set_path, ev.max_drop_vs_stable, ev.set_sha256)


def rollout_spec_to_pb(spec: RolloutSpec) -> rollout_pb2.RolloutSpec:
    g = spec.gates
    return rollout_pb2.RolloutSpec(
        rollout_id=spec.rollout_id,
        model=spec.model,
        baseline_version=spec.baseline,
        candidate_version=spec.candidate,
        strategy=strategy_to_pb(spec.strategy),
        steps=[
            rollout_pb2.RolloutStep(
                weight_percent=s.weight_percent,
                min_samples=s.min_samples,
                min_dwell_s=s.min_dwell_s,
                pause=None
                if s.pause is None
                else rollout_pb2.StepPause(duration_s=s.pause.duration_s or 0.0),
                evaluation=_step_evaluation_to_pb(s.evaluation),
            )
            for s in spec.steps
        ],
        gates=rollout_pb2.GateSpec(
            max_p99_ratio=g.max_p99_ratio,
            max_error_rate_delta=g.max_error_rate_delta,
            significance_alpha=g.alpha,
            min_output_agreement=g.min_output_agreement,
            mode=gate_mode_to_pb(g.mode),
            max_error_ratio=g.max_error_ratio,
            error_budget=g.error_budget,
            max_slow_ratio=g.max_slow_ratio,
            unresponsive_s=g.unresponsive_s,
            backlog_queue_ms=g.backlog_queue_ms,
            p99_floor_ms=g.p99_floor_ms,
            length_drift=drift_action_to_pb(g.length_drift),
            max_length_shift=g.max_length_shift,
            max_eos_rate_delta=g.max_eos_rate_delta,
            token_time_tolerance=g.token_time_tolerance,
            metrics=[metric_gate_to_pb(m) for m in g.metrics],
            max_similarity_drop=g.max_similarity_drop,
        ),
        failures_to_rollback=spec.failures_to_rollback,
        shadow_share=spec.shadow_share,
        shadow_duration_s=spec.shadow_duration_s,
        ab_weight_percent=spec.ab_weight_percent,
        ab_duration_s=spec.ab_duration_s,
        created_at_unix_ms=spec.created_at_ms,
        created_by=spec.created_by,
        document_digest=spec.document_digest,
        webhooks=[
            rollout_pb2.Webhook(
                url=w.url, format=_WEBHOOK_FORMATS[w.format], secret_file=w.secret_file
            )
            for w in spec.webhooks
        ],
        bake_s=spec.bake_s,
    )


_WEBHOOK_FORMATS: dict[WebhookFormat, rollout_pb2.WebhookFormat] = {
    WebhookFormat.CLOUDEVENTS: rollout_pb2.WEBHOOK_CLOUDEVENTS,
    WebhookFormat.SLACK: rollout_pb2.WEBHOOK_SLACK,
}


def webhooks_from_pb(pb: rollout_pb2.RolloutSpec) -> tuple[WebhookTarget, ...]:
    """The spec's webhooks alone (without validating the rest of the spec)."""
    return tuple(_webhook_from_pb(w) for w in pb.webhooks)


def _webhook_from_pb(pb: rollout_pb2.Webhook) -> WebhookTarget:
    if pb.format == rollout_pb2.WEBHOOK_SLACK:
        form = WebhookFormat.SLACK
    elif pb.format in (rollout_pb2.WEBHOOK_CLOUDEVENTS, rollout_pb2.WEBHOOK_FORMAT_UNSPECIFIED):
        form = WebhookFormat.CLOUDEVENTS
    else:
        raise InvalidSpec(f"webhook {pb.url!r} has format {pb.format}, unknown to this build")
    return WebhookTarget(url=pb.url, format=form, secret_file=pb.secret_file)


def _step_from_pb(pb: rollout_pb2.RolloutStep) -> Step:
    pause = None
    if pb.HasField("pause"):
        pause = StepPause(pb.pause.duration_s or None)
    return Step(
        pb.weight_percent,
        pb.min_samples,
        pb.min_dwell_s,
        pause,
        evaluation=_step_evaluation_from_pb(pb),
    )


def rollout_spec_from_pb(pb: rollout_pb2.RolloutSpec) -> RolloutSpec:
    """Raises :class:`~graylane.rollouts.errors.InvalidSpec` for a broken spec."""
    d = RolloutSpec(rollout_id="-", model="-", baseline="-a", candidate="-b")
    gates = _gates_from_pb(pb.gates)
    steps = tuple(_step_from_pb(s) for s in pb.steps)
    return RolloutSpec(
        rollout_id=pb.rollout_id,
        model=pb.model,
        baseline=pb.baseline_version,
        candidate=pb.candidate_version,
        strategy=strategy_from_pb(pb.strategy),
        steps=steps or DEFAULT_STEPS,
        gates=gates,
        failures_to_rollback=int(_or(pb.failures_to_rollback, d.failures_to_rollback)),
        shadow_share=_or(pb.shadow_share, d.shadow_share),
        shadow_duration_s=_or(pb.shadow_duration_s, d.shadow_duration_s),
        ab_weight_percent=_or(pb.ab_weight_percent, d.ab_weight_percent),
        ab_duration_s=_or(pb.ab_duration_s, d.ab_duration_s),
        created_at_ms=pb.created_at_unix_ms,
        created_by=pb.created_by,
        document_digest=pb.document_digest,
        webhooks=tuple(_webhook_from_pb(w) for w in pb.webhooks),
        bake_s=pb.bake_s,
    )


def _gates_from_pb(pb: rollout_pb2.GateSpec) -> Gates:
    d = Gates()
    return Gates(
        max_p99_ratio=_or(pb.max_p99_ratio, d.max_p99_ratio),
        max_error_rate_delta=_or(pb.max_error_rate_delta, d.max_error_rate_delta),
        alpha=_or(pb.significance_alpha, d.alpha),
        min_output_agreement=_or(pb.min_output_agreement, d.min_output_agreement),
        p99_floor_ms=pb.p99_floor_ms if pb.HasField("p99_floor_ms") else d.p99_floor_ms,
        mode=gate_mode_from_pb(pb.mode) or d.mode,
        max_error_ratio=_or(pb.max_error_ratio, d.max_error_ratio),
        error_budget=pb.error_budget if pb.HasField("error_budget") else d.error_budget,
        max_slow_ratio=_or(pb.max_slow_ratio, d.max_slow_ratio),
        unresponsive_s=_or(pb.unresponsive_s, d.unresponsive_s),
        backlog_queue_ms=(
            pb.backlog_queue_ms if pb.HasField("backlog_queue_ms") else d.backlog_queue_ms
        ),
        length_drift=drift_action_from_pb(pb.length_drift) or d.length_drift,
        max_length_shift=(
            pb.max_length_shift if pb.HasField("max_length_shift") else d.max_length_shift
        ),
        max_eos_rate_delta=(
            pb.max_eos_rate_delta if pb.HasField("max_eos_rate_delta") else d.max_eos_rate_delta
        ),
        token_time_tolerance=(
            pb.token_time_tolerance
            if pb.HasField("token_time_tolerance")
            else d.token_time_tolerance
        ),
        metrics=tuple(metric_gate_from_pb(m) for m in pb.metrics),
        max_similarity_drop=(
            pb.max_similarity_drop if pb.HasField("max_similarity_drop") else d.max_similarity_drop
        ),
    )


_METRIC_COMPARISON_TO_PB = {
    MetricComparison.LESS: rollout_pb2.METRIC_LESS,
    MetricComparison.LESS_EQUAL: rollout_pb2.METRIC_LESS_EQUAL,
    MetricComparison.GREATER: rollout_pb2.METRIC_GREATER,
    MetricComparison.GREATER_EQUAL: rollout_pb2.METRIC_GREATER_EQUAL,
}
_COMPARISON_FROM_PB = {v: k for k, v in _METRIC_COMPARISON_TO_PB.items()}


def metric_gate_to_pb(g: MetricGate) -> rollout_pb2.MetricGate:
    return rollout_pb2.MetricGate(
        name=g.name,
        query=g.query,
        comparison=_METRIC_COMPARISON_TO_PB[g.comparison],
        threshold=g.threshold,
        pause_after_inconclusive_s=g.pause_after_inconclusive_s,
    )


def metric_gate_from_pb(pb: rollout_pb2.MetricGate) -> MetricGate:
    comparison = _COMPARISON_FROM_PB.get(pb.comparison)
    if comparison is None:
        raise InvalidSpec(f"metric gate {pb.name!r} has no comparison (<, <=, >, >=)")
    return MetricGate(
        name=pb.name,
        query=pb.query,
        comparison=comparison,
        threshold=pb.threshold,
        pause_after_inconclusive_s=pb.pause_after_inconclusive_s,
    )


# -- QoS policy -------------------------------------------------------------------


def qos_policy_to_pb(p: QosPolicy) -> rollout_pb2.QosPolicy:
    """``up_load_fraction`` and ``ceiling_ttl_s`` have no field on the wire."""
    return rollout_pb2.QosPolicy(
        model=p.model,
        version=p.version,
        slo_p99_ms=p.slo_p99_ms,
        ladder=list(p.ladder),
        quality_floor=p.quality_floor,
        step_down_margin=p.step_down_margin,
        step_up_ratio=p.step_up_ratio,
        sustain_s=p.sustain_s,
        min_dwell_s=p.min_dwell_s,
        max_queue_wait_ms=p.max_queue_wait_ms,
        enabled=p.enabled,
        rung_capacity_rps=dict(p.rung_capacity_rps),
        up_capacity_fraction=p.up_capacity_fraction,
        max_shed_fraction=p.max_shed_fraction,
        slo_ttft_p99_ms=p.slo_ttft_p99_ms,
        slo_tpot_p99_ms=p.slo_tpot_p99_ms,
        max_waiting_sequences=p.max_waiting_sequences,
        max_kv_cache_occupancy=p.max_kv_cache_occupancy,
        max_quality_drop=p.max_quality_drop,
        rung_quality_drop=dict(p.rung_quality_drop),
        unmeasured_rung=_UNMEASURED_TO_PB[p.unmeasured_rung],
    )


def qos_policy_from_pb(pb: rollout_pb2.QosPolicy) -> QosPolicy:
    """Raises :class:`~graylane.rollouts.errors.InvalidPolicy` for a broken policy."""
    d = QosPolicy(model="-", version="-", slo_p99_ms=1.0, ladder=("-",))
    return QosPolicy(
        model=pb.model,
        version=pb.version,
        slo_p99_ms=pb.slo_p99_ms,
        ladder=tuple(pb.ladder),
        quality_floor=pb.quality_floor,
        step_down_margin=_or(pb.step_down_margin, d.step_down_margin),
        step_up_ratio=_or(pb.step_up_ratio, d.step_up_ratio),
        max_queue_wait_ms=pb.max_queue_wait_ms,
        sustain_s=_or(pb.sustain_s, d.sustain_s),
        min_dwell_s=_or(pb.min_dwell_s, d.min_dwell_s),
        enabled=pb.enabled,
        rung_capacity_rps=tuple(sorted(pb.rung_capacity_rps.items())),
        up_capacity_fraction=_or(pb.up_capacity_fraction, d.up_capacity_fraction),
        max_shed_fraction=_or(pb.max_shed_fraction, d.max_shed_fraction),
        slo_ttft_p99_ms=pb.slo_ttft_p99_ms,
        slo_tpot_p99_ms=pb.slo_tpot_p99_ms,
        max_waiting_sequences=pb.max_waiting_sequences,
        max_kv_cache_occupancy=pb.max_kv_cache_occupancy,
        max_quality_drop=pb.max_quality_drop if pb.HasField("max_quality_drop") else None,
        rung_quality_drop=tuple(sorted(pb.rung_quality_drop.items())),
        unmeasured_rung=_UNMEASURED_FROM_PB.get(pb.unmeasured_rung, UnmeasuredRung.ALLOWED),
    )


_UNMEASURED_TO_PB = {
    UnmeasuredRung.ALLOWED: rollout_pb2.UNMEASURED_RUNG_ALLOWED,
    UnmeasuredRung.REFUSED: rollout_pb2.UNMEASURED_RUNG_REFUSED,
}
_UNMEASURED_FROM_PB = {v: k for k, v in _UNMEASURED_TO_PB.items()}
