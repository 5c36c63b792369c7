"""A static group member that stops cleanly hands its partitions over at once."""

from __future__ import annotations

import time

import pytest
from aiokafka import AIOKafkaConsumer

from graylane.kafka.admin import ensure_topics
from graylane.kafka.membership import leave_on_stop
from graylane.kafka.seam import KafkaFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

SESSION_MS = 10_000


def _member(factory: KafkaFactory, topic: str, group: str, instance: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=factory.settings.bootstrap_servers,
        group_id=group,
        group_instance_id=instance,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=500,
    )


async def _takeover_s(factory: KafkaFactory, *, leave: bool) -> float:
    model = "leaveon" if leave else "leaveoff"
    await ensure_topics(factory, factory.layout.model_specs(model, ["1.0.0"]))
    topic = factory.layout.version_requests(model, "1.0.0")  # 2 partitions in tests
    group = f"{topic}.group"
    a, b = _member(factory, topic, group, "a-1"), _member(factory, topic, group, "b-1")
    await a.start()
    await b.start()
    try:

        async def both_assigned() -> bool:
            await a.getmany(timeout_ms=100)
            await b.getmany(timeout_ms=100)
            return bool(a.assignment()) and bool(b.assignment())

        await wait_until(both_assigned, timeout=30, what="one partition each")
        started = time.monotonic()
        if leave:
            leave_on_stop(a)
        await a.stop()

        async def b_has_both() -> bool:
            await b.getmany(timeout_ms=100)
            return len(b.assignment()) == 2

        await wait_until(b_has_both, timeout=30, what="the survivor owns both partitions")
        return time.monotonic() - started
    finally:
        await b.stop()


async def test_a_clean_stop_leaves_the_group_though_the_member_is_static(
    factory: KafkaFactory,
) -> None:
    with_leave = await _takeover_s(factory, leave=True)
    without = await _takeover_s(factory, leave=False)
    assert with_leave < SESSION_MS / 1000 / 2, with_leave
    assert without > with_leave  # what static membership alone does: wait out the session
