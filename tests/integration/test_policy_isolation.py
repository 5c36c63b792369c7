"""One bad record never stops the policy engine's decisions for other models (issue 10,
item 2), on the real broker with a real ``graylane policy`` process.

Before the engine starts, the compacted rollouts topic holds an undecodable record
and a decodable but invalid rollout of another model (a step past its spec's end),
the routing topic an undecodable table, and the telemetry topic garbage; more
garbage telemetry and an undecodable command arrive while it runs. Regression: the
start-up restore raised on the first undecodable record, so the engine never decided
anything. Now it skips them (audited as ``record_skipped``), restores, and takes a
live rollout of ``gpt`` from its first step to the next on its own telemetry gates.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from graylane import serde
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine import convert
from graylane.policy_engine.app import PolicyConfig, prepare_topics
from graylane.policy_engine.logic.rollout import start
from graylane.rollouts.spec import RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionRule
from graylane.settings import Settings
from graylane.v1 import audit_pb2
from tests.integration.test_policy_engine import send_command, start_command
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.stack import read_topic, running_stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
GARBAGE = b"\xff\xfe\x00 not a protobuf message \x0a\xff"


async def produce(factory: KafkaFactory, topic: str, key: bytes, *values: bytes) -> None:
    producer = factory.producer()
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def test_garbage_on_control_and_telemetry_topics_never_stops_another_models_rollout(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    layout = factory.layout
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    other = RolloutSpec(rollout_id="r-other", model="other", baseline="v1", candidate="v2")
    invalid = replace(start(other, 1_000).after, step_index=42)
    await produce(factory, layout.rollouts(), b"r-garbage", GARBAGE)
    invalid_pb = convert.rollout_state_to_pb(invalid, other)
    await produce(factory, layout.rollouts(), b"r-other", serde.encode(invalid_pb))
    await produce(factory, layout.routing(), b"junk", GARBAGE)
    await produce(factory, layout.telemetry(), b"gpt/v1", GARBAGE, GARBAGE[:5])
    models = {
        "v1": write_demo_gpt(tmp_path / "v1.onnx", "tiny", seed=1),
        "v2": write_demo_gpt(tmp_path / "v2.onnx", "tiny", seed=2),
    }
    spec = RolloutSpec(
        rollout_id="r-gpt",
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(10.0, 10, 2.0), Step(50.0, 10, 2.0), Step(100.0, 0, 0.0)),
    )
    log = tmp_path / "policy.log"
    async with running_stack(factory, model=MODEL, versions=models, stable="v1"):
        with policy_engine(settings, log, MODEL) as engine:
            await wait_ready(log)
            await produce(factory, layout.telemetry(), b"gpt/v2", GARBAGE)
            await produce(factory, layout.commands(), MODEL.encode(), GARBAGE)
            async with RoutingWatch(factory, MODEL) as watch, steady_load(factory, MODEL):
                await send_command(factory, start_command(spec))
                await watch.until(lambda t: watch.weight(t, "v2") == 10.0, 30)
                # a decision taken at a tick on the live window, not at START
                await watch.until(lambda t: watch.weight(t, "v2") == 50.0, 60)
            assert engine.poll() is None, log.read_text(errors="replace")[-3000:]
    values = await read_topic(factory, layout.audit(), expect=6, timeout_s=30)
    audits = [serde.decode(audit_pb2.AuditRecord, v) for v in values]
    skipped = [a.reason for a in audits if a.rule == DecisionRule.RECORD_SKIPPED]
    assert any(r.startswith("rollouts r-garbage skipped (undecodable)") for r in skipped)
    assert any(r.startswith("rollouts r-other skipped (invalid)") for r in skipped)
    assert any(r.startswith("routing junk skipped (undecodable)") for r in skipped)
    assert any(r.startswith("telemetry skipped (undecodable)") for r in skipped)
    assert any(r.startswith("commands skipped (undecodable)") for r in skipped)
