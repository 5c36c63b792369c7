"""The policy engine on the real broker: a `graylane policy` process, the
in-process router + workers, steady client load and START commands."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import yaml

from graylane import serde
from graylane.engine_worker.faults import FaultInjection
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.audit_replay import load_recorded, verify
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec, Step
from graylane.settings import Settings
from graylane.v1 import rollout_pb2
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.records import send_command, start_command
from tests.support.stack import running_stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"


def spec_of(rollout_id: str, *, dwell_s: float = 2.0) -> RolloutSpec:
    return RolloutSpec(
        rollout_id=rollout_id,
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(10.0, 10, dwell_s), Step(50.0, 10, dwell_s), Step(100.0, 0, 0.0)),
    )


async def test_healthy_canary_is_promoted_and_its_audit_replays(
    settings: Settings,
    factory: KafkaFactory,
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    log = tmp_path / "policy.log"
    spec = spec_of("r-healthy")
    async with running_stack(factory, model=MODEL, versions=models, stable="v1"):
        with policy_engine(settings, log, MODEL):
            await wait_ready(log)
            async with RoutingWatch(factory, MODEL) as watch, steady_load(factory, MODEL):
                t0 = time.time()
                await send_command(factory, start_command(spec))
                _, final = await watch.until(lambda t: t.stable_version == "v2", 60)
                t1 = time.time()
    assert watch.weight(final, "v2") == 100.0
    epochs = [t.epoch for _, t in watch.tables]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)
    assert [watch.weight(t, "v2") for _, t in watch.tables] == [10.0, 50.0, 100.0]
    states = await read_latest_per_key(factory, factory.layout.rollouts())
    state = serde.decode(rollout_pb2.RolloutState, states[b"r-healthy"])
    assert state.phase == rollout_pb2.PROMOTED

    # Replay: the recorded decisions come out of the pure controllers again.
    recorded = await load_recorded(
        factory, MODEL, "r-healthy", int(t0 * 1000) - 1000, int(t1 * 1000) + 5000
    )
    kinds = [r.kind for r in recorded]
    assert kinds[0] == 1 and kinds[-1] == 5  # STARTED ... PROMOTE
    assert verify(recorded) == []
    # The check has teeth: a tampered record is caught.
    recorded[-1].reason = "edited"
    assert [m.field for m in verify(recorded)] == ["reason"]

    # The same through the CLI, reading the real topics by timestamp.
    from graylane.app.cli.main import main

    monkeypatch.setenv("GRAYLANE_TOPIC_PREFIX", settings.topic_prefix)
    monkeypatch.setenv("GRAYLANE_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("COLUMNS", "200")
    window = [
        "--model",
        MODEL,
        "--rollout",
        "r-healthy",
        "--from",
        str(int(t0 * 1000) - 1000),
        "--to",
        str(int(t1 * 1000) + 5000),
    ]
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["audit", "replay", *window]) == 0
    timeline = capsys.readouterr().out
    for decision in ("rollout_started", "advance", "promote"):
        assert decision in timeline, timeline
    assert await asyncio.to_thread(main, ["audit", "verify", *window]) == 0
    verdict = capsys.readouterr().out
    assert f"{len(kinds)} recorded decision(s): the controllers decide the same" in verdict
    assert await asyncio.to_thread(main, ["audit", "replay", *window, "-o", "json"]) == 0
    timeline_doc = json.loads(capsys.readouterr().out)
    assert timeline_doc["kind"] == "AuditTimeline"
    decided = [d["kind"] for d in timeline_doc["object"]["decisions"]]
    assert {"DECISION_ROLLOUT_STARTED", "DECISION_ADVANCE", "DECISION_PROMOTE"} <= set(decided)
    assert timeline_doc["object"]["telemetry"]  # the range's batches, per version/variant
    assert await asyncio.to_thread(main, ["audit", "verify", *window, "-o", "yaml"]) == 0
    verification = yaml.safe_load(capsys.readouterr().out)
    assert verification["kind"] == "AuditVerification"
    assert verification["object"]["decisions"] == len(kinds)
    assert verification["object"]["mismatches"] == []


async def test_bad_candidate_is_rolled_back(
    settings: Settings, factory: KafkaFactory, models: dict[str, Path], tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    log = tmp_path / "policy.log"
    faults = {"v2": FaultInjection(error_rate=0.3)}
    async with running_stack(factory, model=MODEL, versions=models, stable="v1", faults=faults):
        with policy_engine(settings, log, MODEL):
            await wait_ready(log)
            async with RoutingWatch(factory, MODEL) as watch, steady_load(factory, MODEL):
                await send_command(factory, start_command(spec_of("r-bad", dwell_s=30.0)))
                # How fast this happens is measured by `graylane bench rollback`, not here.
                await watch.until(lambda t: watch.weight(t, "v2") > 0, 30)
                _, table = await watch.until(
                    lambda t: watch.weight(t, "v2") == 0.0 and t.epoch > 1, 30
                )
    assert table.stable_version == "v1"
    states = await read_latest_per_key(factory, factory.layout.rollouts())
    state = serde.decode(rollout_pb2.RolloutState, states[b"r-bad"])
    assert state.phase == rollout_pb2.ROLLED_BACK


async def test_restart_resumes_the_rollout(
    settings: Settings, factory: KafkaFactory, models: dict[str, Path], tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    log = tmp_path / "policy.log"
    spec = spec_of("r-restart", dwell_s=4.0)
    async with (
        running_stack(factory, model=MODEL, versions=models, stable="v1"),
        RoutingWatch(factory, MODEL) as watch,
        steady_load(factory, MODEL),
    ):
        with policy_engine(settings, log, MODEL) as first:
            await wait_ready(log)
            await send_command(factory, start_command(spec))
            await watch.until(lambda t: watch.weight(t, "v2") == 10.0, 30)
        assert first.returncode == 0  # stopped cleanly by SIGTERM mid-rollout
        seen_before = len(watch.tables)
        log2 = tmp_path / "policy-2.log"
        with policy_engine(settings, log2, MODEL):
            await wait_ready(log2)
            _, final = await watch.until(lambda t: t.stable_version == "v2", 60)
    assert seen_before >= 1 and watch.weight(final, "v2") == 100.0
    epochs = [t.epoch for _, t in watch.tables]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)  # never back
    recorded = await load_recorded(factory, MODEL, "r-restart")
    starts = [r for r in recorded if r.kind == 1]
    assert len(starts) == 1  # the START was not applied twice
    assert verify(recorded) == []
