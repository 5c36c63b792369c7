"""Shadow agreement on text: sampled answers compared by chrF against the baseline's own
variation on the same prompts, with an anytime-valid drift test.

What the statistics promise, checked by seeded simulation on text drawn like a sampled
model's answers (each prompt has answers in several wordings, drawn at random):
- the same model answering with other seeds is never called a drift in 100 runs of 200
  pairs (the test's false-alarm bound is alpha = 1 % per run);
- a candidate that answers otherwise (another system prompt: other wordings of the
  answer; a lower rung: garbled wordings) is caught in every run, within 200 pairs.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from graylane.policy_engine.logic.agreement import AgreementTracker, ShadowOutput, TokenDecoding
from graylane.policy_engine.logic.rollout import RolloutSignals, evaluate, start
from graylane.policy_engine.logic.text_agreement import (
    TextAgreementStats,
    TextAgreementTracker,
    drift_wealth,
    text_agreement_gate,
)
from graylane.policy_engine.wire import decision_to_audit, signals_from_audit
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step, Strategy
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule
from tests.support.rollout_run import WINDOW, window_pair

ANSWERS = {
    "capital": (
        "The capital of France is Paris.",
        "Paris is the capital of France.",
        "Paris.",
        "It is Paris, a city on the Seine.",
    ),
    "color": ("Blue.", "A nice color is blue.", "Red is a color.", "Green, like grass."),
    "greeting": ("Bonjour!", "Hello in French is bonjour.", "You say 'bonjour'.", "Salut!"),
    "sum": ("3 plus 4 is 7.", "The answer is 7.", "7", "Three plus four equals seven."),
}
OTHER_PROMPT = {  # the same questions answered under another system prompt: as a pirate
    "capital": ("Arr, 'tis Paris, matey!", "Yo ho, Paris be the port ye seek."),
    "color": ("Arr, the sea's own blue!", "Black, like me flag, matey."),
    "greeting": ("Ahoy! The Frenchies say bonjour.", "Arr, bonjour to ye!"),
    "sum": ("Seven doubloons, matey!", "Arr, 'tis seven."),
}


def garbled(text: str, rng: random.Random) -> str:
    """A lower rung's answer: the same draw with words dropped and repeated."""
    words = text.split()
    out = [w for w in words if rng.random() > 0.4]
    return " ".join(out + out[-1:] * 3) or "the the the"


def out(
    version: str, pair: int, text: str, prompt: str, at: int, decoding=TokenDecoding.UNSEEDED
) -> ShadowOutput:
    return ShadowOutput(
        request_id=f"r{pair}",
        version=version,
        at_ms=at,
        pair_id=f"p{pair}",
        decoding=decoding,
        text=text,
        prompt_digest=prompt,
    )


def run(pairs: int, seed: int, candidate: str, tolerance: float = 0.02) -> TextAgreementStats:
    """``pairs`` shadow pairs on random prompts; the candidate answers as ``candidate``
    says: ``same`` (another draw of the baseline's model), ``pirate``, ``garbled``."""
    rng = random.Random(seed)
    tracker = TextAgreementTracker("v1", "v2")
    for i in range(pairs):
        prompt = rng.choice(sorted(ANSWERS))
        base = rng.choice(ANSWERS[prompt])
        if candidate == "same":
            cand = rng.choice(ANSWERS[prompt])
        elif candidate == "pirate":
            cand = rng.choice(OTHER_PROMPT[prompt])
        else:
            cand = garbled(rng.choice(ANSWERS[prompt]), rng)
        tracker.add(out("v1", i, base, prompt, i))
        tracker.add(out("v2", i, cand, prompt, i))
    return tracker.stats(tolerance)


def test_the_same_model_with_other_seeds_is_not_called_a_drift() -> None:
    alarms = [seed for seed in range(100) if run(200, seed, "same").drifted(0.01)]
    assert alarms == []
    stats = run(300, 7, "same")
    assert stats.pairs > 280 and abs(stats.similarity - stats.self_similarity) < 0.05


def test_a_candidate_answering_otherwise_is_caught_within_two_hundred_pairs() -> None:
    for kind in ("pirate", "garbled"):
        caught = [run(200, seed, kind).drifted(0.01) for seed in range(20)]
        assert all(caught), (kind, caught)
        stats = run(200, 3, kind)
        assert stats.similarity < stats.self_similarity - 0.1


def test_the_drift_test_is_a_supermartingale_bet_that_never_goes_negative() -> None:
    assert drift_wealth([], 0.05) == 0.0
    assert drift_wealth([0.0] * 50, 0.05) < 0.0  # no difference: the evidence shrinks
    assert drift_wealth([-1.0] * 20, 0.05) > math.log(100)  # all lost: decisive
    assert math.isfinite(drift_wealth([1.0, -1.0] * 10, 0.2))


def test_pairs_need_a_control_on_the_same_prompt_and_greedy_pairs_stay_exact() -> None:
    tracker = TextAgreementTracker("v1", "v2")
    assert tracker.add(out("v1", 1, "Paris.", "capital", 1)) is None
    assert tracker.add(out("v2", 1, "Paris.", "capital", 1)) is None  # no control yet
    tracker.add(out("v2", 2, "Lyon.", "capital", 2))
    score = tracker.add(out("v1", 2, "Paris is the capital.", "capital", 2))
    assert score is not None and score.self_similarity > score.similarity
    assert tracker.add(out("v1", 2, "again", "capital", 3)) is None  # a redelivery
    tracker.add(out("v1", 3, "Blue.", "color", 4))
    assert tracker.add(out("v2", 3, "Blue.", "other-prompt", 4)) is None  # digests differ
    tracker.add(out("v1", 4, "x", "capital", 5, TokenDecoding.GREEDY))
    assert tracker.add(out("v2", 4, "y", "capital", 5, TokenDecoding.GREEDY)) is None
    stats = tracker.stats(0.05)
    assert (stats.pairs, stats.uncontrolled) == (1, 2)


def test_sampled_engine_server_answers_are_not_compared_exactly() -> None:
    """Regression: answers of an engine server carry text and no token ids; sampled ones
    were compared by an exact digest, so a same-model candidate disagreed on every pair."""
    exact = AgreementTracker("v1", "v2")
    base = replace(out("v1", 1, "Paris.", "capital", 1), label=1)
    exact.add(base)
    assert exact.add(replace(out("v2", 1, "Paris is it.", "capital", 1), label=2)) is None
    assert exact.stats().unseeded == 1 and exact.stats().pairs == 0


SPEC = RolloutSpec(
    rollout_id="r-text",
    model="m",
    baseline="v1",
    candidate="v2",
    strategy=Strategy.SHADOW_THEN_CANARY,
    shadow_duration_s=30.0,
    steps=(Step(10.0, 20, 30.0), Step(100.0, 0, 0.0)),
    gates=Gates(mode=GateMode.FIXED),
)


def shadow_decisions(text: TextAgreementStats) -> list:
    decisions = [start(SPEC, 0)]
    t = 0
    for _ in range(5):
        baseline, candidate = window_pair(t, 1000, 200)
        t += WINDOW
        decisions.append(
            evaluate(
                decisions[-1].after,
                SPEC,
                baseline,
                candidate,
                replace_agreement(),
                t,
                RolloutSignals(text_agreement=text),
            )
        )
        if decisions[-1].kind is not DecisionKind.HOLD:
            break
    return decisions


def replace_agreement():
    from graylane.policy_engine.logic.agreement import AgreementStats

    return AgreementStats(0, 0, unseeded=300)  # every pair sampled: none compared exactly


def test_a_shadow_of_sampled_traffic_advances_on_text_agreement_and_fails_on_drift() -> None:
    same = run(300, 1, "same")
    last = shadow_decisions(same)[-1]
    assert last.kind is DecisionKind.ADVANCE, last.reason
    record = decision_to_audit(last, SPEC)
    assert record.agreement.text_pairs == same.pairs
    signals = signals_from_audit(record, "v1", "v2")
    assert signals is not None and signals.text_agreement == same
    drift = run(300, 1, "pirate")
    failed = [d for d in shadow_decisions(drift) if d.kind is not DecisionKind.HOLD][-1]
    assert failed.rule is DecisionRule.TEXT_AGREEMENT
    assert text_agreement_gate(drift, SPEC.gates).verdict.value == "fail"
