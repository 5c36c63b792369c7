"""The policy engine on the real broker: a `graylane policy` process, the
in-process router + workers, steady client load and START commands."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from engine_worker.config import FaultInjection
from graylane import serde
from graylane.client import GraylaneClient
from graylane.demo.gpt import write_demo_gpt
from graylane.kafka.admin import read_latest_per_key, wait_for_assignment
from graylane.kafka.factory import ConsumerOptions, KafkaFactory
from graylane.settings import Settings
from graylane.v1 import control_pb2, rollout_pb2
from policy_engine import convert
from policy_engine.app import PolicyConfig, prepare_topics
from policy_engine.audit_replay import load_recorded, verify
from policy_engine.logic.rollout_spec import RolloutSpec, Step
from tests.conftest import ROOT
from tests.support.stack import running_stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
WINDOW_MS, STEP_MS = 4000, 1000


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "v1": write_demo_gpt(root / "v1.onnx", "tiny", seed=1),
        "v2": write_demo_gpt(root / "v2.onnx", "tiny", seed=2),
    }


def spec_of(rollout_id: str, *, dwell_s: float = 2.0) -> RolloutSpec:
    return RolloutSpec(
        rollout_id=rollout_id,
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(10.0, 10, dwell_s), Step(50.0, 10, dwell_s), Step(100.0, 0, 0.0)),
    )


@contextlib.contextmanager
def policy_engine(settings: Settings, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(
        os.environ,
        GRAYLANE_TOPIC_PREFIX=settings.topic_prefix,
        GRAYLANE_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
        GRAYLANE_PARTITIONS=str(settings.partitions),
    )
    cmd = [
        sys.executable,
        "-m",
        "graylane.cli.policy",
        "--model",
        MODEL,
        "--window-ms",
        str(WINDOW_MS),
        "--step-ms",
        str(STEP_MS),
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_ready(log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and log.read_text(errors="replace").count("restored ") >= 1:
            return
        await asyncio.sleep(0.3)
    raise TimeoutError(log.read_text(errors="replace")[-3000:])


async def send_command(factory: KafkaFactory, cmd: rollout_pb2.RolloutCommand) -> None:
    producer = factory.producer()
    await producer.start()
    try:
        await producer.send_and_wait(
            factory.layout.commands(), serde.encode(cmd), key=MODEL.encode()
        )
    finally:
        await producer.stop()


def start_command(spec: RolloutSpec) -> rollout_pb2.RolloutCommand:
    return rollout_pb2.RolloutCommand(
        command_id=f"c-{spec.rollout_id}",
        rollout_id=spec.rollout_id,
        model=MODEL,
        kind=rollout_pb2.COMMAND_START,
        spec=convert.rollout_spec_to_pb(spec),
        issued_by="test",
        issued_at_unix_ms=int(time.time() * 1000),
    )


class RoutingWatch:
    """Every routing table written for MODEL, with the local time it was seen."""

    def __init__(self, factory: KafkaFactory) -> None:
        self.factory = factory
        self.tables: list[tuple[float, control_pb2.RoutingTable]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RoutingWatch:
        consumer = self.factory.consumer(
            self.factory.layout.routing(),
            options=ConsumerOptions(group_id=None),
            client_suffix="watch",
        )
        await consumer.start()
        tps = await wait_for_assignment(consumer)
        await consumer.seek_to_beginning(*tps)

        async def run() -> None:
            try:
                while True:
                    for records in (await consumer.getmany(timeout_ms=100)).values():
                        for r in records:
                            table = serde.decode(control_pb2.RoutingTable, r.value)
                            if table.model == MODEL:
                                self.tables.append((time.monotonic(), table))
            finally:
                await consumer.stop()

        self._task = asyncio.create_task(run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def weight(self, table: control_pb2.RoutingTable, version: str) -> float:
        return sum(r.weight_percent for r in table.routes if r.version == version)

    async def until(
        self, predicate: object, timeout_s: float
    ) -> tuple[float, control_pb2.RoutingTable]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for seen, table in self.tables:
                if predicate(table):  # type: ignore[operator]
                    return seen, table
            await asyncio.sleep(0.1)
        summary = [
            (t.epoch, t.stable_version, [(r.version, r.weight_percent) for r in t.routes])
            for _, t in self.tables
        ]
        raise AssertionError(f"no matching table within {timeout_s}s; saw {summary}")


@contextlib.asynccontextmanager
async def steady_load(factory: KafkaFactory, rps: float = 40.0) -> AsyncIterator[None]:
    async with GraylaneClient(factory) as client:
        stop = asyncio.Event()

        async def run() -> None:
            i = 0
            while not stop.is_set():
                await client.submit(MODEL, token_ids=[1, 2, 3, i % 200], routing_key=f"user-{i}")
                i += 1
                await asyncio.sleep(1.0 / rps)

        task = asyncio.create_task(run())
        try:
            yield
        finally:
            stop.set()
            await task


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
        with policy_engine(settings, log):
            await wait_ready(log)
            async with RoutingWatch(factory) as watch, steady_load(factory):
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
    from graylane.cli.main import main

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
    for decision in ("ROLLOUT_STARTED", "ADVANCE", "PROMOTE"):
        assert decision in timeline, timeline
    assert await asyncio.to_thread(main, ["audit", "verify", *window]) == 0
    verdict = capsys.readouterr().out
    assert f"{len(kinds)} recorded decision(s): the controllers decide the same" in verdict


async def test_bad_candidate_is_rolled_back(
    settings: Settings, factory: KafkaFactory, models: dict[str, Path], tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    log = tmp_path / "policy.log"
    faults = {"v2": FaultInjection(error_rate=0.3)}
    async with running_stack(factory, model=MODEL, versions=models, stable="v1", faults=faults):
        with policy_engine(settings, log):
            await wait_ready(log)
            async with RoutingWatch(factory) as watch, steady_load(factory):
                await send_command(factory, start_command(spec_of("r-bad", dwell_s=30.0)))
                onset, _ = await watch.until(lambda t: watch.weight(t, "v2") > 0, 30)
                back, table = await watch.until(
                    lambda t: watch.weight(t, "v2") == 0.0 and t.epoch > 1, 30
                )
    elapsed = back - onset
    print(f"bad candidate onset -> rollback routing update: {elapsed:.2f} s")
    assert elapsed < 20.0  # two disjoint failing 4 s windows (failures_to_rollback=2)
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
        RoutingWatch(factory) as watch,
        steady_load(factory),
    ):
        with policy_engine(settings, log) as first:
            await wait_ready(log)
            await send_command(factory, start_command(spec))
            await watch.until(lambda t: watch.weight(t, "v2") == 10.0, 30)
        assert first.returncode == 0  # stopped cleanly by SIGTERM mid-rollout
        seen_before = len(watch.tables)
        log2 = tmp_path / "policy-2.log"
        with policy_engine(settings, log2):
            await wait_ready(log2)
            _, final = await watch.until(lambda t: t.stable_version == "v2", 60)
    assert seen_before >= 1 and watch.weight(final, "v2") == 100.0
    epochs = [t.epoch for _, t in watch.tables]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)  # never back
    recorded = await load_recorded(factory, MODEL, "r-restart")
    starts = [r for r in recorded if r.kind == 1]
    assert len(starts) == 1  # the START was not applied twice
    assert verify(recorded) == []
