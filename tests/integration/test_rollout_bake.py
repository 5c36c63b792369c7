"""The bake period on the real broker: a Rollout document with ``bake`` applied through
the CLI and the control plane, a `graylane policy` process judging the telemetry the
test writes on the telemetry topic. A regression of the promoted version during the
bake rolls it back to the previous stable version (routing table, registry stable,
audit, webhook); a clean bake ends baked, also across a restart of the policy engine
in the middle of it."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from graylane import serde
from graylane.clock import now_ms
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.seam import KafkaFactory
from graylane.notifications.sender import SenderPolicy
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.registry import open_registry
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.settings import Settings
from graylane.v1 import audit_pb2, rollout_pb2, telemetry_pb2
from tests.integration.test_cli_rollout import register
from tests.integration.test_releases_as_code import (
    BASE,
    CANDIDATE,
    MODEL,
    OPERATOR,
    audit_of,
    cli,
    phase_of,
    until_phase,
    webhook_receiver,
)
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BATCH = 20  # requests per telemetry record
PERIOD_S = 0.2  # one record per serving version this often: 100 requests/s each


@dataclass
class TelemetryFeed:
    """Worker telemetry of the versions in ``serving``, written to the telemetry topic:
    latencies around 20 ms for every version, times ``slow[version]``, and
    ``errors[version]`` of each batch failing."""

    serving: set[str]
    slow: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(11))
    sent: int = 0

    def record(self, version: str) -> bytes:
        done = now_ms()
        h = LatencyHistogram()
        center = math.log(20.0 * self.slow.get(version, 1.0))
        h.record_many(self.rng.lognormvariate(center, 0.2) for _ in range(BATCH))
        failed = round(BATCH * self.errors.get(version, 0.0))
        return serde.encode(
            telemetry_pb2.BatchTelemetry(
                model=MODEL,
                version=version,
                variant="fp32",
                worker_id=f"w-{version}",
                batch_size=BATCH,
                request_count=BATCH,
                error_count=failed,
                error_codes={"ENGINE_FAILURE": failed} if failed else {},
                latency=histogram_to_pb(h),
                queue_wait_ms_mean=1.0,
                compute_ms=5.0,
                started_at_unix_ms=done - 25,
                completed_at_unix_ms=done,
            )
        )

    async def run(self, factory: KafkaFactory, stop: asyncio.Event) -> None:
        producer = factory.producer(client_suffix="test-telemetry")
        await producer.start()
        try:
            while not stop.is_set():
                for version in sorted(self.serving):
                    await producer.send_and_wait(
                        factory.layout.telemetry(),
                        self.record(version),
                        key=f"{MODEL}/{version}".encode(),
                    )
                    self.sent += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), PERIOD_S)
        finally:
            await producer.stop()


@contextlib.asynccontextmanager
async def feeding(factory: KafkaFactory, feed: TelemetryFeed) -> AsyncIterator[TelemetryFeed]:
    stop = asyncio.Event()
    task = asyncio.create_task(feed.run(factory, stop))
    try:
        yield feed
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def control_plane(
    factory: KafkaFactory, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ControlPlaneServer]:
    """The control plane of test_releases_as_code, without the candidate check: no
    worker serves here, the telemetry is the test's."""
    server = ControlPlaneServer(
        ServerConfig(
            host="127.0.0.1",
            port=0,
            tokens=TokenTable(parse_tokens(f"{OPERATOR}:operator:alice")),
            webhooks=SenderPolicy(),
            check_candidates=False,
        ),
        factory,
    )
    await server.start()
    await asyncio.wait_for(server.sink.ready.wait(), 30)
    settings = factory.settings
    for key, value in {
        "GRAYLANE_CP_ADDR": f"127.0.0.1:{server.port}",
        "GRAYLANE_CP_TOKEN": OPERATOR,
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "COLUMNS": "200",
    }.items():
        monkeypatch.setenv(key, value)
    try:
        yield server
    finally:
        await server.stop(0)


def document(name: str, bake: str, port: int) -> str:
    return f"""\
apiVersion: graylane.io/v1
kind: Rollout
metadata:
  name: {name}
spec:
  model: {MODEL}
  baseline: {BASE}
  candidate: {CANDIDATE}
  strategy: canary
  bake: {bake}
  steps:
    - {{weight: 50, samples: 10, dwell: 2s}}
    - {{weight: 100}}
  notifications:
    webhooks:
      - url: http://127.0.0.1:{port}/events
"""


def stable_of(settings: Settings) -> str:
    registry = open_registry(settings.db_url)
    try:
        stable = registry.get_stable(MODEL)
        return str(stable.version) if stable is not None else ""
    finally:
        registry.engine.dispose()


async def until_stable(settings: Settings, version: str) -> None:
    await wait_until(
        lambda: stable_of(settings) == version,
        timeout=30,
        poll_s=0.3,
        what=f"the registry's stable version {version}",
    )


async def test_a_regression_during_bake_rolls_back_to_the_previous_stable(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(settings)
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    name = "bake-regressed"
    log = tmp_path / "policy.log"
    with webhook_receiver() as receiver:
        path = tmp_path / "rollout.yaml"
        path.write_text(document(name, "5m", receiver.port))
        async with (
            control_plane(factory, monkeypatch) as server,
            feeding(factory, TelemetryFeed(serving={BASE, CANDIDATE})) as feed,
        ):
            with policy_engine(settings, log, MODEL):
                await wait_ready(log)
                async with RoutingWatch(factory, MODEL) as routing:
                    await cli(capsys, "apply", "-f", str(path))
                    await until_phase(factory, name, rollout_pb2.BAKING, 60)
                    _, promoted = await routing.until(lambda t: t.stable_version == CANDIDATE, 10)
                    assert routing.weight(promoted, CANDIDATE) == 100.0
                    await until_stable(settings, CANDIDATE)
                    # While baking: the status shows the phase and the time left.
                    status = await cli(capsys, "rollout", "status", name)
                    assert "baking" in status and "s left of 300s" in status, status
                    live = yaml.safe_load(await cli(capsys, "get", "rollout", name, "-o", "yaml"))
                    assert live["spec"]["bake"] == "5m"
                    assert live["status"]["phase"] == "baking"
                    assert 0 < live["status"]["bakeLeftS"] <= 300

                    # The previous stable version is out of the table; the promoted one
                    # regresses: slower, and a third of its requests fail.
                    feed.serving = {CANDIDATE}
                    feed.slow[CANDIDATE] = 5.0
                    feed.errors[CANDIDATE] = 0.3
                    injected_ms = now_ms()
                    await until_phase(factory, name, rollout_pb2.ROLLED_BACK, 60)
                    _, back = await routing.until(
                        lambda t: t.stable_version == BASE and t.epoch > promoted.epoch, 10
                    )
                    await until_stable(settings, BASE)
                    await wait_until(
                        lambda: "rolled_back_in_bake" in receiver.types("/events"),
                        timeout=30,
                        what="the rollback at the webhook",
                    )
                    records = audit_of(server, name)
    assert routing.weight(back, CANDIDATE) == 0.0 and routing.weight(back, BASE) == 100.0
    rollback = next(r for r in records if r.kind == audit_pb2.DECISION_ROLLBACK)
    assert rollback.rollout_before.phase == rollout_pb2.BAKING
    assert rollback.rollout_after.phase == rollout_pb2.ROLLED_BACK
    assert rollback.decided_at_unix_ms >= injected_ms
    assert rollback.reason.startswith(
        f"rolled back {CANDIDATE} during bake, {BASE} at 100% and stable again"
    ), rollback.reason
    # The readings: the previous stable's frozen window against the promoted version's.
    reference, judged = rollback.inputs
    assert reference.version == BASE and judged.version == CANDIDATE
    assert reference.window_end_unix_ms <= rollback.rollout_before.phase_started_at_unix_ms
    assert judged.errors > 0 and judged.p99_ms > 2 * reference.p99_ms
    promote = next(r for r in records if r.kind == audit_pb2.DECISION_PROMOTE)
    assert promote.rollout_after.phase == rollout_pb2.BAKING
    assert "baking 300 s against" in promote.reason
    assert not [r for r in records if r.rule == "baked"]
    events = [t for t in receiver.types("/events") if t not in ("held", "gate_failed")]
    assert events == ["started", "promoted", "rolled_back_in_bake"], events
    # Every recorded decision, the bake's included, replays to the same.
    verified = await cli(
        capsys, "audit", "verify", "--model", MODEL, "--rollout", name, "--from", "1h"
    )
    assert "the controllers decide the same" in verified, verified


async def test_a_clean_bake_ends_baked_across_a_restart(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(settings)
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    name = "bake-clean"
    with webhook_receiver() as receiver:
        path = tmp_path / "rollout.yaml"
        path.write_text(document(name, "12s", receiver.port))
        async with (
            control_plane(factory, monkeypatch) as server,
            feeding(factory, TelemetryFeed(serving={BASE, CANDIDATE})) as feed,
            RoutingWatch(factory, MODEL) as routing,
        ):
            first_log, second_log = tmp_path / "policy-1.log", tmp_path / "policy-2.log"
            with policy_engine(settings, first_log, MODEL) as first:
                await wait_ready(first_log)
                await cli(capsys, "apply", "-f", str(path))
                await until_phase(factory, name, rollout_pb2.BAKING, 60)
                feed.serving = {CANDIDATE}
            assert first.returncode == 0  # stopped by SIGTERM in the middle of the bake
            assert await phase_of(factory, name) == rollout_pb2.BAKING
            with policy_engine(settings, second_log, MODEL):
                await wait_ready(second_log)
                await until_phase(factory, name, rollout_pb2.PROMOTED, 60)
                await wait_until(
                    lambda: "baked" in receiver.types("/events"),
                    timeout=30,
                    what="the bake's end at the webhook",
                )
            await until_stable(settings, CANDIDATE)
            records = audit_of(server, name)
    promote = next(r for r in records if r.kind == audit_pb2.DECISION_PROMOTE)
    baked = next(r for r in records if r.rule == "baked")
    assert baked.kind == audit_pb2.DECISION_PROMOTE
    assert baked.rollout_before.phase == rollout_pb2.BAKING
    assert baked.rollout_after.phase == rollout_pb2.PROMOTED
    # The restarted engine went on with the bake it read back: same end, same reference.
    assert baked.rollout_before.bake_until_unix_ms == promote.rollout_after.bake_until_unix_ms
    assert baked.rollout_before.bake_reference == promote.rollout_after.bake_reference
    assert baked.decided_at_unix_ms >= promote.rollout_after.bake_until_unix_ms
    assert "restored " in second_log.read_text(errors="replace")
    assert not [r for r in records if r.kind == audit_pb2.DECISION_ROLLBACK]
    # No routing change at the end of the bake: the last table is the promotion's.
    last = routing.tables[-1][1]
    assert last.stable_version == CANDIDATE and routing.weight(last, CANDIDATE) == 100.0
    assert last.epoch == promote.rollout_after.epoch
    events = [t for t in receiver.types("/events") if t not in ("held", "gate_failed")]
    assert events == ["started", "promoted", "baked"], events
    verified = await cli(
        capsys, "audit", "verify", "--model", MODEL, "--rollout", name, "--from", "1h"
    )
    assert "the controllers decide the same" in verified, verified
