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

from graylane.app.cli.main import main
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.settings import Settings
from graylane.v1 import rollout_pb2
from tests.conftest import ROOT
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.releases import (
    BASE,
    CANDIDATE,
    MODEL,
    control_plane,
    demo_versions,
    register,
    until_phase,
    until_stored_phase,
)
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Its stdout only: what the assertions read is what the command printed there."""
    capsys.readouterr()
    assert await asyncio.to_thread(main, list(argv)) == 0
    return capsys.readouterr().out


async def test_a_rollout_driven_entirely_from_the_cli(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(settings)
    paths = demo_versions(tmp_path)
    async with control_plane(factory, monkeypatch) as server:
        await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
        watch_log = tmp_path / "watch.log"
        with watch_log.open("wb") as watch_out:
            watcher = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "graylane.app.cli.main",
                    "rollout",
                    "watch",
                    "--model",
                    MODEL,
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
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

                        await cli(
                            capsys, "rollout", "promote", rollout_id, "--reason", "looks good"
                        )
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
    for phase in ("progressing", "paused", "promoted"):
        assert phase in watched, watched
