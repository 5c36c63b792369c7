"""A policy engine killed and restarted in place decides again within 15 s (issue 10, item 3).

The restarted process claims the same instance id as the one it replaces: it
holds the lease on without waiting for it to expire (no "standby" phase) and
rejoins the group as the same static member, without waiting for its dead
self's session to time out. Before, it waited for both.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from graylane.clock import now_ms
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine import convert
from graylane.policy_engine.app import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec
from graylane.settings import Settings
from graylane.v1 import rollout_pb2
from tests.integration.test_policy_single_writer import MODEL, audits_since, send
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TARGET_S = 15.0


async def member_ids(factory: KafkaFactory, group: str) -> list[str]:
    """The member ids of ``group``; a static member's starts with its instance id."""
    admin = factory.admin()
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    return [member[0] for r in responses for g in r.groups for member in g[5]]


async def test_a_restarted_policy_engine_decides_again_within_15_s(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
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
    before, after = tmp_path / "before.log", tmp_path / "after.log"
    with policy_engine(settings, before, MODEL) as first:
        await wait_ready(before)
        async with RoutingWatch(factory, MODEL) as routing:
            await send(factory, start)
            await routing.until(lambda t: routing.weight(t, "1.1.0") > 0.0, 30)
        first.kill()  # kill -9, then the supervisor's restart
        first.wait(10)
    killed_ms, killed = now_ms(), time.monotonic()
    with policy_engine(settings, after, MODEL):

        async def decided() -> bool:
            return bool(await audits_since(factory, killed_ms))

        await wait_until(decided, timeout=60, poll_s=0.5, what="a decision after the restart")
        took = time.monotonic() - killed
        members = await member_ids(factory, f"{settings.topic_prefix}-policy")
        # The same static member as before the kill (a fresh dynamic one waits out the
        # dead one's session first).
        assert [m.split("-")[0] for m in members] == ["policy"], members
        text = after.read_text(errors="replace")
        assert "lease acquired" in text
        assert "standby" not in text  # it held its own lease on: no wait for its expiry
        print(f"restart: first decision {took:.1f} s after the kill")
        assert took <= TARGET_S, f"the restarted engine decided only after {took:.1f} s"
