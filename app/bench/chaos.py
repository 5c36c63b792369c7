"""Chaos bench accounting: per-phase figures from acknowledged and answered request ids.

Pure logic only (no Kafka, no processes); the stack driver that kills and restarts
services is still to be written and will feed these functions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PhaseResult:
    """What one fault phase did to the requests sent during it."""

    acked: int
    answered: int
    lost: int
    duplicates: int
    recovery_s: float | None
    services_alive: bool

    def as_json(self) -> dict[str, object]:
        return {
            "acked": self.acked,
            "answered": self.answered,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "recovery_s": self.recovery_s,
            "services_alive": self.services_alive,
        }


def account_phase(
    *,
    acked: Iterable[str],
    answers: Iterable[str],
    errored: Iterable[str] = (),
    recovery_s: float | None,
    services_alive: bool,
) -> PhaseResult:
    """Count one phase.

    ``acked``: request ids the broker acknowledged; ``answers``: the request id of every
    result received (one entry per result, so repeats are duplicates); ``errored``: ids
    answered with an error. Lost = acknowledged, never answered and no error.
    """
    acked_ids = set(acked)
    per_id = Counter(answers)
    answered_ids = set(per_id)
    duplicates = sum(n - 1 for n in per_id.values() if n > 1)
    lost = acked_ids - answered_ids - set(errored)
    return PhaseResult(
        acked=len(acked_ids),
        answered=len(answered_ids & acked_ids),
        lost=len(lost),
        duplicates=duplicates,
        recovery_s=recovery_s,
        services_alive=services_alive,
    )


def report_line(phases: Mapping[str, PhaseResult], *, rollout_resumed_same_step: bool) -> str:
    """The bench's last output line: exactly one JSON object."""
    return json.dumps(
        {
            "phases": {name: result.as_json() for name, result in phases.items()},
            "rollout_resumed_same_step": rollout_resumed_same_step,
        },
        sort_keys=False,
    )
