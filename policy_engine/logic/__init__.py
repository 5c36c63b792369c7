"""Pure decision logic of the policy engine: windows, gates, rollout and QoS controllers.

Nothing here does I/O or imports Kafka, faust, gRPC, SQL or protobuf; the
adapter ``graylane.policy_engine.convert`` maps these dataclasses to the wire
contracts. Every decision is a function of (state, window stats, ``now_ms``)
and can be replayed (:mod:`graylane.policy_engine.logic.replay`).
"""

from graylane.policy_engine.logic.agreement import AgreementStats, AgreementTracker, ShadowOutput
from graylane.policy_engine.logic.qos import (
    QosDecision,
    QosDecisionKind,
    QosState,
    evaluate_qos,
    initial_qos_state,
    qos_during_rollout,
)
from graylane.policy_engine.logic.replay import diff, replay, replay_qos
from graylane.policy_engine.logic.rollout import apply_command, evaluate, pending_state, start
from graylane.policy_engine.logic.rollout_state import (
    TRANSITIONS,
    Decision,
    RolloutState,
    RoutingIntent,
)
from graylane.policy_engine.logic.routing_plan import (
    RoutingPlan,
    VersionWeight,
    plan_for,
    weights_for,
)
from graylane.policy_engine.logic.window import (
    Lane,
    SlidingWindow,
    TelemetrySample,
    WindowKey,
    WindowStats,
)
from graylane.rollouts.errors import (
    InputMismatch,
    InvalidPolicy,
    InvalidSpec,
    InvalidTransition,
    PolicyError,
    RolloutFinished,
)
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import Gates, RolloutSpec, Step, Strategy
from graylane.rollouts.vocabulary import DecisionKind, ManualCommand, Phase

__all__ = [
    "TRANSITIONS",
    "AgreementStats",
    "AgreementTracker",
    "Decision",
    "DecisionKind",
    "Gates",
    "InputMismatch",
    "InvalidPolicy",
    "InvalidSpec",
    "InvalidTransition",
    "Lane",
    "ManualCommand",
    "Phase",
    "PolicyError",
    "QosDecision",
    "QosDecisionKind",
    "QosPolicy",
    "QosState",
    "RolloutFinished",
    "RolloutSpec",
    "RolloutState",
    "RoutingIntent",
    "RoutingPlan",
    "ShadowOutput",
    "SlidingWindow",
    "Step",
    "Strategy",
    "TelemetrySample",
    "VersionWeight",
    "WindowKey",
    "WindowStats",
    "apply_command",
    "diff",
    "evaluate",
    "evaluate_qos",
    "initial_qos_state",
    "pending_state",
    "plan_for",
    "qos_during_rollout",
    "replay",
    "replay_qos",
    "start",
    "weights_for",
]
