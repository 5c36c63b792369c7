"""Unresponsive versions on the real broker: the policy engine reads the version
topics' end offsets and the worker groups' committed offsets itself, so a
candidate whose worker is not running is rolled back (``candidate_unresponsive``)
within T, and a rollout over a dead baseline holds and is never promoted.

Slow (about 40 s each): a `graylane policy` process and an in-process stack.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from graylane import serde
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import Gates, RolloutSpec, Step
from graylane.settings import Settings
from graylane.v1 import audit_pb2, telemetry_pb2
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.records import read_audits, send_command, start_command
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


async def answered_until(factory: KafkaFactory, version: str, at_ms: int) -> bool:
    """Whether ``version``'s workers published telemetry of a batch completed at ``at_ms``
    or later (the workers' clock)."""
    records = await read_to_end(factory, factory.layout.telemetry())
    return any(
        t.version == version and t.completed_at_unix_ms >= at_ms
        for t in (serde.decode(telemetry_pb2.BatchTelemetry, r.value) for r in records)
    )


async def _audited(factory: KafkaFactory, rollout_id: str, rule: str, timeout: float) -> None:
    found: list[audit_pb2.AuditRecord] = []

    async def seen() -> bool:
        found[:] = [a for a in await read_audits(factory, rollout_id=rollout_id) if a.rule == rule]
        return bool(found)

    await wait_until(seen, timeout=timeout, poll_s=0.5, what=f"an audit record {rule}")


@contextlib.asynccontextmanager
async def engine_over(
    settings: Settings, factory: KafkaFactory, tmp_path: Path, served: dict[str, Path]
) -> AsyncIterator[RoutingWatch]:
    """The policy engine over a stack whose workers serve only ``served`` (v1 stable),
    under steady load: the watch on its routing tables."""
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    await ensure_topics(factory, factory.layout.model_specs(MODEL, ["v1", "v2"]))
    async with running_stack(factory, model=MODEL, versions=served, stable="v1"):
        with policy_engine(settings, tmp_path / "policy.log", MODEL):
            await wait_ready(tmp_path / "policy.log")
            async with RoutingWatch(factory, MODEL) as watch, steady_load(factory, MODEL):
                yield watch


async def test_a_candidate_without_a_running_worker_is_rolled_back_within_t(
    settings: Settings, factory: KafkaFactory, model_path: Path, tmp_path: Path
) -> None:
    spec = spec_of("r-dead-candidate")
    # Only the baseline has a worker: the candidate's topic fills and nobody reads it.
    async with engine_over(settings, factory, tmp_path, {"v1": model_path}) as watch:
        await send_command(factory, start_command(spec))
        _, started = await watch.until(lambda t: watch.weight(t, "v2") > 0, 30)
        _, table = await watch.until(
            lambda t: watch.weight(t, "v2") == 0 and t.epoch > started.epoch, 40
        )
        await _audited(factory, spec.rollout_id, "candidate_unresponsive", 20)
    assert table.stable_version == "v1" and watch.weight(table, "v1") == 100.0
    # The candidate never got past its first step: the rollback was the next move.
    assert max(watch.weight(t, "v2") for _, t in watch.tables) == 20.0
    audits = await read_audits(factory, rollout_id=spec.rollout_id)
    rec = [a for a in audits if a.rule == "candidate_unresponsive"]
    assert rec[0].kind == audit_pb2.DECISION_ROLLBACK
    assert "candidate unresponsive: v2" in rec[0].reason, rec[0].reason
    # The signals it was decided on travel with the decision (audit verify replays it).
    assert {v.version for v in rec[0].liveness} == {"v1", "v2"}
    # Timed by the engine's own stamps, not the test's: from its first sign of v2's
    # unanswered traffic (a request routed with no telemetry since, or a lag sample
    # above zero) to the decision. Never before T (the rule waits out T), and within T
    # of it plus the probe and decision steps (1 s each in the test engine) and the
    # engine process's own scheduling on a loaded machine.
    (v2,) = [v for v in rec[0].liveness if v.version == "v2"]
    signs = [s.at_unix_ms for s in v2.lag if s.lag > 0]
    if v2.HasField("first_routed_since_telemetry_unix_ms"):
        signs.append(v2.first_routed_since_telemetry_unix_ms)
    waited_ms = rec[0].decided_at_unix_ms - min(signs)
    assert T_S * 1000 <= waited_ms <= (T_S + 4.0) * 1000, waited_ms


async def test_a_dead_baseline_holds_the_rollout_and_is_never_promoted_over(
    settings: Settings, factory: KafkaFactory, model_path: Path, tmp_path: Path
) -> None:
    spec = spec_of("r-dead-baseline")
    # Only the candidate has a worker; the stable version's traffic goes unanswered.
    async with engine_over(settings, factory, tmp_path, {"v2": model_path}) as watch:
        await send_command(factory, start_command(spec))
        await _audited(factory, spec.rollout_id, "baseline_unresponsive", 40)
        (hold, *_) = [
            a
            for a in await read_audits(factory, rollout_id=spec.rollout_id)
            if a.rule == "baseline_unresponsive"
        ]
        # A healthy rollout of this spec promotes within ~3 s of dwell. Wait until
        # the candidate's worker has answered for 12 s past the hold, by its own
        # stamps (the telemetry the engine kept reading): several times that dwell.
        await wait_until(
            lambda: answered_until(factory, "v2", hold.decided_at_unix_ms + 12_000),
            timeout=60,
            poll_s=1.0,
            what="12 s of the candidate's answers after the hold",
        )
    assert hold.kind == audit_pb2.DECISION_HOLD
    assert not [t for _, t in watch.tables if t.stable_version == "v2"], watch.tables
    assert max(watch.weight(t, "v2") for _, t in watch.tables) <= 20.0
    kinds = {a.kind for a in await read_audits(factory, rollout_id=spec.rollout_id)}
    assert audit_pb2.DECISION_PROMOTE not in kinds
