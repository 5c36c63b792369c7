"""Two policy-engine instances on one prefix: one writes, the other waits and takes over.

The regression: two replicas would both consume commands (split between
them by the consumer group) and both publish. With the lease, the second
instance stays passive (not even in the group) until the first dies, then
publishes within the lease period plus its start-up.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from graylane import serde
from graylane.clock import now_ms
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine import convert
from graylane.policy_engine.app import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec
from graylane.settings import Settings
from graylane.v1 import audit_pb2, rollout_pb2
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "lease-gpt"


async def send(factory: KafkaFactory, command: rollout_pb2.RolloutCommand) -> None:
    producer = factory.producer(client_suffix="test-commands")
    await producer.start()
    try:
        await producer.send_and_wait(
            factory.layout.commands(), serde.encode(command), key=command.model.encode()
        )
    finally:
        await producer.stop()


async def audits_since(factory: KafkaFactory, since_ms: int) -> list[audit_pb2.AuditRecord]:
    records = await read_to_end(factory, factory.layout.audit(), client_suffix="test-audit")
    decoded = [serde.decode(audit_pb2.AuditRecord, r.value) for r in records if r.value]
    return [a for a in decoded if a.model == MODEL and a.decided_at_unix_ms >= since_ms]


async def test_a_standby_instance_takes_over_when_the_writer_dies(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    spec = RolloutSpec(
        rollout_id=f"ro-{MODEL}-{uuid.uuid4().hex[:6]}", model=MODEL, baseline="1.0.0",
        candidate="1.1.0",
    )  # fmt: skip
    start = rollout_pb2.RolloutCommand(
        command_id=uuid.uuid4().hex,
        rollout_id=spec.rollout_id,
        model=MODEL,
        kind=rollout_pb2.COMMAND_START,
        spec=convert.rollout_spec_to_pb(spec),
    )
    with policy_engine(settings, a_log, MODEL) as first:
        await wait_ready(a_log)
        with policy_engine(settings, b_log, MODEL):
            await wait_until(
                lambda: "standby" in b_log.read_text(errors="replace"),
                timeout=60,
                what="the second instance waits on the lease",
            )
            async with RoutingWatch(factory, MODEL) as routing:
                await send(factory, start)
                await routing.until(lambda t: routing.weight(t, "1.1.0") > 0.0, 30)
            assert "restored " not in b_log.read_text(errors="replace")

            first.kill()  # no clean shutdown: the lease must expire on its own
            first.wait(10)
            killed_ms, killed = now_ms(), time.monotonic()

            async def second_published() -> bool:
                return bool(await audits_since(factory, killed_ms))

            await wait_until(
                second_published, timeout=40, poll_s=0.5, what="the standby's first decision"
            )
            took = time.monotonic() - killed
            assert "lease acquired" in b_log.read_text(errors="replace")
            assert took <= 20.0, f"takeover took {took:.1f} s"
            print(f"takeover: first publication {took:.1f} s after the kill")
