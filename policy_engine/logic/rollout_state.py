"""The rollout lifecycle's data: allowed phase transitions, state, decisions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.facts import RolloutFacts
from graylane.policy_engine.logic.sequential import SequentialEvidence
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.errors import InvalidTransition, RolloutFinished
from graylane.rollouts.vocabulary import (
    ACTIVE_PHASES,
    TERMINAL_PHASES,
    DecisionKind,
    DecisionRule,
    ManualCommand,
    Phase,
)

__all__ = [
    "TRANSITIONS",
    "Decision",
    "RolloutState",
    "RoutingIntent",
    "StepEvidence",
    "check_transition",
]


_ENDINGS = TERMINAL_PHASES

TRANSITIONS: Mapping[Phase, frozenset[Phase]] = MappingProxyType(
    {
        Phase.PENDING: frozenset(
            {Phase.SHADOWING, Phase.PROGRESSING, Phase.AB_HOLDING, Phase.ABORTED}
        ),
        Phase.SHADOWING: frozenset({Phase.PROGRESSING, Phase.PAUSED}) | _ENDINGS,
        # PROGRESSING -> PROGRESSING is the move to the next step.
        Phase.PROGRESSING: frozenset({Phase.PROGRESSING, Phase.PAUSED}) | _ENDINGS,
        Phase.AB_HOLDING: frozenset({Phase.PAUSED}) | _ENDINGS,
        Phase.PAUSED: ACTIVE_PHASES | _ENDINGS,
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


@dataclass(frozen=True)
class StepEvidence:
    """Counts gathered during the current step (or phase) over disjoint windows.

    A window is counted once: only when it starts at or after both the step's
    start and the end of the last counted window (``through_ms``).
    """

    candidate_requests: int = 0
    candidate_errors: int = 0
    baseline_requests: int = 0
    baseline_errors: int = 0
    windows: int = 0
    through_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class RoutingIntent:
    """The traffic split a decision asks for; the router turns it into bucket ranges."""

    model: str
    rollout_id: str
    stable_version: str
    baseline: str
    candidate: str
    candidate_weight_percent: float
    shadow_version: str | None = None
    shadow_share: float = 0.0
    epoch: int = 0


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
    last_reason: str = ""
    epoch: int = 0
    updated_ms: int = 0
    evidence: StepEvidence = field(default_factory=StepEvidence)
    # The sequential gates' tests: kept across steps (the whole rollout is one test).
    sequential: SequentialEvidence = field(default_factory=SequentialEvidence)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


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
    routing: RoutingIntent | None = None
    inputs: tuple[WindowStats, ...] = ()
    agreement: AgreementStats | None = None
    command: ManualCommand | None = None
    note: str = ""
    facts: RolloutFacts | None = None
