"""The reports of ``audit replay``, ``audit verify`` and ``traffic replay``: built from
recorded messages (pure), printed as stable ``-o json|yaml`` documents or names."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from graylane.app.cli.main import build_parser
from graylane.app.cli.replay import audit_verification, telemetry_totals, traffic_report
from graylane.app.cli.views import document, emit
from graylane.policy_engine.logic.replay import Mismatch
from graylane.v1 import audit_pb2, inference_pb2, telemetry_pb2


def _answer(
    request_id: str, text: str, status: int = inference_pb2.OK
) -> inference_pb2.InferenceResult:
    return inference_pb2.InferenceResult(request_id=request_id, text=text, status=status)


def test_a_traffic_replay_counts_each_request_once_by_what_came_back() -> None:
    recorded = {r: _answer(r, "same") for r in ("a", "b", "c")}
    replayed = {
        "a": _answer("a~x", "same"),
        "b": _answer("b~x", "changed"),
        "c": _answer("c~x", "", inference_pb2.ERROR),
        "d": _answer("d~x", "new"),  # nothing recorded to compare with
    }
    report = traffic_report(["a", "b", "c", "d", "e"], replayed, recorded)  # e: no answer
    assert (report.replayed, report.agree, report.differ) == (5, 1, 1)
    assert (report.no_recorded_result, report.errors) == (1, 2)
    assert report.agreement == pytest.approx(0.5)
    assert list(report.differing_request_ids) == ["b"]
    assert traffic_report([], {}, {}).agreement == 0.0


def test_telemetry_totals_sum_the_model_per_version_and_variant_in_order() -> None:
    batches = [
        telemetry_pb2.BatchTelemetry(
            model="gpt",
            version="v2",
            variant="fp16",
            request_count=4,
            error_count=1,
            compute_ms=2.5,
        ),
        telemetry_pb2.BatchTelemetry(model="gpt", version="v1", variant="fp32", request_count=8),
        telemetry_pb2.BatchTelemetry(
            model="gpt", version="v2", variant="fp16", request_count=6, compute_ms=1.5
        ),
        telemetry_pb2.BatchTelemetry(model="other", version="v1", variant="fp32", request_count=9),
    ]
    totals = telemetry_totals("gpt", batches)
    assert [(t.version, t.variant, t.batches, t.requests, t.errors) for t in totals] == [
        ("v1", "fp32", 1, 8, 0),
        ("v2", "fp16", 2, 10, 1),
    ]
    assert totals[1].compute_ms == pytest.approx(4.0)


def test_a_verification_names_the_decision_behind_each_mismatch() -> None:
    records = [audit_pb2.AuditRecord(decision_id=f"d{i}") for i in range(3)]
    report = audit_verification(
        records, [Mismatch(2, "kind", "ADVANCE", "HOLD")], model="gpt", rollout_id="ro-1"
    )
    assert report.decisions == 3
    [m] = report.mismatches
    assert (m.index, m.decision_id, m.field, m.recorded, m.replayed) == (
        2,
        "d2",
        "kind",
        "ADVANCE",
        "HOLD",
    )


def _reports() -> dict[str, object]:
    timeline = audit_pb2.AuditTimeline(
        model="gpt",
        rollout_id="ro-1",
        from_unix_ms=1_700_000_000_000,
        decisions=[audit_pb2.AuditRecord(decision_id="d1", kind=audit_pb2.DECISION_PROMOTE)],
        telemetry=[audit_pb2.TelemetryTotals(version="v1", variant="fp32", batches=2)],
    )
    verification = audit_pb2.AuditVerification(
        model="gpt",
        decisions=1,
        mismatches=[audit_pb2.ReplayMismatch(decision_id="d1", field="rule")],
    )
    traffic = audit_pb2.TrafficReplayReport(
        model="gpt", version="v2", replayed=3, differ=1, differing_request_ids=["r1"]
    )
    return {
        "AuditTimeline": timeline,
        "AuditVerification": verification,
        "TrafficReplayReport": traffic,
    }


@pytest.mark.parametrize("kind", ["AuditTimeline", "AuditVerification", "TrafficReplayReport"])
def test_each_report_is_one_stable_document_with_every_field(kind: str) -> None:
    message = _reports()[kind]
    doc = document(kind, single=message)
    assert json.loads(json.dumps(doc)) == doc
    assert (doc["apiVersion"], doc["kind"]) == ("graylane.v1", kind)
    fields = {f.name for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]
    assert set(doc["object"]) == fields  # every field, defaults too, by its .proto name


def test_the_documents_keep_the_protobuf_json_mapping() -> None:
    reports = _reports()
    timeline = document("AuditTimeline", single=reports["AuditTimeline"])["object"]
    assert timeline["from_unix_ms"] == "1700000000000"  # int64 as a string
    assert timeline["to_unix_ms"] == "0"
    assert timeline["decisions"][0]["kind"] == "DECISION_PROMOTE"  # enums by name
    assert timeline["telemetry"] == [
        {
            "version": "v1",
            "variant": "fp32",
            "batches": "2",
            "requests": "0",
            "errors": "0",
            "compute_ms": 0.0,
        }
    ]
    traffic = document("TrafficReplayReport", single=reports["TrafficReplayReport"])["object"]
    assert traffic["differing_request_ids"] == ["r1"] and traffic["replayed"] == 3


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_report_prints_as_the_document_it_is(
    fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _reports()["TrafficReplayReport"]
    args = argparse.Namespace(output=fmt)
    emit(args, "TrafficReplayReport", report, "r1", lambda: pytest.fail("not a table"))
    out = capsys.readouterr().out
    parsed = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert parsed == document("TrafficReplayReport", single=report)


def test_names_print_one_a_line_and_nothing_when_there_are_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = argparse.Namespace(output="name")
    report = _reports()["TrafficReplayReport"]
    emit(args, "TrafficReplayReport", report, "r1\nr2", lambda: None)
    emit(args, "TrafficReplayReport", report, "", lambda: None)
    assert capsys.readouterr().out == "r1\nr2\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "replay", "--model", "gpt", "--from", "15m"],
        ["audit", "verify", "--model", "gpt", "--from", "15m"],
        ["traffic", "replay", "--model", "gpt", "--version", "v2", "--from", "15m"],
    ],
)
@pytest.mark.parametrize("fmt", ["table", "json", "yaml", "name"])
def test_the_kafka_reading_commands_take_the_output_flag(argv: list[str], fmt: str) -> None:
    args = build_parser().parse_args([*argv, "-o", fmt])
    assert args.output == fmt
    assert build_parser().parse_args(argv).output == "table"
