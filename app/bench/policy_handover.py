"""A policy-engine handover after a kill -9, judged from the audit alone.

Every rollout decision on the audit topic names the instance and the generation that
made it (``decided_by``). :class:`DecisionLedger` keeps them per model in the topic's
order; :func:`judge_takeover` says what the survivors made of a killed instance's
models: none lost, none resumed at another step than the one the killed instance left
it at, no (model, generation) decided by two instances, no rollout rolled back twice,
and regressions injected after the takeover still detected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graylane import serde
from graylane.kafka.seam import Record
from graylane.v1 import audit_pb2

__all__ = ["Decided", "DecisionLedger", "Takeover", "instance_of", "judge_takeover"]


@dataclass(frozen=True)
class Takeover:
    """A sharded run's kill -9 of one instance, judged from the audit."""

    models_moved: int
    """Models the killed instance decided for."""
    takeover_s: float
    """From the kill to the last of its models decided by a survivor."""
    lost: int
    """Moved models no survivor decided for by the end."""
    step_changed: int
    """Moved models whose first decision by a survivor started from another step than
    the killed instance's last decision left them at."""
    double_deciders: int
    """(model, generation) pairs decided by more than one instance: two instances
    deciding for one model at once."""
    duplicate_rollbacks: int
    """Rollouts rolled back more than once."""
    regressions_after: tuple[float, ...]
    """Detection of regressions injected into moved models after the takeover (ms)."""
    missed_after: int

    @property
    def clean(self) -> bool:
        return not (
            self.lost
            or self.step_changed
            or self.double_deciders
            or self.duplicate_rollbacks
            or self.missed_after
        )

    def row(self) -> dict[str, object]:
        return {
            "models_moved": self.models_moved,
            "takeover_s": round(self.takeover_s, 1),
            "lost": self.lost,
            "step_changed": self.step_changed,
            "double_deciders": self.double_deciders,
            "duplicate_rollbacks": self.duplicate_rollbacks,
            "detection_ms_after": [round(d) for d in self.regressions_after],
            "missed_after": self.missed_after,
            "clean": self.clean,
        }


@dataclass(frozen=True)
class Decided:
    """One rollout decision as the audit records it."""

    instance: str
    generation: int
    kind: int
    step_before: int
    step_after: int
    rollout_id: str


@dataclass
class DecisionLedger:
    """Every rollout decision on the audit topic, per model, in the topic's order."""

    by_model: dict[str, list[Decided]] = field(default_factory=dict)

    def take(self, record: Record) -> None:
        if record.value is None:
            return
        a = serde.decode(audit_pb2.AuditRecord, record.value)
        if not (a.rollout_id and a.decided_by.instance):
            return
        self.by_model.setdefault(a.model, []).append(
            Decided(
                a.decided_by.instance,
                a.decided_by.generation,
                a.kind,
                a.rollout_before.step_index,
                a.rollout_after.step_index,
                a.rollout_id,
            )
        )

    def owner(self, model: str) -> str | None:
        mine = self.by_model.get(model)
        return mine[-1].instance if mine else None

    def double_deciders(self) -> int:
        pairs: dict[tuple[str, int], set[str]] = {}
        for model, mine in self.by_model.items():
            for d in mine:
                pairs.setdefault((model, d.generation), set()).add(d.instance)
        return sum(1 for ids in pairs.values() if len(ids) > 1)

    def duplicate_rollbacks(self) -> int:
        counts: dict[str, int] = {}
        for mine in self.by_model.values():
            for d in mine:
                if d.kind == audit_pb2.DECISION_ROLLBACK:
                    counts[d.rollout_id] = counts.get(d.rollout_id, 0) + 1
        return sum(1 for n in counts.values() if n > 1)

    def handover(self, model: str, dead: str) -> tuple[Decided, Decided] | None:
        """The dead instance's last decision for ``model`` and a survivor's first after it."""
        mine = self.by_model.get(model, [])
        last = max((i for i, d in enumerate(mine) if d.instance == dead), default=None)
        if last is None:
            return None
        after = next((d for d in mine[last + 1 :] if d.instance != dead), None)
        return None if after is None else (mine[last], after)


def instance_of(log: Path) -> str | None:
    """The instance id a sharded engine logged when it restored a partition."""
    for line in log.read_text(errors="replace").splitlines():
        if "restored partition" in line and " as instance " in line:
            return line.split(" as instance ", 1)[1].split()[0]
    return None


def judge_takeover(
    ledger: DecisionLedger,
    dead: str,
    moved: Sequence[str],
    *,
    took_s: float,
    lost: int,
    detected_ms: Mapping[str, float | None],
) -> Takeover:
    """The handover of ``moved`` (the models ``dead`` decided for) to the survivors.

    ``took_s``: from the kill to the last of them decided by a survivor; ``lost``: those
    no survivor decided for by then; ``detected_ms``: per model with a regression injected
    after the takeover, its detection (None: never rolled back).
    """
    changed = 0
    for m in moved:
        pair = ledger.handover(m, dead)
        if pair is not None and pair[1].step_before != pair[0].step_after:
            changed += 1
    return Takeover(
        models_moved=len(moved),
        takeover_s=took_s,
        lost=lost,
        step_changed=changed,
        double_deciders=ledger.double_deciders(),
        duplicate_rollbacks=ledger.duplicate_rollbacks(),
        regressions_after=tuple(d for d in detected_ms.values() if d is not None),
        missed_after=sum(1 for d in detected_ms.values() if d is None),
    )
