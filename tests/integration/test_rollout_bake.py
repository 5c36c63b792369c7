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
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.settings import Settings
from graylane.v1 import audit_pb2, rollout_pb2, telemetry_pb2
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.releases import (
    BASE,
    CANDIDATE,
    MODEL,
    assert_replays_the_same,
    audit_of,
    cli,
    control_plane,
    phase_of,
    register,
    rollout_document,
    until_phase,
    until_stable,
    webhook_receiver,
)
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


def document(name: str, bake: str, port: int) -> str:
    return rollout_document(
        name,
        "    - {weight: 50, samples: 10, dwell: 2s}\n    - {weight: 100}\n",
        webhooks=f"      - url: http://127.0.0.1:{port}/events\n",
        bake=bake,
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
        # No worker serves here, the telemetry is the test's: no candidate check.
        async with (
            control_plane(factory, monkeypatch, check_candidates=False) as server,
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
    await assert_replays_the_same(capsys, name)


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
            control_plane(factory, monkeypatch, check_candidates=False) as server,
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
    await assert_replays_the_same(capsys, name)
