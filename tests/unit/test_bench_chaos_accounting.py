"""Chaos bench accounting: lost and duplicates from acked/answered sets, recovery time,
the policy engine's resume check, and the malformed records."""

from __future__ import annotations

import json
import random

import pytest

from graylane import serde
from graylane.app.bench.chaos import (
    KINDS,
    Delivery,
    Expect,
    StepMark,
    account_phase,
    build,
    burst,
    recovery_seconds,
    report_line,
    resumed_same_step,
    table_lines,
)
from graylane.errors import SerdeError
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2


def test_lost_duplicates_and_report_line() -> None:
    result = account_phase(
        acked=["a", "b", "c", "d", "e"],
        answers=["a", "b", "b", "b", "c", "zz"],
        errored=["d"],
        recovery_s=2.5,
        services_alive=True,
        send_failed=3,
    )
    assert (result.acked, result.answered, result.lost, result.duplicates) == (5, 3, 1, 2)
    assert (result.errors, result.send_failed) == (1, 3)
    line = report_line(
        {"worker": result}, rollout_resumed_same_step=False, extra={"capacity_rps": 10.0}
    )
    assert json.loads(line) == {
        "phases": {
            "worker": {
                "acked": 5,
                "answered": 3,
                "lost": 1,
                "duplicates": 2,
                "recovery_s": 2.5,
                "services_alive": True,
                "errors": 1,
                "send_failed": 3,
            }
        },
        "rollout_resumed_same_step": False,
        "capacity_rps": 10.0,
    }


def test_recovery_is_when_the_last_stalled_request_is_answered() -> None:
    deliveries = [
        Delivery(9.0, 9.1),  # before the fault, normal
        Delivery(9.8, 14.0),  # in flight at the fault (10.0), stalled until 14.0
        Delivery(10.5, 16.5),  # stalled until 16.5: results flow again then
        Delivery(12.0, 12.2),  # another partition kept flowing
        Delivery(17.0, 17.1),
        Delivery(11.0, None),  # never answered: counted as lost elsewhere
    ]
    assert recovery_seconds(deliveries, fault_at=10.0, since=10.0, stall_s=1.0) == 6.5
    # the broker phase measures from the broker's return (15.0): the stalled answers came
    # by 16.5, the first request sent since then was answered at 17.1
    assert recovery_seconds(deliveries, fault_at=10.0, since=15.0, stall_s=1.0) == 2.1
    # nothing sent after 20.0 was answered: results never flowed again
    assert recovery_seconds(deliveries, fault_at=10.0, since=20.0, stall_s=1.0) is None


def test_a_client_that_cannot_send_after_the_outage_has_not_recovered() -> None:
    in_flight = [Delivery(9.9, 43.0), Delivery(9.95, 43.1)]  # answered once the broker is back
    replaced_client = [Delivery(100.0, 100.2), Delivery(101.0, 101.1)]
    assert recovery_seconds(in_flight, fault_at=10.0, since=40.0, stall_s=1.0) is None
    late = recovery_seconds(in_flight + replaced_client, fault_at=10.0, since=40.0, stall_s=1.0)
    assert late == 60.2


def test_recovery_without_stalls_and_without_answers() -> None:
    flowing = [Delivery(10.0 + i / 10, 10.05 + i / 10) for i in range(20)]
    assert recovery_seconds(flowing, fault_at=10.5, since=10.5, stall_s=1.0) == 0.05
    silent = [Delivery(10.0 + i, None) for i in range(5)]
    assert recovery_seconds(silent, fault_at=10.0, since=10.0, stall_s=1.0) is None


def test_resumed_same_step() -> None:
    at_step_1 = StepMark(phase=2, step_index=1, weight_percent=25.0)
    assert resumed_same_step(at_step_1, StepMark(2, 1, 25.0))
    assert not resumed_same_step(at_step_1, StepMark(2, 0, 5.0))  # started over
    assert not resumed_same_step(at_step_1, None)  # the new engine never decided
    assert not resumed_same_step(None, at_step_1)


def test_table_has_a_row_per_phase() -> None:
    ok = account_phase(acked=["a"], answers=["a"], recovery_s=1.25, services_alive=True)
    bad = account_phase(acked=["a"], answers=[], recovery_s=None, services_alive=False)
    lines = table_lines({"worker_kill": ok, "broker_outage": bad})
    assert len(lines) == 3 and lines[0].startswith("phase")
    assert "1.2 s" in lines[1] or "1.3 s" in lines[1]
    assert "never" in lines[2] and "NO" in lines[2]


def test_every_malformed_kind_is_built() -> None:
    layout = TopicLayout(prefix="t")
    reply = layout.reply("bench")
    records = burst("m", layout, reply, per_kind=2)
    assert len(records) == 2 * len(KINDS)
    assert {r.kind for r in records} == set(KINDS)
    for r in records:
        if r.kind in ("undecodable", "empty", "truncated"):
            with pytest.raises(SerdeError):
                pb = serde.decode(inference_pb2.InferenceRequest, r.value)
                if not pb.request_id:
                    raise SerdeError("no request")
            continue
        pb = serde.decode(inference_pb2.InferenceRequest, r.value)
        assert pb.request_id == r.request_id
        assert pb.request_id.startswith("bad-")
        if r.expect is not Expect.NOTHING:
            assert pb.reply_topic == reply


def test_forbidden_reply_topics_and_sizes() -> None:
    layout = TopicLayout(prefix="t")
    rng = random.Random(1)

    def pb(kind: str) -> inference_pb2.InferenceRequest:
        return serde.decode(
            inference_pb2.InferenceRequest, build(kind, "m", layout, "t.reply.b", rng).value
        )

    assert pb("reply_control_topic").reply_topic == layout.rollouts()
    assert pb("reply_audit_topic").reply_topic == layout.audit()
    assert len(pb("oversize_ids").request_id) > 100_000
    assert len(pb("too_many_dims").inputs[0].shape) > 8
    assert pb("zero_batch").inputs[0].shape[0] == 0
    assert pb("client_shadow_flag").shadow
    # a pin is the router's to refuse; past the router the version's worker serves it
    assert build("unknown_pinned_version", "m", layout, "t.reply.b", rng).expect is Expect.ERROR
    direct = build("unknown_pinned_version", "m", layout, "t.reply.b", rng, direct=True)
    assert direct.expect is Expect.OK
    with pytest.raises(ValueError):
        build("nonsense", "m", layout, "t.reply.b", rng)
