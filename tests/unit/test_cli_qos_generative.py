"""``graylane qos set`` with a generative SLO: TTFT/TPOT objectives reach the request."""

from __future__ import annotations

from typing import Any

import pytest

from graylane.app.cli import qos
from graylane.app.cli.main import build_parser
from graylane.v1 import controlplane_pb2, rollout_pb2


def test_qos_set_sends_ttft_and_tpot_objectives(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[rollout_pb2.QosPolicy] = []

    def fake_call(args: Any, stub: str, method: str, request: Any, **_: Any) -> Any:
        sent.append(request)
        return controlplane_pb2.QosPolicyView(policy=request)

    monkeypatch.setattr(qos, "call", fake_call)
    args = build_parser().parse_args(
        [
            *("qos", "set", "--model", "chat", "--version", "v1"),
            *("--slo-ttft-ms", "500", "--slo-tpot-ms", "50", "--max-kv-cache", "0.9"),
            *("--ladder", "fp32,int8-dynamic", "--capacity", "fp32=16"),
        ]
    )
    assert args.handler(args) == 0
    (policy,) = sent
    assert (policy.slo_p99_ms, policy.slo_ttft_p99_ms, policy.slo_tpot_p99_ms) == (0, 500, 50)
    assert policy.max_kv_cache_occupancy == pytest.approx(0.9)
    assert dict(policy.rung_capacity_rps) == {"fp32": 16.0}


def test_qos_set_needs_an_objective(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qos, "call", lambda *a, **k: pytest.fail("no policy may be sent"))
    args = build_parser().parse_args(
        ["qos", "set", "--model", "chat", "--version", "v1", "--ladder", "fp32"]
    )
    with pytest.raises(SystemExit, match="state an objective"):
        args.handler(args)
