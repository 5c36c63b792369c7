"""``graylane qos set --max-quality-drop`` and ``qos status``: the cap reaches the request,
and each rung is shown with its measured cost and whether QoS may step onto it."""

from __future__ import annotations

from typing import Any

import pytest

from graylane.app.cli import qos
from graylane.app.cli.main import build_parser
from graylane.v1 import controlplane_pb2, rollout_pb2

QOS = ["qos", "set", "--model", "smollm2", "--version", "1.0.0", "--slo-ttft-ms", "500"]


def test_qos_set_sends_the_cap_and_what_to_do_with_unmeasured_rungs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[rollout_pb2.QosPolicy] = []

    def fake_call(args: Any, stub: str, method: str, request: Any, **_: Any) -> Any:
        sent.append(request)
        return controlplane_pb2.QosPolicyView(policy=request)

    monkeypatch.setattr(qos, "call", fake_call)
    for extra in (
        ["--max-quality-drop", "0.05", "--refuse-unmeasured"],
        [],
    ):
        args = build_parser().parse_args([*QOS, "--ladder", "f16,q4_1,q4_0", *extra])
        assert args.handler(args) == 0
    capped, plain = sent
    assert capped.HasField("max_quality_drop") and capped.max_quality_drop == pytest.approx(0.05)
    assert capped.unmeasured_rung == rollout_pb2.UNMEASURED_RUNG_REFUSED
    assert not plain.HasField("max_quality_drop")
    assert plain.unmeasured_rung == rollout_pb2.UNMEASURED_RUNG_ALLOWED
    args = build_parser().parse_args([*QOS, "--ladder", "f16,q4_1", "--refuse-unmeasured"])
    with pytest.raises(SystemExit, match="needs --max-quality-drop"):
        args.handler(args)


def test_qos_status_shows_each_rungs_cost_beside_the_ladder(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = rollout_pb2.QosPolicy(
        model="smollm2", version="1.0.0", slo_ttft_p99_ms=500, ladder=["f16", "q4_1", "q4_0",
        "q2_k"], enabled=True, max_quality_drop=0.05,
        rung_quality_drop={"f16": 0.0, "q4_1": 0.029, "q4_0": 0.144},
    )  # fmt: skip
    view = controlplane_pb2.QosPolicyView(policy=policy, active_variant="q4_1")
    monkeypatch.setattr(qos, "call", lambda *a, **k: view)
    monkeypatch.setenv("COLUMNS", "200")
    args = build_parser().parse_args(["qos", "status", "--model", "smollm2", "--version", "1.0.0"])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") == 4}
    assert "+0.029" in rows["q4_1 *"] and "allowed" in rows["q4_1 *"]
    assert "+0.144" in rows["q4_0"] and "refused: over the cap" in rows["q4_0"]
    assert "unmeasured" in rows["q2_k"] and "allowed (unmeasured)" in rows["q2_k"]
    assert "q4_1 (quality cap: q4_0 costs 0.144 > cap 0.050)" in out
    assert "drop <= 0.050 vs the reference rung; unmeasured rungs allowed" in out
