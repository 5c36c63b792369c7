"""What an applied Rollout document changes in a live spec, and whether it may.

A running rollout may take new steps, gates, a new failure count, new phase
durations and new webhooks; it may not change its model, its versions or its
strategy (that is another rollout: give the document another name). The one rule,
read by the control plane (``apply`` / ``diff``) and the policy engine (which
refuses an update the control plane would have refused).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from graylane.rollouts.spec import Gates, RolloutSpec, Step, WebhookTarget

__all__ = ["FIXED_FIELDS", "SpecChange", "refused", "spec_changes"]

FIXED_FIELDS = frozenset({"model", "baseline", "candidate", "strategy"})
"""What identifies a rollout: a document that changes one of these is refused."""

_IGNORED = frozenset({"rollout_id", "created_at_ms", "created_by", "document_digest"})


@dataclass(frozen=True)
class SpecChange:
    """One field of the spec, as live and as applied; ``allowed``: a running rollout may take it."""

    field: str
    live: str
    applied: str
    allowed: bool


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, Step):
        pause = ""
        if value.pause is not None:
            wait = value.pause.duration_s
            pause = f" pause {wait:g}s" if wait else " pause until resumed"
        return (
            f"{value.weight_percent:g}% {value.min_samples} samples {value.min_dwell_s:g}s{pause}"
        )
    if isinstance(value, WebhookTarget):
        return f"{value.format.value} {value.url}"
    if hasattr(value, "value") and not isinstance(value, int | float | str):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def spec_changes(live: RolloutSpec, applied: RolloutSpec) -> tuple[SpecChange, ...]:
    """Every field of ``applied`` that differs from ``live`` (gates field by field)."""
    out: list[SpecChange] = []
    for f in fields(RolloutSpec):
        if f.name in _IGNORED:
            continue
        before, after = getattr(live, f.name), getattr(applied, f.name)
        if before == after:
            continue
        if isinstance(before, Gates) and isinstance(after, Gates):
            for g in fields(Gates):
                b, a = getattr(before, g.name), getattr(after, g.name)
                if b != a:
                    out.append(SpecChange(f"gates.{g.name}", _shown(b), _shown(a), True))
            continue
        out.append(SpecChange(f.name, _shown(before), _shown(after), f.name not in FIXED_FIELDS))
    return tuple(out)


def refused(changes: tuple[SpecChange, ...]) -> str | None:
    """Why these changes cannot be applied to a running rollout, or None."""
    fixed = [c for c in changes if not c.allowed]
    if not fixed:
        return None
    shown = "; ".join(f"{c.field} {c.live} -> {c.applied}" for c in fixed)
    return (
        f"a running rollout keeps its model, versions and strategy ({shown}); "
        "give the document another metadata.name to start another rollout"
    )
