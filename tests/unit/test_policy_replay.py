"""Replay: recorded inputs give the same decisions; diff shows where they do not."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.qos import QosDecision, evaluate_qos, initial_qos_state
from graylane.policy_engine.logic.replay import (
    DecisionInput,
    InputKind,
    Mismatch,
    RolloutRecording,
    diff,
    qos_recording_of,
    recording_of,
    replay,
    replay_qos,
)
from graylane.policy_engine.logic.rollout import Decision, apply_command, evaluate, start
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec, Step, Strategy
from graylane.rollouts.vocabulary import DecisionKind, ManualCommand

SPEC = RolloutSpec(
    rollout_id="r",
    model="m",
    baseline="v1",
    candidate="v2",
    strategy=Strategy.SHADOW_THEN_CANARY,
    shadow_duration_s=20.0,
    steps=(Step(5.0, 50, 40.0), Step(50.0, 100, 40.0), Step(100.0)),
)


def stats(version: str, rng: np.random.Generator, n: int, t: int, slow: float = 1.0) -> WindowStats:
    h = LatencyHistogram.of(rng.lognormal(np.log(20 * slow), 0.3, n).tolist())
    return WindowStats(
        model="m",
        version=version,
        variant="fp32",
        window_start_ms=t,
        window_end_ms=t + 10_000,
        requests=n,
        errors=int(rng.binomial(n, 0.01)),
        p50_ms=h.quantile(0.5),
        p95_ms=h.quantile(0.95),
        p99_ms=h.quantile(0.99),
        mean_ms=h.mean_ms,
        throughput_rps=n / 10,
    )


def live_run(seed: int = 3) -> list[Decision]:
    """A rollout as it happened: shadowing, canary steps, a pause, a gap, commands."""
    rng = np.random.default_rng(seed)
    decisions = [start(SPEC, 0, epoch=7)]
    t = 0
    for i in range(40):
        state = decisions[-1].after
        if state.terminal:
            break
        if i == 3:
            decisions.append(apply_command(state, SPEC, ManualCommand.PAUSE, t, note="alice"))
            continue
        if i == 5:
            decisions.append(apply_command(state, SPEC, ManualCommand.RESUME, t, note="alice"))
            continue
        share = state.candidate_weight_percent / 100
        n_c = 60 if state.shadow_share else int(500 * share)
        baseline = stats("v1", rng, 500 - n_c if not state.shadow_share else 500, t)
        candidate = None if i == 7 else stats("v2", rng, max(n_c, 1), t)
        pairs = AgreementStats(50 * (i + 1), 50 * (i + 1)) if state.shadow_share else None
        t += 10_000
        decisions.append(evaluate(state, SPEC, baseline, candidate, pairs, t))
    return decisions


def test_replay_reproduces_every_decision() -> None:
    recorded = live_run()
    kinds = {d.kind for d in recorded}
    assert {DecisionKind.STARTED, DecisionKind.ADVANCE, DecisionKind.MANUAL} <= kinds
    assert recorded[-1].kind is DecisionKind.PROMOTE
    replayed = replay(recording_of(SPEC, recorded))
    assert replayed == recorded
    assert diff(recorded, replayed) == []


def test_replay_from_the_middle_starts_at_the_first_state() -> None:
    recorded = live_run()[5:]
    recording = recording_of(SPEC, recorded)
    assert recording.initial == recorded[0].before
    assert replay(recording) == recorded


def test_diff_names_the_fields_that_changed() -> None:
    recorded = live_run()
    # The same inputs through a stricter spec decide differently.
    strict = replace(SPEC, steps=(Step(5.0, 50, 90.0), Step(50.0, 100, 40.0), Step(100.0)))
    replayed = replay(recording_of(strict, recorded))
    mismatches = diff(recorded, replayed)
    assert mismatches
    first = mismatches[0]
    assert isinstance(first, Mismatch) and first.field in {"kind", "rule", "reason", "after"}
    assert diff(recorded, recorded[:-1])[-1].field == "<missing>"
    assert diff(recorded[:-1], recorded)[-1].field == "<extra>"


def test_rejected_inputs_produce_no_decision() -> None:
    recording = RolloutRecording(
        spec=SPEC,
        inputs=(
            DecisionInput(kind=InputKind.START, now_ms=0),
            DecisionInput(kind=InputKind.COMMAND, now_ms=1, command=ManualCommand.RESUME),
            DecisionInput(kind=InputKind.COMMAND, now_ms=2, command=ManualCommand.ABORT),
            DecisionInput(kind=InputKind.COMMAND, now_ms=3, command=ManualCommand.ABORT),
        ),
    )
    out = replay(recording)
    assert [d.kind for d in out] == [DecisionKind.STARTED, DecisionKind.MANUAL]


def test_qos_replay() -> None:
    policy = QosPolicy(model="m", version="v1", slo_p99_ms=50.0, ladder=("fp32", "int8"))
    state = initial_qos_state(policy)
    decisions: list[QosDecision] = []
    rng = np.random.default_rng(5)
    for i in range(300):
        variant = state.active_variant
        load = 50 + 40 * np.sin(i / 40)  # slow swings of load, with noise on top
        p99 = (load if variant == "fp32" else load / 3) + float(rng.normal(0, 5))
        w = WindowStats(
            model="m", version="v1", variant=variant, window_start_ms=0, window_end_ms=1,
            requests=100, errors=0, p50_ms=p99 / 3, p95_ms=p99 / 2, p99_ms=p99,
            mean_ms=p99 / 3, throughput_rps=float(load),
        )  # fmt: skip
        d = evaluate_qos(state, policy, None if i % 37 == 0 else w, 1_000 * i)
        decisions.append(d)
        state = d.after
    assert any(d.changed for d in decisions)
    assert replay_qos(qos_recording_of(policy, decisions)) == decisions
