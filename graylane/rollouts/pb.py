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

from collections.abc import Callable, Mapping

from graylane.pbmap import EnumTable, Field, PbMap
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

_PHASES = EnumTable(
    {
        Phase.PENDING: rollout_pb2.PENDING,
        Phase.SHADOWING: rollout_pb2.SHADOWING,
        Phase.PROGRESSING: rollout_pb2.PROGRESSING,
        Phase.AB_HOLDING: rollout_pb2.AB_HOLDING,
        Phase.PAUSED: rollout_pb2.PAUSED,
        Phase.BAKING: rollout_pb2.BAKING,
        Phase.PROMOTED: rollout_pb2.PROMOTED,
        Phase.ROLLED_BACK: rollout_pb2.ROLLED_BACK,
        Phase.ABORTED: rollout_pb2.ABORTED,
    },
    unset=rollout_pb2.ROLLOUT_PHASE_UNSPECIFIED,
)
_COMMANDS = EnumTable(
    {
        ManualCommand.PAUSE: rollout_pb2.COMMAND_PAUSE,
        ManualCommand.RESUME: rollout_pb2.COMMAND_RESUME,
        ManualCommand.PROMOTE: rollout_pb2.COMMAND_PROMOTE,
        ManualCommand.ROLLBACK: rollout_pb2.COMMAND_ROLLBACK,
        ManualCommand.ABORT: rollout_pb2.COMMAND_ABORT,
    }
)
_KINDS = EnumTable(
    {
        DecisionKind.STARTED: audit_pb2.DECISION_ROLLOUT_STARTED,
        DecisionKind.ADVANCE: audit_pb2.DECISION_ADVANCE,
        DecisionKind.HOLD: audit_pb2.DECISION_HOLD,
        DecisionKind.GATE_FAILED: audit_pb2.DECISION_GATE_FAILED,
        DecisionKind.ROLLBACK: audit_pb2.DECISION_ROLLBACK,
        DecisionKind.PROMOTE: audit_pb2.DECISION_PROMOTE,
        DecisionKind.MANUAL: audit_pb2.DECISION_MANUAL_COMMAND,
    }
)
_STRATEGIES = EnumTable(
    {
        Strategy.CANARY: rollout_pb2.CANARY,
        Strategy.SHADOW_THEN_CANARY: rollout_pb2.SHADOW_THEN_CANARY,
        Strategy.AB_SPLIT: rollout_pb2.AB_SPLIT,
    }
)
_GATE_MODES = EnumTable(
    {
        GateMode.FIXED: rollout_pb2.GATE_MODE_FIXED,
        GateMode.SEQUENTIAL: rollout_pb2.GATE_MODE_SEQUENTIAL,
    }
)
_DRIFT_ACTIONS = EnumTable(
    {
        DriftAction.REPORT: rollout_pb2.DRIFT_REPORT,
        DriftAction.HOLD: rollout_pb2.DRIFT_HOLD,
        DriftAction.ROLLBACK: rollout_pb2.DRIFT_ROLLBACK,
    }
)
_METRIC_COMPARISONS = EnumTable(
    {
        MetricComparison.LESS: rollout_pb2.METRIC_LESS,
        MetricComparison.LESS_EQUAL: rollout_pb2.METRIC_LESS_EQUAL,
        MetricComparison.GREATER: rollout_pb2.METRIC_GREATER,
        MetricComparison.GREATER_EQUAL: rollout_pb2.METRIC_GREATER_EQUAL,
    }
)
_WEBHOOK_FORMATS = EnumTable(
    {
        WebhookFormat.CLOUDEVENTS: rollout_pb2.WEBHOOK_CLOUDEVENTS,
        WebhookFormat.SLACK: rollout_pb2.WEBHOOK_SLACK,
    }
)
_UNMEASURED_RUNGS = EnumTable(
    {
        UnmeasuredRung.ALLOWED: rollout_pb2.UNMEASURED_RUNG_ALLOWED,
        UnmeasuredRung.REFUSED: rollout_pb2.UNMEASURED_RUNG_REFUSED,
    }
)


def phase_to_pb(phase: Phase | None) -> rollout_pb2.RolloutPhase:
    """None (no phase) is ``ROLLOUT_PHASE_UNSPECIFIED``."""
    return _PHASES.to_pb(phase)


def phase_from_pb(value: int) -> Phase | None:
    """None for ``ROLLOUT_PHASE_UNSPECIFIED`` and values this build does not know."""
    return _PHASES.from_pb(value)


def manual_command_to_pb(command: ManualCommand) -> rollout_pb2.CommandKind:
    return _COMMANDS.to_pb(command)


def manual_command_from_pb(kind: int) -> ManualCommand | None:
    """None for START, SET_QOS_POLICY and unknown kinds: they are not manual commands."""
    return _COMMANDS.from_pb(kind)


def decision_kind_to_pb(kind: DecisionKind) -> audit_pb2.DecisionKind:
    return _KINDS.to_pb(kind)


def decision_kind_from_pb(kind: int) -> DecisionKind | None:
    """None for QoS kinds (PRECISION_CHANGE), command rejections and unknown kinds."""
    return _KINDS.from_pb(kind)


def decision_rule_from_pb(rule: str) -> DecisionRule | None:
    """The rule of an audit record; None for a rule this build does not know."""
    try:
        return DecisionRule(rule)
    except ValueError:
        return None


def strategy_to_pb(strategy: Strategy) -> rollout_pb2.RolloutStrategy:
    return _STRATEGIES.to_pb(strategy)


def strategy_from_pb(value: int) -> Strategy:
    """An unspecified strategy is CANARY; :class:`InvalidSpec` for one this build does not know."""
    if value == rollout_pb2.ROLLOUT_STRATEGY_UNSPECIFIED:
        return Strategy.CANARY
    strategy = _STRATEGIES.from_pb(value)
    if strategy is None:
        raise InvalidSpec(f"rollout strategy {value} is not known to this build")
    return strategy


def drift_action_to_pb(action: DriftAction) -> rollout_pb2.DriftAction:
    return _DRIFT_ACTIONS.to_pb(action)


def drift_action_from_pb(value: int) -> DriftAction | None:
    """None for ``DRIFT_ACTION_UNSPECIFIED`` (the default); :class:`InvalidSpec` for an
    action this build does not know."""
    action = _DRIFT_ACTIONS.from_pb(value)
    if action is None and value != rollout_pb2.DRIFT_ACTION_UNSPECIFIED:
        raise InvalidSpec(f"length drift action {value} is not known to this build")
    return action


def gate_mode_to_pb(mode: GateMode) -> rollout_pb2.GateMode:
    return _GATE_MODES.to_pb(mode)


def gate_mode_from_pb(value: int) -> GateMode | None:
    """None for ``GATE_MODE_UNSPECIFIED`` (the default); :class:`InvalidSpec` for a mode
    this build does not know."""
    mode = _GATE_MODES.from_pb(value)
    if mode is None and value != rollout_pb2.GATE_MODE_UNSPECIFIED:
        raise InvalidSpec(f"gate mode {value} is not known to this build")
    return mode


# -- rollout spec -----------------------------------------------------------------


def _or(default: float) -> Callable[[float], float]:
    """A proto3 zero (unset) reads as ``default``."""
    return lambda value: value if value else default


def _or_int(default: int) -> Callable[[int], int]:
    return lambda value: int(value if value else default)


def _pause_to_pb(duration_s: float | None) -> float:
    return duration_s or 0.0


def _pause_from_pb(duration_s: float) -> float | None:
    return duration_s or None


_STEP_PAUSE = PbMap(
    StepPause,
    rollout_pb2.StepPause,
    {"duration_s": Field(to_pb=_pause_to_pb, from_pb=_pause_from_pb)},
)
"""A step's pause: an unbounded one (None) travels as 0."""

_STEP = PbMap(
    Step,
    rollout_pb2.RolloutStep,
    {
        "pause": _STEP_PAUSE.nested(absent=None),
        "evaluation": PbMap(StepEvaluation, rollout_pb2.StepEvaluation).nested(absent=None),
    },
)
"""Step fields are taken as they are."""


def metric_gate_to_pb(g: MetricGate) -> rollout_pb2.MetricGate:
    return _METRIC_GATE.to_pb(g)


def metric_gate_from_pb(pb: rollout_pb2.MetricGate) -> MetricGate:
    comparison = _METRIC_COMPARISONS.from_pb(pb.comparison)
    if comparison is None:
        raise InvalidSpec(f"metric gate {pb.name!r} has no comparison (<, <=, >, >=)")
    return _METRIC_GATE.from_pb(pb, comparison=comparison)


_METRIC_GATE = PbMap(
    MetricGate,
    rollout_pb2.MetricGate,
    {"comparison": Field(to_pb=_METRIC_COMPARISONS.to_pb, read=False)},
)

_GATE_DEFAULTS = Gates()


def _gate_mode_or_default(value: int) -> GateMode:
    return gate_mode_from_pb(value) or _GATE_DEFAULTS.mode


def _drift_action_or_default(value: int) -> DriftAction:
    return drift_action_from_pb(value) or _GATE_DEFAULTS.length_drift


_GATES = PbMap(
    Gates,
    rollout_pb2.GateSpec,
    {
        "max_p99_ratio": Field(from_pb=_or(_GATE_DEFAULTS.max_p99_ratio)),
        "max_error_rate_delta": Field(from_pb=_or(_GATE_DEFAULTS.max_error_rate_delta)),
        "alpha": Field("significance_alpha", from_pb=_or(_GATE_DEFAULTS.alpha)),
        "min_output_agreement": Field(from_pb=_or(_GATE_DEFAULTS.min_output_agreement)),
        "p99_floor_ms": Field(absent=_GATE_DEFAULTS.p99_floor_ms),
        "mode": Field(to_pb=gate_mode_to_pb, from_pb=_gate_mode_or_default),
        "max_error_ratio": Field(from_pb=_or(_GATE_DEFAULTS.max_error_ratio)),
        "error_budget": Field(absent=_GATE_DEFAULTS.error_budget),
        "max_slow_ratio": Field(from_pb=_or(_GATE_DEFAULTS.max_slow_ratio)),
        "unresponsive_s": Field(from_pb=_or(_GATE_DEFAULTS.unresponsive_s)),
        "backlog_queue_ms": Field(absent=_GATE_DEFAULTS.backlog_queue_ms),
        "token_time_tolerance": Field(absent=_GATE_DEFAULTS.token_time_tolerance),
        "length_drift": Field(to_pb=drift_action_to_pb, from_pb=_drift_action_or_default),
        "max_length_shift": Field(absent=_GATE_DEFAULTS.max_length_shift),
        "max_eos_rate_delta": Field(absent=_GATE_DEFAULTS.max_eos_rate_delta),
        "metrics": Field(
            to_pb=lambda gates: [metric_gate_to_pb(m) for m in gates],
            from_pb=lambda pbs: tuple(metric_gate_from_pb(m) for m in pbs),
        ),
        "max_similarity_drop": Field(absent=_GATE_DEFAULTS.max_similarity_drop),
    },
)
"""Gate fields whose zero is a valid value are proto3 ``optional`` (absent: the
default); in the others a zero is unset and reads as the default."""


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
    return _WEBHOOK.from_pb(pb, format=form)


_WEBHOOK = PbMap(
    WebhookTarget,
    rollout_pb2.Webhook,
    {"format": Field(to_pb=_WEBHOOK_FORMATS.to_pb, read=False)},
)

_SPEC_DEFAULTS = RolloutSpec(rollout_id="-", model="-", baseline="-a", candidate="-b")

_ROLLOUT_SPEC = PbMap(
    RolloutSpec,
    rollout_pb2.RolloutSpec,
    {
        "baseline": Field("baseline_version"),
        "candidate": Field("candidate_version"),
        "strategy": Field(to_pb=strategy_to_pb, from_pb=strategy_from_pb),
        "steps": Field(to_pb=_STEP.repeated().to_pb, read=False),
        "gates": Field(to_pb=_GATES.to_pb, read=False),
        "failures_to_rollback": Field(from_pb=_or_int(_SPEC_DEFAULTS.failures_to_rollback)),
        "shadow_share": Field(from_pb=_or(_SPEC_DEFAULTS.shadow_share)),
        "shadow_duration_s": Field(from_pb=_or(_SPEC_DEFAULTS.shadow_duration_s)),
        "ab_weight_percent": Field(from_pb=_or(_SPEC_DEFAULTS.ab_weight_percent)),
        "ab_duration_s": Field(from_pb=_or(_SPEC_DEFAULTS.ab_duration_s)),
        "created_at_ms": Field("created_at_unix_ms"),
        "webhooks": Field(
            to_pb=_WEBHOOK.repeated().to_pb,
            from_pb=lambda pbs: tuple(_webhook_from_pb(w) for w in pbs),
        ),
    },
)
"""A zero in a field whose default is not zero means *unset* and takes the default; an
empty step list takes the default steps."""


def rollout_spec_to_pb(spec: RolloutSpec) -> rollout_pb2.RolloutSpec:
    return _ROLLOUT_SPEC.to_pb(spec)


def rollout_spec_from_pb(pb: rollout_pb2.RolloutSpec) -> RolloutSpec:
    """Raises :class:`~graylane.rollouts.errors.InvalidSpec` for a broken spec."""
    gates = _GATES.from_pb(pb.gates)
    steps = tuple(_STEP.from_pb(s) for s in pb.steps)
    return _ROLLOUT_SPEC.from_pb(pb, gates=gates, steps=steps or DEFAULT_STEPS)


# -- QoS policy -------------------------------------------------------------------


def _rung_map(pairs: tuple[tuple[str, float], ...]) -> dict[str, float]:
    return dict(pairs)


def _rung_pairs(values: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(values.items()))


def _unmeasured_from_pb(value: int) -> UnmeasuredRung:
    return _UNMEASURED_RUNGS.from_pb(value) or UnmeasuredRung.ALLOWED


_POLICY_DEFAULTS = QosPolicy(model="-", version="-", slo_p99_ms=1.0, ladder=("-",))

_QOS_POLICY = PbMap(
    QosPolicy,
    rollout_pb2.QosPolicy,
    {
        "step_down_margin": Field(from_pb=_or(_POLICY_DEFAULTS.step_down_margin)),
        "step_up_ratio": Field(from_pb=_or(_POLICY_DEFAULTS.step_up_ratio)),
        "sustain_s": Field(from_pb=_or(_POLICY_DEFAULTS.sustain_s)),
        "min_dwell_s": Field(from_pb=_or(_POLICY_DEFAULTS.min_dwell_s)),
        "rung_capacity_rps": Field(to_pb=_rung_map, from_pb=_rung_pairs),
        "up_capacity_fraction": Field(from_pb=_or(_POLICY_DEFAULTS.up_capacity_fraction)),
        "max_shed_fraction": Field(from_pb=_or(_POLICY_DEFAULTS.max_shed_fraction)),
        "max_quality_drop": Field(absent=None),
        "rung_quality_drop": Field(to_pb=_rung_map, from_pb=_rung_pairs),
        "unmeasured_rung": Field(to_pb=_UNMEASURED_RUNGS.to_pb, from_pb=_unmeasured_from_pb),
    },
    local=("up_load_fraction", "ceiling_ttl_s"),
)
"""``up_load_fraction`` and ``ceiling_ttl_s`` have no field on the wire."""


def qos_policy_to_pb(p: QosPolicy) -> rollout_pb2.QosPolicy:
    """``up_load_fraction`` and ``ceiling_ttl_s`` have no field on the wire."""
    return _QOS_POLICY.to_pb(p)


def qos_policy_from_pb(pb: rollout_pb2.QosPolicy) -> QosPolicy:
    """Raises :class:`~graylane.rollouts.errors.InvalidPolicy` for a broken policy."""
    return _QOS_POLICY.from_pb(pb)
