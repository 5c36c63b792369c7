"""The policy engine on the real broker: incomparable shadows and refused precision switches.

No router or workers: the test writes what they would (shadow results,
batch telemetry) straight onto the topics the engine reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from graylane import serde
from graylane.clock import now_ms
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.reading import read_latest_per_key, read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine import convert
from graylane.policy_engine.app import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec, Strategy
from graylane.settings import Settings
from graylane.v1 import audit_pb2, inference_pb2, rollout_pb2, telemetry_pb2, tensor_pb2
from tests.support.policy import policy_engine, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "ack-gpt"
BASE, CANDIDATE = "1.0.0", "1.1.0"


async def produce(factory: KafkaFactory, topic: str, key: str, values: list[bytes]) -> None:
    producer = factory.producer(client_suffix="test-writer")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


async def audits(factory: KafkaFactory) -> list[audit_pb2.AuditRecord]:
    records = await read_to_end(factory, factory.layout.audit(), client_suffix="test-audit")
    decoded = [serde.decode(audit_pb2.AuditRecord, r.value) for r in records if r.value]
    return [a for a in decoded if a.model == MODEL]


def result(rid: str, version: str, classes: int) -> bytes:
    pb = inference_pb2.InferenceResult(
        request_id=rid, model=MODEL, version=version, status=inference_pb2.OK
    )
    pb.outputs.add(name="logits", dtype=tensor_pb2.FLOAT32, shape=[1, classes], data=b"\0" * 4)
    return serde.encode(pb)


async def test_a_shadow_with_different_output_shapes_is_incomparable_and_stops(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    spec = RolloutSpec(
        rollout_id=f"ro-{MODEL}-{uuid.uuid4().hex[:6]}",
        model=MODEL,
        baseline=BASE,
        candidate=CANDIDATE,
        strategy=Strategy.SHADOW_THEN_CANARY,
        shadow_share=0.5,
        shadow_duration_s=1.0,
    )
    start = rollout_pb2.RolloutCommand(
        command_id=uuid.uuid4().hex,
        rollout_id=spec.rollout_id,
        model=MODEL,
        kind=rollout_pb2.COMMAND_START,
        spec=convert.rollout_spec_to_pb(spec),
    )
    with policy_engine(settings, tmp_path / "policy.log", MODEL):
        await wait_ready(tmp_path / "policy.log")
        await produce(factory, factory.layout.commands(), MODEL, [serde.encode(start)])

        async def phase() -> int:
            states = await read_latest_per_key(factory, factory.layout.rollouts())
            raw = states.get(spec.rollout_id.encode())
            return serde.decode(rollout_pb2.RolloutState, raw).phase if raw else 0

        async def shadowing() -> bool:
            return await phase() == rollout_pb2.SHADOWING

        await wait_until(shadowing, timeout=40, poll_s=0.5, what="the shadow started")
        # a new head with more classes: 10 vs 11
        rid = uuid.uuid4().hex
        await produce(
            factory,
            factory.layout.shadow(MODEL),
            rid,
            [result(rid, BASE, 10), result(rid, CANDIDATE, 11)],
        )

        async def aborted() -> bool:
            return await phase() == rollout_pb2.ABORTED

        await wait_until(aborted, timeout=40, poll_s=0.5, what="the shadow stopped")
    (rec,) = [a for a in await audits(factory) if a.rule == "incomparable"]
    assert "logits:float32[1,10]" in rec.reason and "logits:float32[1,11]" in rec.reason
    assert rec.agreement.baseline_schema == "logits:float32[1,10]"
    assert rec.rollout_after.phase == rollout_pb2.ABORTED
    assert not [a for a in await audits(factory) if a.kind == audit_pb2.DECISION_PROMOTE]


@contextlib.asynccontextmanager
async def slow_fp32_telemetry(factory: KafkaFactory) -> AsyncIterator[None]:
    """A worker that keeps serving fp32, slowly, whatever it is told."""

    async def run() -> None:
        producer = factory.producer(client_suffix="test-telemetry")
        await producer.start()
        try:
            while True:
                h = LatencyHistogram()
                for _ in range(12):
                    h.record(60.0)
                at = now_ms()
                pb = telemetry_pb2.BatchTelemetry(
                    model=MODEL, version=BASE, variant="fp32", worker_id="w-stubborn",
                    batch_size=12, request_count=12, latency=histogram_to_pb(h),
                    started_at_unix_ms=at - 60, completed_at_unix_ms=at,
                )  # fmt: skip
                await producer.send_and_wait(
                    factory.layout.telemetry(), serde.encode(pb), key=MODEL.encode()
                )
                await asyncio.sleep(0.25)
        finally:
            await producer.stop()

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_worker_that_ignores_a_precision_switch_is_audited_precision_refused(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    policy = rollout_pb2.QosPolicy(
        model=MODEL, version=BASE, slo_p99_ms=20.0, ladder=["fp32", "fp16"], sustain_s=1.0,
        min_dwell_s=1.0, enabled=True,
    )  # fmt: skip
    command = rollout_pb2.RolloutCommand(
        command_id=uuid.uuid4().hex,
        model=MODEL,
        kind=rollout_pb2.COMMAND_SET_QOS_POLICY,
        qos_policy=policy,
    )
    with policy_engine(settings, tmp_path / "policy.log", MODEL):
        await wait_ready(tmp_path / "policy.log")
        async with slow_fp32_telemetry(factory):
            await produce(factory, factory.layout.commands(), MODEL, [serde.encode(command)])

            async def refused() -> bool:
                return any(a.rule == "precision_refused" for a in await audits(factory))

            await wait_until(refused, timeout=60, poll_s=1.0, what="precision_refused on record")
    found = await audits(factory)
    change = [a for a in found if a.kind == audit_pb2.DECISION_PRECISION_CHANGE]
    assert change and change[0].qos_after.active_variant == "fp16"
    (first, *_) = [a for a in found if a.rule == "precision_refused"]
    assert "fp16" in first.reason and "still serve fp32" in first.reason
    assert first.decided_at_unix_ms - change[0].decided_at_unix_ms >= 15_000
