"""Issue 10 item 4: Start refuses a rollout when the injected candidate check says no,
before anything is stored or published (the Kafka-backed check has an integration test)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from graylane.services.controlplane import servicers
from graylane.services.controlplane.limits import ApiLimits
from graylane.services.controlplane.servicers import ControlPlane, RolloutsServicer
from graylane.v1 import rollout_pb2
from tests.unit.test_controlplane_safety import Aborted, FakeContext, FakeStore, control


class Recorder(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.created: list[Any] = []

    def create_rollout(self, state: Any, command: Any) -> None:
        self.created.append(state)


async def test_start_is_refused_when_the_candidate_has_no_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(servicers, "model_facts", lambda *a: None)
    monkeypatch.setattr(servicers.rules, "check_start", lambda ask, facts: ("1.0.0", "1.1.0"))
    monkeypatch.setattr(ControlPlane, "principal", lambda self, ctx: type("P", (), {"name": "a"})())
    asked: list[tuple[str, str]] = []

    async def no_worker(model: str, version: str) -> str | None:
        asked.append((model, version))
        return "no worker consumes t.requests.gpt.1.1.0; start one with `graylane worker ...`"

    store = Recorder()
    servicer = RolloutsServicer(control(store, ApiLimits()), no_worker)
    spec = rollout_pb2.RolloutSpec(model="gpt", candidate_version="1.1.0")
    with pytest.raises(Aborted) as refused:
        await servicer.Start(spec, FakeContext())  # type: ignore[arg-type]
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "no worker consumes" in str(refused.value) and "graylane worker" in str(refused.value)
    assert asked == [("gpt", "1.1.0")] and store.created == []
