"""Topic configs on the real broker: min.insync.replicas, and repairs that keep
operator settings (issue 10, item 8).

Regression: config repair used AlterConfigs with only Graylane's own configs,
which wipes every other config set on the topic (an operator's
``max.message.bytes``, say).
"""

from __future__ import annotations

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from graylane.kafka.admin import (
    MessageLimits,
    describe_topic_configs,
    ensure_topics,
    topic_overrides,
)
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
            # Stated, not inherited from the broker (a stock cluster's is 1 MiB).
            assert overrides["max.message.bytes"] == str(factory.settings.max_message_bytes)
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


async def test_message_limits_are_each_topics_effective_max_message_bytes(
    factory: KafkaFactory,
) -> None:
    layout = factory.layout
    specs = layout.model_specs("gpt", ["v1", "v2"])
    await ensure_topics(factory, specs)
    stock = layout.version_requests("gpt", "v2")
    admin = factory.admin()
    await admin.start()
    try:
        current = await topic_overrides(admin, stock)
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    stock,
                    configs={**current, "max.message.bytes": "1048588"},
                )
            ]
        )

        async def stock_limit() -> bool:
            return (await describe_topic_configs(admin, stock)).get("max.message.bytes") == (
                "1048588"
            )

        await wait_until(stock_limit, timeout=15, what="the stock limit on v2")
    finally:
        await admin.close()
    created = factory.settings.max_message_bytes
    limits = MessageLimits.of_factory(factory, ceiling=4 * created)
    await limits.load(s.name for s in specs)
    assert await limits.limit(stock) == 1_048_588
    assert await limits.limit(layout.version_requests("gpt", "v1")) == created
    # A topic whose configs cannot be read is held to the broker's message.max.bytes
    # (the local broker's: deploy/kafka/server.properties.template).
    assert await limits.limit(layout.reply("nobody")) == 8_388_608
    capped = MessageLimits.of_factory(factory, ceiling=1000)
    assert await capped.limit(layout.version_requests("gpt", "v1")) == 1000
