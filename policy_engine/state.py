"""The state the policy engine owns, keyed by typed keys, changed only through its methods.

Room: ``state.py`` of the policy engine. Each owner holds one kind of state the engine
alone writes: the active and finished rollouts per model (:class:`Rollouts`), each
model's published routing plan (cohort rules included) and its epochs (:class:`Routing`),
QoS policies and states per version (:class:`Qos`), the precision switches waiting for
workers to follow (:class:`PrecisionAcks`) and the replica states (:class:`Scaling`).
Keys are :class:`VersionKey` (model, version) or a model name; epochs rise per key
(:class:`Epochs`). No I/O: :class:`~graylane.policy_engine.core.PolicyCore` drives them;
it may import ``logic/`` and the library's rollout and routing types, nothing of the
service's adapters.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from graylane.policy_engine.logic.agreement import AgreementTracker
from graylane.policy_engine.logic.precision_ack import DEFAULT_ACK_BOUND_MS, PendingSwitch
from graylane.policy_engine.logic.qos import QosState, initial_qos_state
from graylane.policy_engine.logic.rollout import RolloutState
from graylane.policy_engine.logic.scale import ScalePolicy, ScaleState
from graylane.policy_engine.logic.step_evaluation import EvaluationOutcome
from graylane.policy_engine.logic.text_agreement import TextAgreementTracker
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import DecisionRule
from graylane.routing.table import RoutingPlan

__all__ = [
    "ActiveRollout",
    "Epochs",
    "PrecisionAcks",
    "Qos",
    "Rollouts",
    "Routing",
    "Scaling",
    "VersionKey",
]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, order=True)
class VersionKey:
    """One version of one model: the key of per-version state and records."""

    model: str
    version: str

    def __str__(self) -> str:
        return f"{self.model}/{self.version}"


class Epochs(Generic[K]):
    """Epochs of one kind of published record, per key: monotonic, never reused."""

    def __init__(self) -> None:
        self._highest: dict[K, int] = {}

    def current(self, key: K) -> int:
        """The highest epoch seen for ``key`` (0 before any)."""
        return self._highest.get(key, 0)

    def note(self, key: K, epoch: int) -> bool:
        """Take an epoch written (here or by an earlier run); whether it is the newest."""
        newest = epoch >= self.current(key)
        if newest:
            self._highest[key] = epoch
        return newest

    def next(self, key: K) -> int:
        """The epoch of the next record for ``key`` (and note it as written)."""
        epoch = self.current(key) + 1
        self._highest[key] = epoch
        return epoch

    def __getitem__(self, key: K) -> int:
        return self._highest[key]

    def __contains__(self, key: object) -> bool:
        return key in self._highest


@dataclass
class ActiveRollout:
    """A running rollout: its state, its spec, and the rule of its last decision."""

    state: RolloutState
    spec: RolloutSpec
    last_rule: DecisionRule | None = None
    evaluation: EvaluationOutcome | None = None
    """The newest finished evaluation of a step (kept in memory: a restarted engine
    evaluates again)."""


class Rollouts(Mapping[str, ActiveRollout]):
    """The active rollout per model (read as a mapping), the finished ones by id."""

    def __init__(self) -> None:
        self._active: dict[str, ActiveRollout] = {}
        self.finished: dict[str, RolloutState] = {}  # by rollout id
        self._trackers: dict[str, AgreementTracker] = {}  # by model
        self._text_trackers: dict[str, TextAgreementTracker] = {}  # by model

    def __getitem__(self, model: str) -> ActiveRollout:
        return self._active[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._active)

    def __len__(self) -> int:
        return len(self._active)

    def seen(self, rollout_id: str) -> bool:
        """Whether a rollout with this id ran or runs (a START for it is a redelivery)."""
        return rollout_id in self.finished or any(
            a.spec.rollout_id == rollout_id for a in self._active.values()
        )

    def keep(self, state: RolloutState, spec: RolloutSpec, rule: DecisionRule | None) -> None:
        """Record the rollout's newest state: active, or finished when terminal."""
        if state.terminal:
            self._active.pop(spec.model, None)
            self._trackers.pop(spec.model, None)
            self._text_trackers.pop(spec.model, None)
            self.finished[state.rollout_id] = state
            return
        previous = self._active.get(spec.model)
        evaluation = (
            previous.evaluation
            if previous is not None and previous.spec.rollout_id == spec.rollout_id
            else None
        )
        self._active[spec.model] = ActiveRollout(state, spec, rule, evaluation)
        if spec.model not in self._trackers:
            self._trackers[spec.model] = AgreementTracker(spec.baseline, spec.candidate)
            self._text_trackers[spec.model] = TextAgreementTracker(spec.baseline, spec.candidate)

    def note_evaluation(self, outcome: EvaluationOutcome) -> bool:
        """Keep a finished evaluation for its rollout; False when that rollout is not active."""
        for active in self._active.values():
            if active.spec.rollout_id == outcome.rollout_id:
                active.evaluation = outcome
                return True
        return False

    def note_finished(self, state: RolloutState) -> None:
        """A rollout that ended without being active here (refused, or read back)."""
        self.finished[state.rollout_id] = state

    def tracker(self, model: str) -> AgreementTracker | None:
        return self._trackers.get(model)

    def text_tracker(self, model: str) -> TextAgreementTracker | None:
        return self._text_trackers.get(model)

    def expire_trackers(self, now_ms: int) -> None:
        for tracker in self._trackers.values():
            tracker.expire(now_ms)
        for text in self._text_trackers.values():
            text.expire(now_ms)

    def versions(self) -> list[VersionKey]:
        """Baseline and candidate of every active rollout, sorted."""
        return sorted(
            VersionKey(m, v)
            for m, a in self._active.items()
            for v in (a.spec.baseline, a.spec.candidate)
        )


@dataclass
class Routing:
    """Each model's last published plan (its split and its cohort rules) and the routing
    epochs.

    A plan gets here in one of two ways. :meth:`publish` takes a new split (a rollout's
    step, promotion, rollback, a revert) and keeps the model's cohort rules and pinning,
    whatever the split's builder put there; :meth:`set_plan` takes a plan as it is, the
    cohort included (a change of the cohort routing, or a table read back at restore).
    """

    epochs: Epochs[str] = field(default_factory=Epochs)
    _plans: dict[str, RoutingPlan] = field(default_factory=dict)

    def plan(self, model: str) -> RoutingPlan | None:
        return self._plans.get(model)

    def publish(self, plan: RoutingPlan) -> RoutingPlan:
        """``plan``'s split with the model's cohort rules and pinning (those of its last
        plan; none before it has one), noted as the model's table: the plan to publish."""
        last = self._plans.get(plan.model)
        if last is None:
            kept = plan.with_cohort((), allow_pinning=False)
        else:
            kept = plan.with_cohort(last.rules, allow_pinning=last.allow_pinning)
        self.set_plan(kept)
        return kept

    def set_plan(self, plan: RoutingPlan) -> None:
        """``plan``, cohort rules and pinning included, is the model's table now (a new
        cohort routing published, or read back at restore)."""
        self.epochs.note(plan.model, plan.epoch)
        self._plans[plan.model] = plan


@dataclass
class Qos:
    """QoS policies and states per version, and the variant each version runs."""

    policies: dict[VersionKey, QosPolicy] = field(default_factory=dict)
    states: dict[VersionKey, QosState] = field(default_factory=dict)
    precision: Epochs[VersionKey] = field(default_factory=Epochs)
    _last_rule: dict[VersionKey, DecisionRule] = field(default_factory=dict)
    _variants: dict[VersionKey, str] = field(default_factory=dict)

    def note_precision(self, key: VersionKey, variant: str, epoch: int) -> None:
        """A precision command written: the newest epoch says what the version runs."""
        if self.precision.note(key, epoch):
            self._variants[key] = variant

    def set_policy(self, policy: QosPolicy) -> QosState:
        """Take ``policy``; a version new to QoS starts on the variant it runs."""
        key = VersionKey(policy.model, policy.version)
        self.policies[key] = policy
        state = self.states.get(key)
        if state is None:
            state = initial_qos_state(policy)
            running = self._variants.get(key)
            if running is not None:
                state = replace(state, active_variant=running)
            self.states[key] = state
        return state

    def quiet(self, key: VersionKey, rule: DecisionRule) -> bool:
        """Whether a decision with ``rule`` repeats the last one (noting it if not)."""
        if rule == self._last_rule.get(key):
            return True
        self._last_rule[key] = rule
        return False

    def decided(self, key: VersionKey, state: QosState) -> None:
        """The state a QoS decision left ``key`` in."""
        self.states[key] = state

    def served(self, key: VersionKey, variant: str) -> None:
        """Workers were seen serving ``variant`` after a refused switch."""
        state = self.states.get(key)
        if state is not None:
            self.states[key] = replace(state, active_variant=variant)


@dataclass
class PrecisionAcks:
    """The newest batch per variant of each version, and the switches not yet followed."""

    bound_ms: int = DEFAULT_ACK_BOUND_MS
    served_at: dict[VersionKey, dict[str, int]] = field(default_factory=dict)
    pending: dict[VersionKey, PendingSwitch] = field(default_factory=dict)

    def on_batch(self, key: VersionKey, variant: str, completed_ms: int) -> None:
        served = self.served_at.setdefault(key, {})
        served[variant] = max(served.get(variant, 0), completed_ms)

    def expect(self, key: VersionKey, switch: PendingSwitch) -> None:
        self.pending[key] = switch

    def settle(self, key: VersionKey) -> PendingSwitch:
        """The switch of ``key`` was judged (followed or refused): no longer pending."""
        return self.pending.pop(key)


@dataclass
class Scaling:
    """Replica policy and states per version; off unless the policy allows more than one."""

    policy: ScalePolicy = field(default_factory=ScalePolicy)
    states: dict[VersionKey, ScaleState] = field(default_factory=dict)
    epochs: Epochs[VersionKey] = field(default_factory=Epochs)
    partitions: dict[VersionKey, int] = field(default_factory=dict)
    """Of each version topic, when known (unknown = 0: bounded by max_replicas only)."""

    def decided(self, key: VersionKey, state: ScaleState) -> None:
        """The state a replica decision left ``key`` in."""
        self.states[key] = state

    def note_partitions(self, counts: Mapping[VersionKey, int]) -> None:
        """Partition counts of version topics (they bound the replicas)."""
        self.partitions.update(counts)

    def restore(self, key: VersionKey, desired: int, epoch: int, at_ms: int) -> None:
        """Take a request read back from the scale topic (the newest epoch wins)."""
        if not self.epochs.note(key, epoch):
            return
        self.states[key] = ScaleState(
            model=key.model, version=key.version, desired=desired, last_change_ms=at_ms
        )
