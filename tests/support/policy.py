"""Test helpers around the policy engine: a `graylane policy` process, a watch on
the routing topic, and steady client load."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from graylane import serde
from graylane.client import GraylaneClient
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import KafkaFactory, Record
from graylane.settings import Settings
from graylane.v1 import control_pb2
from tests.conftest import ROOT
from tests.support.waiting import wait_until

WINDOW_MS, STEP_MS = 4000, 1000


@contextlib.contextmanager
def policy_engine(
    settings: Settings, log: Path, model: str, *extra_args: str
) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(
        os.environ,
        GRAYLANE_TOPIC_PREFIX=settings.topic_prefix,
        GRAYLANE_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
        GRAYLANE_PARTITIONS=str(settings.partitions),
        # faust's data directory goes under TMPDIR: keep it next to the log, in the test's tmp.
        TMPDIR=str(log.parent),
    )
    cmd = [
        sys.executable,
        "-m",
        "graylane.app.cli.policy",
        "--model",
        model,
        "--window-ms",
        str(WINDOW_MS),
        "--step-ms",
        str(STEP_MS),
        *extra_args,
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
    def restored() -> bool:
        return log.exists() and log.read_text(errors="replace").count("restored ") >= 1

    try:
        await wait_until(restored, timeout=timeout_s, poll_s=0.3)
    except TimeoutError:
        raise TimeoutError(log.read_text(errors="replace")[-3000:]) from None


class RoutingWatch:
    """Every routing table written for a model, with the local time it was seen."""

    def __init__(self, factory: KafkaFactory, model: str) -> None:
        self.factory = factory
        self.model = model
        self.tables: list[tuple[float, control_pb2.RoutingTable]] = []
        self._follower = TopicFollower(
            factory,
            factory.layout.routing(),
            self._seen,
            start_at=FollowFrom.BEGINNING,
            client_suffix="watch",
            poll_ms=100,
        )

    def _seen(self, record: Record) -> None:
        if record.key != self.model.encode():  # another model's table (or a bad record)
            return
        table = serde.decode(control_pb2.RoutingTable, record.value)
        if table.model == self.model:
            self.tables.append((time.monotonic(), table))

    async def __aenter__(self) -> RoutingWatch:
        await self._follower.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._follower.stop()

    def weight(self, table: control_pb2.RoutingTable, version: str) -> float:
        return sum(r.weight_percent for r in table.routes if r.version == version)

    async def until(
        self, predicate: Callable[[control_pb2.RoutingTable], bool], timeout_s: float
    ) -> tuple[float, control_pb2.RoutingTable]:
        found: list[tuple[float, control_pb2.RoutingTable]] = []

        def matched() -> bool:
            found[:] = [(seen, table) for seen, table in self.tables if predicate(table)][:1]
            return bool(found)

        with contextlib.suppress(TimeoutError):
            await wait_until(matched, timeout=timeout_s, poll_s=0.1)
        if found:
            return found[0]
        summary = [
            (t.epoch, t.stable_version, [(r.version, r.weight_percent) for r in t.routes])
            for _, t in self.tables
        ]
        raise AssertionError(f"no matching table within {timeout_s}s; saw {summary}")


@contextlib.asynccontextmanager
async def steady_load(
    factory: KafkaFactory, model: str, rps: float = 40.0, *, client_id: str | None = None
) -> AsyncIterator[None]:
    async with GraylaneClient(factory, client_id=client_id) as client:
        stop = asyncio.Event()

        async def run() -> None:
            i = 0
            while not stop.is_set():
                await client.submit(model, token_ids=[1, 2, 3, i % 200], routing_key=f"user-{i}")
                i += 1
                await asyncio.sleep(1.0 / rps)

        task = asyncio.create_task(run())
        try:
            yield
        finally:
            stop.set()
            await task
