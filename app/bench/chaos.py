"""Chaos bench accounting: per-phase figures from acknowledged and answered request ids.

Pure logic only (no Kafka, no processes): the runner (:mod:`graylane.app.bench.chaos_runner`)
records what it sent and what came back and feeds these functions.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
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
    errors: int = 0
    """Acknowledged requests answered with an error result."""
    send_failed: int = 0
    """Requests whose send the broker never acknowledged (the caller saw an error)."""

    def as_json(self) -> dict[str, object]:
        return {
            "acked": self.acked,
            "answered": self.answered,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "recovery_s": self.recovery_s,
            "services_alive": self.services_alive,
            "errors": self.errors,
            "send_failed": self.send_failed,
        }


def account_phase(
    *,
    acked: Iterable[str],
    answers: Iterable[str],
    errored: Iterable[str] = (),
    recovery_s: float | None,
    services_alive: bool,
    send_failed: int = 0,
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
    errored_ids = set(errored)
    lost = acked_ids - answered_ids - errored_ids
    return PhaseResult(
        acked=len(acked_ids),
        answered=len(answered_ids & acked_ids),
        lost=len(lost),
        duplicates=duplicates,
        recovery_s=recovery_s,
        services_alive=services_alive,
        errors=len(errored_ids & acked_ids),
        send_failed=send_failed,
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One acknowledged request: when it was sent and when its first answer came (seconds)."""

    sent_at: float
    answered_at: float | None


def recovery_seconds(
    deliveries: Sequence[Delivery], *, fault_at: float, since: float, stall_s: float
) -> float | None:
    """Seconds from ``since`` until results flow again after a fault at ``fault_at``.

    ``since`` is the fault itself, or (broker outage) the broker's return. A request in
    flight at the fault or sent after it is *stalled* when its answer took longer than
    ``stall_s``. Results flow again once the last stalled request is answered and a request
    sent at ``since`` or later has been answered (a client that cannot send after an outage
    has not recovered). ``None``: no request sent since then was ever answered. Never
    negative.
    """
    answers = [
        (d.sent_at, d.answered_at)
        for d in deliveries
        if d.sent_at >= fault_at - stall_s
        and d.answered_at is not None
        and d.answered_at >= fault_at
    ]
    fresh = [at for sent, at in answers if sent >= since]
    if not fresh:
        return None
    stalled = [at for sent, at in answers if at - sent > stall_s]
    point = max([min(fresh), *stalled])
    return round(max(0.0, point - since), 2)


@dataclass(frozen=True, slots=True)
class StepMark:
    """A rollout's position as its state record told it."""

    phase: int
    step_index: int
    weight_percent: float


def resumed_same_step(before: StepMark | None, after: StepMark | None) -> bool:
    """A restarted policy engine went on from where the killed one stood."""
    if before is None or after is None:
        return False
    return (before.phase, before.step_index) == (after.phase, after.step_index)


def report_line(
    phases: Mapping[str, PhaseResult],
    *,
    rollout_resumed_same_step: bool,
    extra: Mapping[str, object] | None = None,
) -> str:
    """The bench's last output line: exactly one JSON object."""
    return json.dumps(
        {
            "phases": {name: result.as_json() for name, result in phases.items()},
            "rollout_resumed_same_step": rollout_resumed_same_step,
            **dict(extra or {}),
        },
        sort_keys=False,
    )


def table_lines(phases: Mapping[str, PhaseResult]) -> list[str]:
    """A plain-text table of the phases (one line each, with a header)."""
    head = (
        "phase",
        "acked",
        "answered",
        "errors",
        "lost",
        "dups",
        "send-fail",
        "recovery",
        "alive",
    )
    rows = [head]
    for name, r in phases.items():
        rec = "never" if r.recovery_s is None else f"{r.recovery_s:.1f} s"
        rows.append(
            (
                name,
                str(r.acked),
                str(r.answered),
                str(r.errors),
                str(r.lost),
                str(r.duplicates),
                str(r.send_failed),
                rec,
                "yes" if r.services_alive else "NO",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
