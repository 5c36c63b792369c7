"""The policy engine on the real broker takes records it cannot fully interpret and keeps
deciding; shadow pairs are the router's, not the client's request ids.

No router or workers: the test writes what they would (shadow results, telemetry) and
what a newer writer or a broken one might (unknown enum values and fields, garbage)
straight onto the topics the engine reads.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from graylane import serde
from graylane.clock import now_ms
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.admin import partition_counts
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import ConsumerOptions, KafkaFactory
from graylane.policy_engine.lease import LeaseKeeper
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec, Strategy
from graylane.settings import Settings
from graylane.v1 import audit_pb2, inference_pb2, rollout_pb2, telemetry_pb2, tensor_pb2
from tests.support.newer_records import UNKNOWN, with_enum, with_unknown_fields
from tests.support.policy import policy_engine, wait_ready
from tests.support.records import produce, read_audits, send_command, start_command
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "compat-gpt"
BASE, CANDIDATE = "1.0.0", "1.1.0"


def shadow_spec() -> RolloutSpec:
    return RolloutSpec(
        rollout_id=f"ro-{MODEL}-{uuid.uuid4().hex[:6]}",
        model=MODEL,
        baseline=BASE,
        candidate=CANDIDATE,
        strategy=Strategy.SHADOW_THEN_CANARY,
        shadow_share=0.5,
        shadow_duration_s=1.0,
    )


async def phase_of(factory: KafkaFactory, rollout_id: str) -> int:
    states = await read_latest_per_key(factory, factory.layout.rollouts())
    raw = states.get(rollout_id.encode())
    return serde.decode(rollout_pb2.RolloutState, raw).phase if raw else 0


def result(rid: str, version: str, pair_id: str, post: int) -> bytes:
    """A worker's result on the shadow topic, its outputs as ``post`` makes them."""
    pb = inference_pb2.InferenceResult(
        request_id=rid,
        model=MODEL,
        version=version,
        status=inference_pb2.OK,
        shadow_pair_id=pair_id,
    )
    if post == inference_pb2.ARGMAX_LAST:
        pb.outputs.add(name="argmax", dtype=tensor_pb2.INT64, shape=[1], data=b"\0" * 8)
    else:
        pb.outputs.add(name="topk_indices", dtype=tensor_pb2.INT64, shape=[1, 5], data=b"\0" * 40)
        pb.outputs.add(name="topk_values", dtype=tensor_pb2.FLOAT32, shape=[1, 5], data=b"\0" * 20)
    return serde.encode(pb)


async def consumed(factory: KafkaFactory, settings: Settings, topic: str) -> bool:
    """Whether the engine's group committed ``topic`` to its end (every record processed)."""
    (count,) = (await partition_counts(factory, [topic])).values()
    tps = [TopicPartition(topic, p) for p in range(count)]
    consumer = factory.consumer(options=ConsumerOptions(group_id=None), client_suffix="test-ends")
    admin = factory.admin()
    await consumer.start()
    await admin.start()
    try:
        ends = await consumer.end_offsets(tps)
        group = f"{settings.topic_prefix}-policy"
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        return all(
            ends[tp] == 0 or (committed.get(tp) is not None and committed[tp].offset >= ends[tp])
            for tp in tps
        )
    finally:
        await consumer.stop()
        await admin.close()


async def test_one_request_id_with_two_post_processings_never_aborts_the_shadow(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    """Shadow pairs used to be keyed by the client's request id: two requests with one id
    and different post-processing, answered out of order, paired an argmax answer with a
    top-k one, a "schema mismatch" that aborted the rollout. Paired on the router's pair
    ids, each answer meets its own other half and the shadow goes on."""
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    spec = shadow_spec()
    log = tmp_path / "policy.log"
    with policy_engine(settings, log, MODEL) as proc:
        await wait_ready(log)
        await send_command(factory, start_command(spec))

        async def shadowing() -> bool:
            return await phase_of(factory, spec.rollout_id) == rollout_pb2.SHADOWING

        await wait_until(shadowing, timeout=40, poll_s=0.5, what="the shadow started")
        argmax, topk = inference_pb2.ARGMAX_LAST, inference_pb2.TOPK_LAST
        await produce(
            factory,
            factory.layout.shadow(MODEL),
            result("dup", BASE, "0-10-1", argmax),
            result("dup", CANDIDATE, "0-11-1", topk),
            result("dup", BASE, "0-11-1", topk),
            result("dup", CANDIDATE, "0-10-1", argmax),
            key="dup",  # one partition: read in this order
        )

        async def taken() -> bool:
            return await consumed(factory, settings, factory.layout.shadow(MODEL))

        await wait_until(taken, timeout=40, poll_s=0.5, what="the shadow results consumed")
        # Stats on both sides (the candidate's in its shadow lane) let the engine judge
        # the shadow: its next decision is on record with the pairs it saw, or, if it
        # paired an argmax answer with a top-k one, as "incomparable".
        await produce(
            factory,
            factory.layout.telemetry(),
            telemetry(BASE),
            telemetry(CANDIDATE, shadow=True),
            key=MODEL,
        )
        judged: list[audit_pb2.AuditRecord] = []

        async def decided_on_the_pairs() -> bool:
            judged[:] = [
                a
                for a in await read_audits(factory, rollout_id=spec.rollout_id)
                if a.agreement.pairs >= 2 or a.rule == "incomparable"
            ]
            return bool(judged)

        await wait_until(decided_on_the_pairs, timeout=40, poll_s=0.5, what="a shadow decision")
        assert proc.poll() is None
        assert await phase_of(factory, spec.rollout_id) != rollout_pb2.ABORTED
    assert [a.rule for a in judged if a.rule == "incomparable"] == [], judged
    assert judged[0].agreement.pairs == judged[0].agreement.agreeing == 2, judged[0].agreement
    audits = await read_audits(factory, model=MODEL)
    assert not [a for a in audits if a.rule == "incomparable"]


def telemetry(version: str, *, shadow: bool = False) -> bytes:
    h = LatencyHistogram()
    for _ in range(12):
        h.record(5.0)
    at = now_ms()
    return serde.encode(
        telemetry_pb2.BatchTelemetry(
            model=MODEL, version=version, variant="fp32", worker_id=f"w-{version}",
            batch_size=12, request_count=12, latency=histogram_to_pb(h),
            started_at_unix_ms=at - 5, completed_at_unix_ms=at,
            shadow_count=12 if shadow else 0,
        )
    )  # fmt: skip


async def test_records_of_a_newer_writer_and_garbage_leave_the_engine_deciding(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    """A bad record on the lease topic used to end the engine before it started (and on
    every restart); a START with a strategy this build does not know used to run as a
    canary. Here the engine starts, refuses that START, takes telemetry with unknown
    fields, skips garbage and an unknown command kind, and still starts the next rollout."""
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    keeper = LeaseKeeper(factory, "test")
    await keeper.prepare()
    await produce(factory, keeper.topic, b"\xff\xfe not a lease", key="policy-engine")
    await produce(factory, keeper.topic, b"\x0a\xff\xff", key="other")
    spec = shadow_spec()
    newer = start_command(replace(spec, rollout_id=f"{spec.rollout_id}-newer"))
    newer.spec.strategy = UNKNOWN  # type: ignore[assignment]
    kind = rollout_pb2.RolloutCommand.DESCRIPTOR.fields_by_name["kind"].number
    unknown_kind = with_enum(
        serde.encode(rollout_pb2.RolloutCommand(command_id="c-kind", model=MODEL)), kind
    )
    log = tmp_path / "policy.log"
    with policy_engine(settings, log, MODEL) as proc:
        await wait_ready(log)
        await produce(
            factory,
            factory.layout.telemetry(),
            with_unknown_fields(telemetry(BASE)),
            b"\xff\xfe garbage",
            key=MODEL,
        )
        await produce(factory, factory.layout.commands(), unknown_kind, key=MODEL)
        await send_command(factory, newer)
        await send_command(factory, start_command(spec))

        async def shadowing() -> bool:
            return await phase_of(factory, spec.rollout_id) == rollout_pb2.SHADOWING

        await wait_until(shadowing, timeout=60, poll_s=0.5, what="the valid rollout started")
        assert proc.poll() is None
    audits = await read_audits(factory, model=MODEL)
    rejected = {a.command_id: a.reason for a in audits if a.rule == "command_rejected"}
    assert f"unknown command kind {UNKNOWN}" in rejected["c-kind"]
    assert "not known to this build" in rejected[newer.command_id]
