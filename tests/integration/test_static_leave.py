"""A static group member that stops cleanly hands its partitions over at once.

Judged on the group as the broker holds it, not on how long a takeover took: after a
clean stop with :func:`~graylane.kafka.membership.leave_on_stop` the member is gone
from the group and the survivor owns every partition; without it, the stopped static
member is still a member (its partitions wait out the session timeout, far longer
than the test looks).
"""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer

from graylane.kafka.admin import ensure_topics
from graylane.kafka.membership import leave_on_stop
from graylane.kafka.seam import KafkaFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

SESSION_MS = 30_000
"""Long enough that a member the broker still holds after a stop is held for the
static membership, not because the session had no time to expire."""


def _member(factory: KafkaFactory, topic: str, group: str, instance: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=factory.settings.bootstrap_servers,
        group_id=group,
        group_instance_id=instance,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=500,
    )


async def _member_ids(factory: KafkaFactory, group: str) -> list[str]:
    """The member ids of ``group``; a static member's starts with its instance id."""
    admin = factory.admin()
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    return [member[0] for r in responses for g in r.groups for member in g[5]]


async def _after_a_stop(factory: KafkaFactory, *, leave: bool) -> tuple[list[str], int]:
    """Stop member ``a-1`` of a two-member group; the group's member ids right after,
    and the partitions the survivor owns then (once it owns both, if ``leave``)."""
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
        if leave:
            leave_on_stop(a)
        await a.stop()
        if leave:

            async def b_has_both() -> bool:
                await b.getmany(timeout_ms=100)
                return len(b.assignment()) == 2

            await wait_until(b_has_both, timeout=30, what="the survivor owns both partitions")
        else:
            await b.getmany(timeout_ms=100)
        return await _member_ids(factory, group), len(b.assignment())
    finally:
        await b.stop()


async def test_a_clean_stop_leaves_the_group_though_the_member_is_static(
    factory: KafkaFactory,
) -> None:
    members, owned = await _after_a_stop(factory, leave=True)
    assert not [m for m in members if m.startswith("a-1")], members  # it left
    assert owned == 2
    # What static membership alone does: the broker keeps the stopped member (and its
    # partition) until its session expires.
    members, owned = await _after_a_stop(factory, leave=False)
    assert [m for m in members if m.startswith("a-1")], members
    assert owned == 1
