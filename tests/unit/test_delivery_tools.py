"""Argo Rollouts and Flagger call Graylane's verdict: the shipped AnalysisTemplate and
Canary validate against their CRD schemas (kept in deploy/k8s/schemas), and the verdict
endpoints answer them over HTTP from the audit on record."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase
from graylane.services.controlplane.logic.verdict import GateVerdict, verdict_of
from graylane.services.controlplane.state import open_store
from graylane.services.controlplane.verdicts import verdict_app
from graylane.v1 import audit_pb2, rollout_pb2
from tests.unit.k8s_validate import CRDS, validate

ROOT = Path(__file__).resolve().parents[2]
PROGRESSING = rollout_pb2.PROGRESSING
EXAMPLES = ROOT / "deploy" / "delivery-tools"


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("argo-analysis-template.yaml", ("argoproj.io/v1alpha1", "AnalysisTemplate")),
        ("flagger-canary.yaml", ("flagger.app/v1beta1", "Canary")),
    ],
)
def test_the_examples_validate_against_their_crd_schemas(name: str, key: tuple[str, str]) -> None:
    assert key in CRDS
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    validate(doc)


@pytest.mark.parametrize(
    ("kind", "rule", "phase", "expected"),
    [
        (None, None, None, GateVerdict.INCONCLUSIVE),
        (DecisionKind.ADVANCE, DecisionRule.ALL_GATES_PASSED, Phase.PROGRESSING, GateVerdict.PASS),
        (DecisionKind.HOLD, DecisionRule.MIN_DWELL, Phase.PROGRESSING, GateVerdict.PASS),
        (DecisionKind.HOLD, DecisionRule.MIN_SAMPLES, Phase.PROGRESSING, GateVerdict.INCONCLUSIVE),
        (DecisionKind.HOLD, DecisionRule.NO_DATA, Phase.PROGRESSING, GateVerdict.INCONCLUSIVE),
        (DecisionKind.GATE_FAILED, DecisionRule.P99_RATIO, Phase.PROGRESSING, GateVerdict.FAIL),
        (DecisionKind.ROLLBACK, DecisionRule.ERROR_RATE, Phase.ROLLED_BACK, GateVerdict.FAIL),
        (DecisionKind.PROMOTE, DecisionRule.ALL_GATES_PASSED, Phase.PROMOTED, GateVerdict.PASS),
    ],
)
def test_verdicts(
    kind: DecisionKind | None,
    rule: DecisionRule | None,
    phase: Phase | None,
    expected: GateVerdict,
) -> None:
    assert verdict_of(kind, rule, phase).verdict is expected


def _record(n: int, kind: int, rule: str, phase: int, version: str) -> audit_pb2.AuditRecord:
    return audit_pb2.AuditRecord(
        decision_id=f"d{n}",
        decided_at_unix_ms=1_000 + n,
        model="m",
        rollout_id="r1",
        version=version,
        kind=kind,
        rule=rule,
        reason=f"decision {n}",
        rollout_after=rollout_pb2.RolloutState(rollout_id="r1", model="m", phase=phase),
    )


async def test_the_endpoints_answer_argo_and_flagger(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'cp.db'}")
    store.add_audit(
        [
            _record(1, audit_pb2.DECISION_ROLLOUT_STARTED, "started", rollout_pb2.PROGRESSING, "2"),
            _record(
                2, audit_pb2.DECISION_ADVANCE, "all_gates_passed", rollout_pb2.PROGRESSING, "2"
            ),
            _record(3, audit_pb2.DECISION_ROLLBACK, "error_rate", rollout_pb2.ROLLED_BACK, "3"),
        ]
    )
    transport = httpx.ASGITransport(app=verdict_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as http:
        passing = (await http.get("/v1/verdict/m/2")).json()
        assert passing["verdict"] == "pass" and passing["reason"] == "decision 2"
        assert passing["rolloutId"] == "r1" and passing["decidedAtMs"] == 1002
        assert (await http.get("/v1/verdict/m/3")).json()["verdict"] == "fail"
        unknown = await http.get("/v1/verdict/m/9")
        assert unknown.status_code == 200 and unknown.json()["verdict"] == "inconclusive"
        ok = await http.post("/v1/flagger/gate", json={"metadata": {"model": "m", "version": "2"}})
        assert ok.status_code == 200
        bad = await http.post("/v1/flagger/gate", json={"metadata": {"model": "m", "version": "3"}})
        assert bad.status_code == 412 and bad.json()["verdict"] == "fail"
        unsure = await http.post(
            "/v1/flagger/gate", json={"metadata": {"model": "m", "version": "9"}}
        )
        assert unsure.status_code == 412
        assert (await http.post("/v1/flagger/gate", json={"name": "x"})).status_code == 400
    store.engine.dispose()
