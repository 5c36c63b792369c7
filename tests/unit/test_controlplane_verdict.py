"""A version's gate verdict (pure) and the Argo Rollouts / Flagger examples that read it."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from graylane.rollouts.vocabulary import DecisionKind, Phase
from graylane.services.controlplane.logic.verdict import (
    LastDecision,
    RolloutVerdict,
    VerdictFacts,
    verdict_of,
)
from tests.unit.k8s_validate import CRDS, validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "progressive"
NOW = 1_700_000_100_000


def facts(
    phase: Phase, kind: DecisionKind | None = None, rule: str = "", age_ms: int = 0
) -> VerdictFacts:
    last = (
        None
        if kind is None
        else LastDecision(kind=kind, rule=rule, reason="r", decided_at_ms=NOW - age_ms, epoch=1)
    )
    return VerdictFacts("m", "1.1.0", "r1", phase, 0, 5.0, last)


@pytest.mark.parametrize(
    ("phase", "kind", "rule", "expected"),
    [
        (Phase.ROLLED_BACK, DecisionKind.ROLLBACK, "error_rate", RolloutVerdict.FAIL),
        (Phase.ABORTED, DecisionKind.MANUAL, "manual_abort", RolloutVerdict.FAIL),
        (Phase.PROMOTED, DecisionKind.PROMOTE, "all_gates_passed", RolloutVerdict.PASS),
        (Phase.PROGRESSING, None, "", RolloutVerdict.INCONCLUSIVE),
        (Phase.PROGRESSING, DecisionKind.GATE_FAILED, "p99_ratio", RolloutVerdict.FAIL),
        (Phase.PROGRESSING, DecisionKind.ADVANCE, "all_gates_passed", RolloutVerdict.PASS),
        (Phase.PROGRESSING, DecisionKind.HOLD, "min_samples", RolloutVerdict.PASS),
        (Phase.PROGRESSING, DecisionKind.HOLD, "min_dwell", RolloutVerdict.PASS),
        (Phase.PROGRESSING, DecisionKind.HOLD, "no_data", RolloutVerdict.INCONCLUSIVE),
        (Phase.PROGRESSING, DecisionKind.HOLD, "incomparable", RolloutVerdict.INCONCLUSIVE),
        (
            Phase.PROGRESSING,
            DecisionKind.HOLD,
            "baseline_unresponsive",
            RolloutVerdict.INCONCLUSIVE,
        ),
        (Phase.PAUSED, DecisionKind.MANUAL, "manual_pause", RolloutVerdict.INCONCLUSIVE),
        (Phase.PENDING, DecisionKind.STARTED, "started", RolloutVerdict.INCONCLUSIVE),
    ],
)
def test_the_verdict_of_each_phase_and_decision(
    phase: Phase, kind: DecisionKind | None, rule: str, expected: RolloutVerdict
) -> None:
    assert verdict_of(facts(phase, kind, rule), NOW, 60_000).verdict is expected


def test_silence_is_never_a_pass() -> None:
    fresh = verdict_of(facts(Phase.PROGRESSING, DecisionKind.ADVANCE, "x", 59_000), NOW, 60_000)
    stale = verdict_of(facts(Phase.PROGRESSING, DecisionKind.ADVANCE, "x", 61_000), NOW, 60_000)
    assert (fresh.verdict, stale.verdict) == (RolloutVerdict.PASS, RolloutVerdict.INCONCLUSIVE)
    assert stale.age_ms == 61_000 and "policy engine" in stale.why
    # A finished rollout keeps its verdict however old its last decision is.
    old = facts(Phase.ROLLED_BACK, DecisionKind.ROLLBACK, "error_rate", 10**9)
    assert verdict_of(old, NOW, 60_000).verdict is RolloutVerdict.FAIL


@pytest.mark.parametrize("name", ["argo-analysis-template.yaml", "flagger-canary.yaml"])
def test_the_examples_validate_against_their_crd_schemas(name: str) -> None:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    assert (doc["apiVersion"], doc["kind"]) in CRDS
    validate(doc)
    broken = copy.deepcopy(doc)
    broken["spec"]["notAField"] = 1  # an undeclared field is refused, as the API would prune it
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
