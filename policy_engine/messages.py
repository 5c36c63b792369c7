"""What :class:`~graylane.policy_engine.core.PolicyCore` takes in and gives out, as plain data.

In: a decoded operator :class:`Command`. Out: the :data:`Output` items, which
the streaming adapter turns into records (``graylane.policy_engine.wire``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from graylane.policy_engine.logic.qos import QosDecision, QosState
from graylane.policy_engine.logic.rollout import Decision, RolloutState
from graylane.policy_engine.logic.scale import ScaleDecision
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import DecisionRule, ManualCommand
from graylane.routing.table import RoutingPlan, RoutingRule

__all__ = [
    "Command",
    "CommandKind",
    "CommandRejected",
    "Output",
    "PrecisionAck",
    "PrecisionPublication",
    "QosAudit",
    "QosPolicySet",
    "RecordSkipped",
    "RecordSource",
    "RolloutAudit",
    "RolloutPublication",
    "RoutingAudit",
    "RoutingPublication",
    "ScaleAudit",
    "ScalePublication",
    "SkipReason",
]


class CommandKind(Enum):
    START = "start"
    MANUAL = "manual"
    SET_QOS_POLICY = "set_qos_policy"
    REVERT = "revert"
    SET_ROUTE_CONFIG = "set_route_config"
    UPDATE_SPEC = "update_spec"


@dataclass(frozen=True, kw_only=True)
class Command:
    """One operator intent, decoded from the commands topic."""

    kind: CommandKind
    model: str
    command_id: str = ""
    rollout_id: str = ""
    spec: RolloutSpec | None = None
    manual: ManualCommand | None = None
    qos_policy: QosPolicy | None = None
    issued_by: str = ""
    note: str = ""
    target_version: str = ""
    rules: tuple[RoutingRule, ...] = ()
    """SET_ROUTE_CONFIG: the model's cohort rules (all of them, in order)."""
    allow_pinning: bool = False
    """SET_ROUTE_CONFIG: whether requests may pin a version."""


# -- outputs ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RoutingPublication:
    """A new routing table for ``plan.model`` (key = model), cohort rules and pinning
    included."""

    plan: RoutingPlan
    reason: str
    at_ms: int


@dataclass(frozen=True, kw_only=True)
class PrecisionAck:
    """Whether a version's workers followed a precision switch (audited)."""

    model: str
    version: str
    variant: str
    served: str
    rule: DecisionRule
    reason: str
    epoch: int
    at_ms: int


@dataclass(frozen=True, kw_only=True)
class RoutingAudit:
    """A routing change taken outside a rollout's decisions (revert, cohort rules), audited."""

    model: str
    version: str
    rule: DecisionRule
    reason: str
    epoch: int
    at_ms: int
    command_id: str = ""
    actor: str = ""


@dataclass(frozen=True, kw_only=True)
class PrecisionPublication:
    """The variant a model version must run (key = model/version)."""

    decision: QosDecision
    epoch: int


@dataclass(frozen=True, kw_only=True)
class RolloutPublication:
    """The rollout's latest state (compacted, key = rollout_id)."""

    state: RolloutState
    spec: RolloutSpec


@dataclass(frozen=True, kw_only=True)
class RolloutAudit:
    decision: Decision
    spec: RolloutSpec
    command_id: str = ""
    actor: str = "policy-engine"
    spec_before: RolloutSpec | None = None
    """The spec the decision started from, when it replaced it (a spec update)."""


@dataclass(frozen=True, kw_only=True)
class QosAudit:
    decision: QosDecision
    epoch: int
    rollout_id: str = ""
    policy: QosPolicy | None = None


@dataclass(frozen=True, kw_only=True)
class QosPolicySet:
    """A QoS policy took effect (audited as a manual command)."""

    policy: QosPolicy
    before: QosState | None
    after: QosState
    at_ms: int
    command_id: str = ""
    actor: str = ""


class RecordSource(Enum):
    """Where a skipped input came from, or which decision failed."""

    ROUTING = "routing"
    PRECISION = "precision"
    ROLLOUTS = "rollouts"
    SCALE = "scale"
    COMMANDS = "commands"
    TELEMETRY = "telemetry"
    SHADOW = "shadow"
    OUTCOMES = "outcomes"
    ROLLOUT_DECISION = "rollout_decision"
    QOS_DECISION = "qos_decision"
    PRECISION_ACKS = "precision_acks"
    SCALE_DECISION = "scale_decision"


class SkipReason(Enum):
    UNDECODABLE = "undecodable"
    """The bytes are not the expected protobuf message."""
    INVALID = "invalid"
    """Decoded, but its content cannot be used (a broken spec, an impossible sample)."""
    FAILED = "failed"
    """Evaluating it raised; the rollout or QoS key keeps its state until the next tick."""


@dataclass(frozen=True, kw_only=True)
class RecordSkipped:
    """An input or a decision the engine passed over; every other one goes on.

    Always counted (``graylane_policy_skipped_records_total``); audited when
    ``audited`` (the first time per source, key and reason in a while, so a
    flood of bad records does not flood the audit topic).
    """

    source: RecordSource
    reason: SkipReason
    detail: str
    at_ms: int
    key: str = ""
    model: str = ""
    version: str = ""
    rollout_id: str = ""
    audited: bool = True


@dataclass(frozen=True, kw_only=True)
class ScalePublication:
    """The replicas a model version should run (compacted, key = model/version)."""

    decision: ScaleDecision
    epoch: int


@dataclass(frozen=True, kw_only=True)
class ScaleAudit:
    """A change of the desired replicas, audited with the request it published."""

    decision: ScaleDecision
    epoch: int


@dataclass(frozen=True, kw_only=True)
class CommandRejected:
    """A command that changed nothing, and why (audited)."""

    command: Command
    reason: str
    at_ms: int


Output = (
    RoutingPublication
    | PrecisionPublication
    | RolloutPublication
    | RolloutAudit
    | QosAudit
    | QosPolicySet
    | CommandRejected
    | RoutingAudit
    | PrecisionAck
    | ScalePublication
    | ScaleAudit
    | RecordSkipped
)
