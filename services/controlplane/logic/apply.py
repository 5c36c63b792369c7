"""What applying a Rollout document does to the rollout of its name (pure).

No rollout of that name: start it. The same spec (whatever the document's layout):
nothing. A spec that changes only what may change (see
:mod:`graylane.rollouts.revision`) of a rollout that has not finished: update it.
Anything else is refused with the reason; ``diff`` shows the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from graylane.rollouts.revision import SpecChange, refused, spec_changes
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import Phase

__all__ = ["ApplyAction", "ApplyPlan", "plan_apply"]


class ApplyAction(Enum):
    CREATE = "created"
    UNCHANGED = "unchanged"
    UPDATE = "updated"
    REFUSE = "refused"


@dataclass(frozen=True)
class ApplyPlan:
    action: ApplyAction
    changes: tuple[SpecChange, ...] = ()
    problem: str = ""


def plan_apply(live: RolloutSpec | None, phase: Phase | None, applied: RolloutSpec) -> ApplyPlan:
    """The plan for ``applied`` given the live spec and phase of its rollout (None: none)."""
    if live is None or phase is None:
        return ApplyPlan(ApplyAction.CREATE)
    changes = spec_changes(live, applied)
    if not changes:
        return ApplyPlan(ApplyAction.UNCHANGED)
    if phase.finished:
        return ApplyPlan(
            ApplyAction.REFUSE,
            changes,
            f"rollout {applied.rollout_id!r} is {phase.value} and changes no more; "
            "give the document another metadata.name to start another rollout",
        )
    problem = refused(changes)
    if problem is not None:
        return ApplyPlan(ApplyAction.REFUSE, changes, problem)
    return ApplyPlan(ApplyAction.UPDATE, changes)
