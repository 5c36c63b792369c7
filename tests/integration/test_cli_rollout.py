"""A rollout driven entirely from the CLI: start, watch, pause, resume, promote —
through the control plane (gRPC), the commands topic, the policy engine and the
router, with real workers serving steady load on the real broker."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from graylane import serde
from graylane.app.cli.main import main
from graylane.artifacts.naming import ArtifactName, Backend, Precision, parse_semver
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.registry import ArtifactRecord, ValidationSummary, open_registry
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.settings import Settings
from graylane.v1 import rollout_pb2
from tests.conftest import ROOT
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "cli-gpt"
BASE, CANDIDATE = "1.0.0", "1.1.0"


def register(settings: Settings) -> None:
    registry = open_registry(settings.db_url)
    registry.register_model(MODEL, "driven from the CLI")
    for version in (BASE, CANDIDATE):
        registry.register_version(MODEL, version, "a" * 64)
    registry.set_stable(MODEL, BASE)
    name = ArtifactName(
        MODEL, Backend.ONNXRUNTIME, "1.32.0", Precision.FP32, "ptq", parse_semver(CANDIDATE)
    )
    registry.add_artifact(
        ArtifactRecord(
            name=name,
            path="/artifacts/x",
            manifest_sha256="f" * 64,
            servable=True,
            validation=ValidationSummary(passed=True),
        )
    )
    registry.engine.dispose()


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert await asyncio.to_thread(main, list(argv)) == 0
    return capsys.readouterr().out


async def phase_of(factory: KafkaFactory, rollout_id: str) -> int:
    states = await read_latest_per_key(factory, factory.layout.rollouts())
    raw = states.get(rollout_id.encode())
    return serde.decode(rollout_pb2.RolloutState, raw).phase if raw else 0


async def until_phase(factory: KafkaFactory, rollout_id: str, phase: int) -> None:
    async def reached() -> bool:
        return await phase_of(factory, rollout_id) == phase

    await wait_until(reached, timeout=30, what=f"{rollout_id} in phase {phase}")


async def until_stored_phase(server: ControlPlaneServer, rollout_id: str, phase: int) -> None:
    """The control plane's store (fed from the rollouts topic by its sink) shows `phase`."""

    def stored() -> bool:
        got = server.store.get_rollout(rollout_id)
        return got is not None and got.state.phase == phase

    await wait_until(stored, timeout=30, what=f"control plane sees {rollout_id} in {phase}")


async def test_a_rollout_driven_entirely_from_the_cli(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(settings)
    paths = {
        BASE: write_demo_gpt(tmp_path / "base.onnx", "tiny", seed=1),
        CANDIDATE: write_demo_gpt(tmp_path / "candidate.onnx", "tiny", seed=2),
    }
    server = ControlPlaneServer(
        ServerConfig(
            host="127.0.0.1",
            port=0,
            tokens=TokenTable(parse_tokens("ops-token-0123456:operator:alice")),
        ),
        factory,
    )
    await server.start()
    await asyncio.wait_for(server.sink.ready.wait(), 30)
    env = {
        "GRAYLANE_CP_ADDR": f"127.0.0.1:{server.port}",
        "GRAYLANE_CP_TOKEN": "ops-token-0123456",
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "COLUMNS": "200",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    watch_log = tmp_path / "watch.log"
    with watch_log.open("wb") as watch_out:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "graylane.app.cli.main", "rollout", "watch", "--model", MODEL],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=watch_out,
            stderr=subprocess.STDOUT,
        )
    try:
        async with running_stack(factory, model=MODEL, versions=paths, stable=BASE):
            with policy_engine(settings, tmp_path / "policy.log", MODEL):
                await wait_ready(tmp_path / "policy.log")
                async with RoutingWatch(factory, MODEL) as routing, steady_load(factory, MODEL):
                    out = await cli(
                        capsys,
                        "rollout",
                        "start",
                        "--model",
                        MODEL,
                        "--candidate",
                        CANDIDATE,
                        "--steps",
                        "10,50,100",
                        "--min-samples",
                        "10",
                        "--dwell-s",
                        "60",
                    )
                    match = re.search(r"ro-[\w.:-]+", out)
                    assert match, out
                    rollout_id = match.group(0)
                    await routing.until(lambda t: routing.weight(t, CANDIDATE) == 10.0, 30)

                    await cli(capsys, "rollout", "pause", rollout_id, "--reason", "look first")
                    await until_phase(factory, rollout_id, rollout_pb2.PAUSED)
                    await until_stored_phase(server, rollout_id, rollout_pb2.PAUSED)
                    status = await cli(capsys, "rollout", "status", rollout_id)
                    assert "paused" in status

                    await cli(capsys, "rollout", "resume", rollout_id)
                    await until_phase(factory, rollout_id, rollout_pb2.PROGRESSING)

                    await cli(capsys, "rollout", "promote", rollout_id, "--reason", "looks good")
                    _, final = await routing.until(lambda t: t.stable_version == CANDIDATE, 30)
                    await until_phase(factory, rollout_id, rollout_pb2.PROMOTED)
                    await until_stored_phase(server, rollout_id, rollout_pb2.PROMOTED)
        assert routing.weight(final, CANDIDATE) == 100.0
        listed = await cli(capsys, "rollout", "list", "--model", MODEL)
        assert rollout_id in listed and "promoted" in listed
        await wait_until(
            lambda: "promoted" in watch_log.read_text(errors="replace"),
            timeout=20,
            what="the watcher printed the promotion",
        )
    finally:
        watcher.terminate()
        watcher.wait(timeout=20)
        watched = watch_log.read_text(errors="replace")
        await server.stop(0)
    for phase in ("progressing", "paused", "promoted"):
        assert phase in watched, watched
