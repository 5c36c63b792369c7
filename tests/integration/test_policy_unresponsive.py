"""Unresponsive versions on the real broker: the policy engine reads the version
topics' end offsets and the worker groups' committed offsets itself, so a
candidate whose worker is not running is rolled back (``candidate_unresponsive``)
within T, and a rollout over a dead baseline holds and is never promoted.

Slow (about 40 s each): a `graylane policy` process and an in-process stack.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from graylane import serde
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine.app import PolicyConfig, prepare_topics
from graylane.rollouts.spec import Gates, RolloutSpec, Step
from graylane.settings import Settings
from graylane.v1 import audit_pb2
from tests.integration.test_policy_engine import send_command, start_command
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
T_S = 3.0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("models") / "m.onnx", "tiny", seed=1)


def spec_of(rollout_id: str) -> RolloutSpec:
    return RolloutSpec(
        rollout_id=rollout_id,
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(20.0, 10, 1.0), Step(50.0, 10, 1.0), Step(100.0, 0, 0.0)),
        gates=Gates(unresponsive_s=T_S),
    )


async def audits(factory: KafkaFactory, rollout_id: str) -> list[audit_pb2.AuditRecord]:
    records = await read_to_end(factory, factory.layout.audit(), client_suffix="test-audit")
    decoded = [serde.decode(audit_pb2.AuditRecord, r.value) for r in records if r.value]
    return [a for a in decoded if a.rollout_id == rollout_id]


async def _audited(factory: KafkaFactory, rollout_id: str, rule: str, timeout: float) -> None:
    found: list[audit_pb2.AuditRecord] = []

    async def seen() -> bool:
        found[:] = [a for a in await audits(factory, rollout_id) if a.rule == rule]
        return bool(found)

    await wait_until(seen, timeout=timeout, poll_s=0.5, what=f"an audit record {rule}")


async def test_a_candidate_without_a_running_worker_is_rolled_back_within_t(
    settings: Settings, factory: KafkaFactory, model_path: Path, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    await ensure_topics(factory, factory.layout.model_specs(MODEL, ["v1", "v2"]))
    spec = spec_of("r-dead-candidate")
    # Only the baseline has a worker: the candidate's topic fills and nobody reads it.
    async with running_stack(factory, model=MODEL, versions={"v1": model_path}, stable="v1"):
        with policy_engine(settings, tmp_path / "policy.log", MODEL):
            await wait_ready(tmp_path / "policy.log")
            async with RoutingWatch(factory, MODEL) as watch, steady_load(factory, MODEL):
                await send_command(factory, start_command(spec))
                first, started = await watch.until(lambda t: watch.weight(t, "v2") > 0, 30)
                back, table = await watch.until(
                    lambda t: watch.weight(t, "v2") == 0 and t.epoch > started.epoch, 40
                )
                await _audited(factory, spec.rollout_id, "candidate_unresponsive", 20)
    assert table.stable_version == "v1" and watch.weight(table, "v1") == 100.0
    # Within T of the first request routed to it, plus a probe step and a decision step
    # (1 s each in the test engine) and the loaded machine's delays.
    assert T_S - 1.0 <= back - first <= T_S + 6.0, back - first
    rec = [a for a in await audits(factory, spec.rollout_id) if a.rule == "candidate_unresponsive"]
    assert rec[0].kind == audit_pb2.DECISION_ROLLBACK
    assert "candidate unresponsive: v2" in rec[0].reason, rec[0].reason
    # The facts it was decided on travel with the decision (audit verify replays it).
    assert {v.version for v in rec[0].liveness} == {"v1", "v2"}


async def test_a_dead_baseline_holds_the_rollout_and_is_never_promoted_over(
    settings: Settings, factory: KafkaFactory, model_path: Path, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    await ensure_topics(factory, factory.layout.model_specs(MODEL, ["v1", "v2"]))
    spec = spec_of("r-dead-baseline")
    # Only the candidate has a worker; the stable version's traffic goes unanswered.
    async with running_stack(factory, model=MODEL, versions={"v2": model_path}, stable="v1"):
        with policy_engine(settings, tmp_path / "policy.log", MODEL):
            await wait_ready(tmp_path / "policy.log")
            async with RoutingWatch(factory, MODEL) as watch, steady_load(factory, MODEL):
                await send_command(factory, start_command(spec))
                await _audited(factory, spec.rollout_id, "baseline_unresponsive", 40)
                held = time.monotonic()
                # A healthy rollout of this spec promotes within ~3 s of dwell; give it
                # several times that and see it never promote.
                with pytest.raises(AssertionError, match="no matching table"):
                    await watch.until(lambda t: t.stable_version == "v2", 12)
    assert time.monotonic() - held >= 12
    assert max(watch.weight(t, "v2") for _, t in watch.tables) <= 20.0
    kinds = {a.kind for a in await audits(factory, spec.rollout_id)}
    assert audit_pb2.DECISION_PROMOTE not in kinds
