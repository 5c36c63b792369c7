"""Topic configs on the real broker: min.insync.replicas, and repairs that keep
operator settings (issue 10, item 8).

Regression: config repair used AlterConfigs with only Graylane's own configs,
which wipes every other config set on the topic (an operator's
``max.message.bytes``, say).
"""

from __future__ import annotations

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from graylane.kafka.admin import describe_topic_configs, ensure_topics, topic_overrides
from graylane.kafka.seam import KafkaFactory
from graylane.topics import TopicKind
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka


async def test_created_topics_carry_min_insync_replicas(factory: KafkaFactory) -> None:
    layout = factory.layout
    specs = layout.shared_specs() + layout.model_specs("gpt", ["v1"])
    await ensure_topics(factory, specs)
    admin = factory.admin()
    await admin.start()
    try:
        for spec in specs:
            overrides = await topic_overrides(admin, spec.name)
            # Set on the topic itself (not inherited), min(2, RF) with RF 1 here.
            assert overrides["min.insync.replicas"] == "1", spec.name
            assert overrides["cleanup.policy"] == spec.cleanup.value
    finally:
        await admin.close()


async def test_repair_keeps_an_operator_set_config(factory: KafkaFactory) -> None:
    spec = next(s for s in factory.layout.shared_specs() if s.kind is TopicKind.AUDIT)
    await ensure_topics(factory, [spec])
    admin = factory.admin()
    await admin.start()
    try:
        # An operator raises max.message.bytes and someone drifts retention.ms.
        current = await topic_overrides(admin, spec.name)
        changed = {**current, "max.message.bytes": "2097152", "retention.ms": "60000"}
        await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, spec.name, configs=changed)]
        )

        async def shows(key: str, value: str) -> bool:
            return (await describe_topic_configs(admin, spec.name)).get(key) == value

        # The broker applies config changes asynchronously: wait for them to be visible.
        await wait_until(lambda: shows("retention.ms", "60000"), timeout=15, what="drift")

        report = await ensure_topics(factory, [spec])
        assert report.reconfigured == (spec.name,)
        await wait_until(
            lambda: shows("retention.ms", str(spec.retention_ms)), timeout=15, what="repair"
        )
        configs = await describe_topic_configs(admin, spec.name)
        assert configs["retention.ms"] == str(spec.retention_ms)
        assert configs["max.message.bytes"] == "2097152"
        assert configs["min.insync.replicas"] == "1"
        # Nothing left to repair, and the operator's config still there.
        again = await ensure_topics(factory, [spec])
        assert again.unchanged == (spec.name,)
        overrides = await topic_overrides(admin, spec.name)
        assert overrides["max.message.bytes"] == "2097152"
    finally:
        await admin.close()
