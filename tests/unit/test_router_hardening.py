"""Issue 10 at the router (in-memory Kafka): client-set router fields are cleared on
ingress, a table naming a missing topic is refused without stalling anyone, and an
unexpected error on one record becomes a dead letter while the loop goes on."""

from __future__ import annotations

import pytest

from graylane import serde
from graylane.routing.table import table_for_weights
from graylane.services.router.service import Router
from graylane.v1 import control_pb2, inference_pb2
from tests.support.memory_kafka import MemoryBroker, MemoryFactory
from tests.unit.test_router_memory import (
    MODEL,
    broker,
    committed_up_to_end,
    dead_letters,
    eventually,
    factory,
    forwarded,
    publish_table,
    request,
    results,
    running_router,
    submit,
)

__all__ = ["broker", "factory"]  # fixtures


async def test_client_set_router_fields_are_cleared_on_ingress(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    async with running_router(factory):
        await submit(
            factory,
            request(
                "s",
                shadow=True,
                mirror_result=True,
                routed_version="v2",
                routed_at_unix_ms=1,
                created_at_unix_ms=1,
            ),
        )
        await eventually(lambda: committed_up_to_end(broker, factory))
    [sent] = forwarded(factory, "v1")
    assert not sent.shadow and not sent.mirror_result
    assert sent.routed_version == "v1" and sent.routed_at_unix_ms > 1
    assert sent.created_at_unix_ms > 1_000_000_000_000  # the broker's record timestamp
    assert not forwarded(factory, "v2")


async def test_a_table_naming_a_missing_topic_is_refused_and_routing_goes_on(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    good = table_for_weights(model=MODEL, stable_version="v1", weights=[("v2", 100.0)], epoch=1)
    publish_table(factory, good)
    async with running_router(factory) as router:
        assert router.tables.tables[MODEL].epoch == 1
        missing = table_for_weights(
            model=MODEL, stable_version="v1", weights=[("v3", 100.0)], epoch=2
        )
        publish_table(factory, missing)
        await submit(factory, request("a", "user-1"))
        await eventually(lambda: committed_up_to_end(broker, factory))
        refusals = router.metrics.errors.labels(MODEL, "BAD_ROUTING_TABLE")
        await eventually(lambda: refusals._value.get() >= 1)  # the table follower's pace
        assert refusals._value.get() == 1
        assert router.tables.tables[MODEL].epoch == 1  # kept the previous table
        # The refusal is on record: the table's own bytes and the reason, in the dlq.
        await eventually(lambda: len(dead_letters(factory)) == 1)
    assert [r.request_id for r in forwarded(factory, "v2")] == ["a"]
    [letter] = dead_letters(factory)
    assert letter.error_code == inference_pb2.BAD_ROUTING_TABLE
    assert letter.source_topic == factory.layout.routing()
    assert "epoch 2 refused" in letter.reason and factory.layout.version_requests(MODEL, "v3") in (
        letter.reason
    )
    refused_table = serde.decode(control_pb2.RoutingTable, letter.original_value)
    assert refused_table.epoch == 2


async def test_an_unexpected_error_on_one_record_is_a_dead_letter(
    broker: MemoryBroker, factory: MemoryFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Router.decide

    def flaky(self: Router, req: inference_pb2.InferenceRequest) -> object:
        if req.request_id == "boom":
            raise RuntimeError("surprise")
        return real(self, req)

    monkeypatch.setattr(Router, "decide", flaky)
    async with running_router(factory):
        await submit(factory, request("boom"), request("fine"))
        await eventually(lambda: committed_up_to_end(broker, factory))
    assert [r.request_id for r in forwarded(factory, "v1")] == ["fine"]
    [letter] = dead_letters(factory)
    assert letter.error_code == inference_pb2.INTERNAL
    assert not results(factory, factory.layout.results(MODEL))


async def test_a_pin_of_an_unserved_version_is_unknown_version_even_without_a_table(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    reply = factory.layout.reply("c1")
    await factory.ensure_topics([factory.layout.reply_spec("c1")])
    async with running_router(factory):
        await submit(
            factory,
            request("p", pinned_version="v9", reply_topic=reply),
            request("s", pinned_version="v1", reply_topic=reply),
        )
        await eventually(lambda: committed_up_to_end(broker, factory))
    [got] = results(factory, reply)
    assert got.request_id == "p" and got.error_code == inference_pb2.UNKNOWN_VERSION
    assert [r.request_id for r in forwarded(factory, "v1")] == ["s"]
