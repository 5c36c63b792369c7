"""Replay recorded inputs through the controllers and compare the decisions.

Decisions are frozen dataclasses, so a replay is checked by equality. A
recorded decision carries its own inputs (window stats, agreement, command,
note), so :func:`recording_of` rebuilds the input sequence from a list of
decisions and ``diff(recorded, replay(recording_of(spec, recorded)))`` is
empty when the logic still decides as it did. Inputs the controller rejects
(:class:`~graylane.rollouts.errors.PolicyError`, e.g. a command a finished
rollout refuses) produce no decision, as when they were first seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.qos import QosDecision, QosState, evaluate_qos
from graylane.policy_engine.logic.rollout import (
    Decision,
    RolloutSignals,
    RolloutState,
    apply_command,
    evaluate,
    start,
)
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.errors import PolicyError
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec
from graylane.rollouts.vocabulary import DecisionKind, ManualCommand

__all__ = [
    "DecisionInput",
    "InputKind",
    "Mismatch",
    "QosInput",
    "QosRecording",
    "RolloutRecording",
    "diff",
    "qos_recording_of",
    "recording_of",
    "replay",
    "replay_qos",
]


class InputKind(Enum):
    START = "start"
    EVALUATE = "evaluate"
    COMMAND = "command"


@dataclass(frozen=True, kw_only=True)
class DecisionInput:
    """One input of the rollout controller, as it was seen."""

    kind: InputKind
    now_ms: int
    baseline: WindowStats | None = None
    candidate: WindowStats | None = None
    agreement: AgreementStats | None = None
    command: ManualCommand | None = None
    note: str = ""
    epoch: int = 0
    signals: RolloutSignals | None = None


@dataclass(frozen=True, kw_only=True)
class RolloutRecording:
    spec: RolloutSpec
    inputs: tuple[DecisionInput, ...]
    initial: RolloutState | None = None


@dataclass(frozen=True, kw_only=True)
class QosInput:
    now_ms: int
    stats: WindowStats | None = None
    scale_hold: str = ""


@dataclass(frozen=True, kw_only=True)
class QosRecording:
    policy: QosPolicy
    initial: QosState
    inputs: tuple[QosInput, ...]


@dataclass(frozen=True)
class Mismatch:
    """Where a replayed decision differs from the recorded one."""

    index: int
    field: str
    recorded: object
    replayed: object


def replay(recording: RolloutRecording) -> list[Decision]:
    spec, state = recording.spec, recording.initial
    out: list[Decision] = []
    for item in recording.inputs:
        try:
            decision = _one(spec, state, item)
        except PolicyError:
            continue
        out.append(decision)
        state = decision.after
    return out


def _one(spec: RolloutSpec, state: RolloutState | None, item: DecisionInput) -> Decision:
    if item.kind is InputKind.START:
        return start(spec, item.now_ms, epoch=item.epoch)
    if state is None:
        raise ValueError("a recording that does not begin with START needs an initial state")
    if item.kind is InputKind.COMMAND:
        if item.command is None:
            raise ValueError("a COMMAND input without a command")
        return apply_command(state, spec, item.command, item.now_ms, note=item.note)
    return evaluate(
        state,
        spec,
        item.baseline,
        item.candidate,
        item.agreement,
        item.now_ms,
        signals=item.signals,
    )


def recording_of(spec: RolloutSpec, decisions: Sequence[Decision]) -> RolloutRecording:
    """The inputs that produced ``decisions`` (taken from the decisions themselves)."""
    items: list[DecisionInput] = []
    for d in decisions:
        if d.kind is DecisionKind.STARTED:
            items.append(DecisionInput(kind=InputKind.START, now_ms=d.at_ms, epoch=d.before.epoch))
        elif d.command is not None:
            items.append(
                DecisionInput(
                    kind=InputKind.COMMAND, now_ms=d.at_ms, command=d.command, note=d.note
                )
            )
        else:
            by_version = {s.version: s for s in d.inputs}
            items.append(
                DecisionInput(
                    kind=InputKind.EVALUATE,
                    now_ms=d.at_ms,
                    baseline=by_version.get(spec.baseline),
                    candidate=by_version.get(spec.candidate),
                    agreement=d.agreement,
                    signals=d.signals,
                )
            )
    initial = None
    if decisions and decisions[0].kind is not DecisionKind.STARTED:
        initial = decisions[0].before
    return RolloutRecording(spec=spec, inputs=tuple(items), initial=initial)


def replay_qos(recording: QosRecording) -> list[QosDecision]:
    state = recording.initial
    out: list[QosDecision] = []
    for item in recording.inputs:
        decision = evaluate_qos(
            state, recording.policy, item.stats, item.now_ms, scale_hold=item.scale_hold
        )
        out.append(decision)
        state = decision.after
    return out


def qos_recording_of(policy: QosPolicy, decisions: Sequence[QosDecision]) -> QosRecording:
    if not decisions:
        raise ValueError("no decisions to rebuild a recording from")
    return QosRecording(
        policy=policy,
        initial=decisions[0].before,
        inputs=tuple(
            QosInput(
                now_ms=d.at_ms, stats=d.inputs[0] if d.inputs else None, scale_hold=d.scale_hold
            )
            for d in decisions
        ),
    )


def diff(
    recorded: Sequence[Decision] | Sequence[QosDecision],
    replayed: Sequence[Decision] | Sequence[QosDecision],
) -> list[Mismatch]:
    """Field-by-field differences, in order; ``<missing>`` / ``<extra>`` for length."""
    out: list[Mismatch] = []
    for i in range(max(len(recorded), len(replayed))):
        if i >= len(replayed):
            out.append(Mismatch(i, "<missing>", recorded[i], None))
            continue
        if i >= len(recorded):
            out.append(Mismatch(i, "<extra>", None, replayed[i]))
            continue
        a, b = recorded[i], replayed[i]
        if a == b:
            continue
        if type(a) is not type(b) or not is_dataclass(a):
            out.append(Mismatch(i, "<type>", a, b))
            continue
        for f in fields(a):
            va, vb = getattr(a, f.name), getattr(b, f.name)
            if va != vb:
                out.append(Mismatch(i, f.name, va, vb))
    return out
