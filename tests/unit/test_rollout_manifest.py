"""Rollout documents: the schema, line-numbered errors, steps with approval pauses,
the digest, and render -> load giving back the same spec."""

from __future__ import annotations

import json
from dataclasses import fields

import jsonschema
import pytest

from graylane.rollouts.manifest import (
    GATE_KEYS,
    SCHEMA_PATH,
    ManifestInvalid,
    load_documents,
    parse_duration,
    render,
)
from graylane.rollouts.spec import (
    GateMode,
    Gates,
    MetricComparison,
    StepPause,
    Strategy,
    WebhookFormat,
)

DOC = """\
apiVersion: graylane.io/v1
kind: Rollout
metadata:
  name: chat-1-1-0
spec:
  model: chat
  baseline: 1.0.0
  candidate: 1.1.0
  strategy: canary
  steps:
    - weight: 10
      samples: 20
      dwell: 30s
    - pause: {}
    - weight: 50
      dwell: 2m
    - pause: {duration: 10m}
    - weight: 100
  gates:
    mode: fixed
    failuresToRollback: 3
    maxP99Ratio: 2
    unresponsive: 15s
    metrics:
      - name: thumbs-down
        query: sum(rate(app_thumbs_down_total{model="{{model}}",version="{{candidate}}"}[5m]))
        condition: "<"
        threshold: 0.05
        pauseAfterInconclusive: 2m
  qos:
    sloP99Ms: 80
    ladder: [fp32, fp16]
  notifications:
    webhooks:
      - url: http://127.0.0.1:9/hook
        format: slack
        secretFile: /run/secrets/hook
"""


def test_a_document_becomes_the_spec_it_describes() -> None:
    (doc,) = load_documents(DOC, "chat.yaml")
    spec = doc.spec
    assert doc.name == spec.rollout_id == "chat-1-1-0"
    assert (spec.model, spec.baseline, spec.candidate) == ("chat", "1.0.0", "1.1.0")
    assert spec.strategy is Strategy.CANARY
    assert [s.weight_percent for s in spec.steps] == [10.0, 50.0, 100.0]
    assert [s.pause for s in spec.steps] == [StepPause(None), StepPause(600.0), None]
    assert spec.steps[0].min_samples == 20 and spec.steps[1].min_dwell_s == 120.0
    assert spec.gates.mode is GateMode.FIXED and spec.gates.max_p99_ratio == 2.0
    assert spec.gates.unresponsive_s == 15.0 and spec.failures_to_rollback == 3
    (metric,) = spec.gates.metrics
    assert (metric.name, metric.comparison, metric.threshold) == (
        "thumbs-down",
        MetricComparison.LESS,
        0.05,
    )
    assert metric.pause_after_inconclusive_s == 120.0 and "{{candidate}}" in metric.query
    assert spec.webhooks[0].format is WebhookFormat.SLACK
    assert spec.webhooks[0].secret_file == "/run/secrets/hook"
    assert doc.qos is not None and doc.qos.ladder == ("fp32", "fp16")
    assert spec.document_digest == doc.digest and doc.digest.startswith("sha256:")


def test_the_digest_ignores_comments_layout_and_status_but_not_content() -> None:
    (doc,) = load_documents(DOC)
    (same,) = load_documents("# a comment\n" + DOC + "status:\n  phase: progressing\n")
    (other,) = load_documents(DOC.replace("weight: 50", "weight: 40"))
    assert same.digest == doc.digest
    assert other.digest != doc.digest


def test_render_then_load_gives_back_the_same_spec_and_digest() -> None:
    (doc,) = load_documents(DOC)
    text = render(doc.spec, qos=doc.qos, status={"phase": "progressing"})
    (again,) = load_documents(text)
    assert again.spec.steps == doc.spec.steps and again.spec.gates == doc.spec.gates
    assert again.spec.webhooks == doc.spec.webhooks and again.qos == doc.qos
    # Rendered with every default written out: a second render is the same text.
    assert render(again.spec, qos=again.qos, status={"phase": "progressing"}) == text


def test_schema_errors_name_their_line_and_path() -> None:
    broken = DOC.replace("    - weight: 50\n", "    - weight: 150\n").replace(
        "    mode: fixed\n", "    mode: sometimes\n"
    )
    with pytest.raises(ManifestInvalid) as caught:
        load_documents(broken, "chat.yaml")
    shown = [str(p) for p in caught.value.problems]
    assert any(s.startswith("chat.yaml:20: spec.gates.mode:") for s in shown), shown
    assert any(s.startswith("chat.yaml:15: spec.steps[2]:") for s in shown), shown


def test_rule_errors_name_their_line() -> None:
    with pytest.raises(ManifestInvalid) as caught:
        load_documents(
            DOC.replace("    - pause: {}\n", "").replace(
                "  steps:\n", "  steps:\n    - pause: {}\n"
            )
        )
    assert "a pause must follow a weight step" in str(caught.value)
    assert str(caught.value).startswith("<input>:11: spec.steps[0]")
    with pytest.raises(ManifestInvalid, match=r"<input>:6: spec: .*weights must increase"):
        load_documents(DOC.replace("weight: 50", "weight: 5"))


def test_several_documents_in_one_file() -> None:
    second = DOC.replace("chat-1-1-0", "chat-1-2-0").replace("1.1.0", "1.2.0")
    docs = load_documents(DOC + "---\n" + second)
    assert [d.name for d in docs] == ["chat-1-1-0", "chat-1-2-0"]


@pytest.mark.parametrize(
    ("text", "seconds"), [(30, 30.0), ("500ms", 0.5), ("10m", 600.0), ("1h", 3600.0)]
)
def test_durations(text: int | str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_the_schema_is_a_valid_json_schema_and_covers_every_gate() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    documented = set(schema["properties"]["spec"]["properties"]["gates"]["properties"])
    covered = set(GATE_KEYS.values()) | {"mode", "length_drift", "unresponsive_s", "metrics"}
    assert covered == {f.name for f in fields(Gates)}, "a gate field without a document key"
    assert (
        set(GATE_KEYS) | {"mode", "lengthDrift", "unresponsive", "failuresToRollback", "metrics"}
        == documented
    )


def test_the_shipped_example_is_a_valid_document() -> None:
    from tests.conftest import ROOT

    path = ROOT / "deploy" / "rollouts" / "demo-gpt-1.1.0.yaml"
    (doc,) = load_documents(path.read_text(), str(path))
    assert doc.name == "demo-gpt-1-1-0"
    assert [s.pause for s in doc.spec.steps if s.pause is not None] == [
        StepPause(None),
        StepPause(600.0),
    ]


def test_the_qos_policy_survives_the_wire_so_a_second_apply_sets_nothing() -> None:
    from graylane.rollouts.pb import qos_policy_from_pb, qos_policy_to_pb

    (doc,) = load_documents(DOC)
    assert doc.qos is not None
    assert qos_policy_from_pb(qos_policy_to_pb(doc.qos)) == doc.qos


def test_a_documents_qos_may_cap_the_quality_a_step_down_costs() -> None:
    from graylane.rollouts.pb import qos_policy_from_pb, qos_policy_to_pb
    from graylane.rollouts.qos_policy import UnmeasuredRung

    capped = DOC.replace(
        "    ladder: [fp32, fp16]\n",
        "    ladder: [fp32, fp16]\n    maxQualityDrop: 0.05\n    unmeasuredRung: refused\n",
    )
    (doc,) = load_documents(capped)
    assert doc.qos is not None
    assert doc.qos.max_quality_drop == 0.05
    assert doc.qos.unmeasured_rung is UnmeasuredRung.REFUSED
    assert qos_policy_from_pb(qos_policy_to_pb(doc.qos)) == doc.qos
    (again,) = load_documents(render(doc.spec, qos=doc.qos))
    assert again.qos == doc.qos
    (plain,) = load_documents(DOC)
    assert plain.qos is not None and plain.qos.max_quality_drop is None
    with pytest.raises(ManifestInvalid):
        load_documents(capped.replace("maxQualityDrop: 0.05", "maxQualityDrop: 2"))


def test_a_bake_period_is_read_rendered_and_checked() -> None:
    (plain,) = load_documents(DOC)
    assert plain.spec.bake_s == 0.0 and "bake:" not in render(plain.spec, qos=plain.qos)
    baked = DOC.replace("  strategy: canary\n", "  strategy: canary\n  bake: 30m\n")
    (doc,) = load_documents(baked)
    assert doc.spec.bake_s == 1800.0
    text = render(doc.spec, qos=doc.qos)
    assert "  bake: 30m\n" in text
    (again,) = load_documents(text)
    assert again.spec.bake_s == 1800.0 and render(again.spec, qos=again.qos) == text
    assert doc.digest != plain.digest
    with pytest.raises(ManifestInvalid, match=r"spec.bake"):
        load_documents(DOC.replace("  strategy: canary\n", "  strategy: canary\n  bake: soon\n"))
