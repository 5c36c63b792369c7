"""Two policy-engine instances on one prefix: one writes, the other waits and takes over.

The regression: two replicas would both consume commands (split between
them by the consumer group) and both publish. With the lease, the second
instance stays passive (not even in the group) until the first dies, then
takes the lease, restores the state and publishes.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from graylane.clock import now_ms
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec
from graylane.settings import Settings
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.records import read_audits, send_command, start_command
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "lease-gpt"


async def test_a_standby_instance_takes_over_when_the_writer_dies(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    spec = RolloutSpec(
        rollout_id=f"ro-{MODEL}-{uuid.uuid4().hex[:6]}", model=MODEL, baseline="1.0.0",
        candidate="1.1.0",
    )  # fmt: skip
    with policy_engine(settings, a_log, MODEL) as first:
        await wait_ready(a_log)
        with policy_engine(settings, b_log, MODEL):
            await wait_until(
                lambda: "standby" in b_log.read_text(errors="replace"),
                timeout=60,
                what="the second instance waits on the lease",
            )
            async with RoutingWatch(factory, MODEL) as routing:
                await send_command(factory, start_command(spec))
                await routing.until(lambda t: routing.weight(t, "1.1.0") > 0.0, 30)
            assert "restored " not in b_log.read_text(errors="replace")

            first.kill()  # no clean shutdown: the lease must expire on its own
            first.wait(10)
            killed_ms, killed = now_ms(), time.monotonic()

            async def second_published() -> bool:
                return bool(await read_audits(factory, model=MODEL, since_ms=killed_ms))

            await wait_until(
                second_published, timeout=40, poll_s=0.5, what="the standby's first decision"
            )
            took = time.monotonic() - killed
            taken_over = b_log.read_text(errors="replace")
            assert "lease acquired" in taken_over
            assert "restored " in taken_over  # the state rebuilt before the first decision
            print(f"takeover: first publication {took:.1f} s after the kill")
