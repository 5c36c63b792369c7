"""The router (services/router/service.py) over the in-memory Kafka double: routing by
the latest table, sticky buckets, shadow copies, error results and dead letters, a
loop that survives bad records, and ingress offsets committed only after delivery.
(The commit protocol itself stays tested on a real broker in tests/integration.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    NotLeaderForPartitionError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)

from graylane import serde
from graylane.routing.convert import table_to_pb
from graylane.routing.table import RouteTable, RoutingRule, bucket_of, table_for_weights
from graylane.services.router.service import Router, RouterConfig
from graylane.settings import Settings
from graylane.v1 import dlq_pb2, inference_pb2
from tests.support.memory_kafka import MemoryBroker, MemoryFactory

MODEL = "gpt"
GROUP = "router-test"


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()


@pytest.fixture
def factory(broker: MemoryBroker) -> MemoryFactory:
    factory = MemoryFactory(
        broker, Settings(topic_prefix="t", partitions=2, max_request_bytes=4096)
    )
    layout = factory.layout
    for spec in layout.shared_specs() + layout.model_specs(MODEL, ["v1", "v2"]):
        broker.create_topic(spec.name, spec.partitions)
    return factory


async def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def running_router(
    factory: MemoryFactory, stable: dict[str, str] | None = None
) -> AsyncIterator[Router]:
    router = Router(factory, RouterConfig(stable_versions=stable or {MODEL: "v1"}, group_id=GROUP))
    stop = asyncio.Event()
    task = asyncio.create_task(router.run(stop))
    ready = asyncio.create_task(router.ready.wait())
    await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED, timeout=5)
    if task.done():
        task.result()  # raises what stopped it
    assert router.ready.is_set()
    try:
        yield router
    finally:
        stop.set()
        ready.cancel()
        await asyncio.wait_for(task, 5)


def committed_up_to_end(broker: MemoryBroker, factory: MemoryFactory) -> bool:
    """Every ingress record is committed (a partition that never had one needs no commit)."""
    topic = factory.layout.ingress(MODEL)
    tps = [TopicPartition(topic, p) for p in broker.partitions(topic) or ()]
    return all((broker.committed(GROUP, tp) or 0) == broker.end_offset(tp) for tp in tps)


def request(request_id: str, key: str = "", **fields: object) -> inference_pb2.InferenceRequest:
    return inference_pb2.InferenceRequest(
        request_id=request_id,
        model=str(fields.pop("model", MODEL)),
        routing_key=key,
        **fields,  # type: ignore[arg-type]
    )


async def submit(factory: MemoryFactory, *requests: inference_pb2.InferenceRequest) -> None:
    for r in requests:
        factory.broker.append(
            factory.layout.ingress(MODEL),
            serde.encode(r),
            key=(r.routing_key or r.request_id).encode(),
        )


async def submit_raw(factory: MemoryFactory, value: bytes, key: bytes = b"k") -> None:
    factory.broker.append(factory.layout.ingress(MODEL), value, key=key)


def publish_table(factory: MemoryFactory, table: RouteTable) -> None:
    factory.broker.append(
        factory.layout.routing(), serde.encode(table_to_pb(table)), key=table.model.encode()
    )


def forwarded(factory: MemoryFactory, version: str) -> list[inference_pb2.InferenceRequest]:
    topic = factory.layout.version_requests(MODEL, version)
    return [serde.decode(inference_pb2.InferenceRequest, v) for v in factory.broker.values(topic)]


def results(factory: MemoryFactory, topic: str) -> list[inference_pb2.InferenceResult]:
    return [serde.decode(inference_pb2.InferenceResult, v) for v in factory.broker.values(topic)]


def dead_letters(factory: MemoryFactory) -> list[dlq_pb2.DeadLetter]:
    return [
        serde.decode(dlq_pb2.DeadLetter, v) for v in factory.broker.values(factory.layout.dlq())
    ]


async def test_without_a_table_every_request_goes_to_the_stable_version(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    async with running_router(factory):
        await submit(factory, *(request(f"r{i}", f"user-{i}") for i in range(20)))
        await eventually(lambda: committed_up_to_end(broker, factory))
    routed = forwarded(factory, "v1")
    assert sorted(r.request_id for r in routed) == sorted(f"r{i}" for i in range(20))
    assert forwarded(factory, "v2") == []
    for r in routed:
        assert r.routed_version == "v1" and r.routing_epoch == 0
        assert r.routed_at_unix_ms > 0 and r.created_at_unix_ms > 0  # filled from the record
    # Forwarded with the routing key, so a user's requests stay in one partition.
    topic = factory.layout.version_requests(MODEL, "v1")
    assert {rec.key for rec in broker.records(topic)} == {f"user-{i}".encode() for i in range(20)}


async def test_sticky_buckets_follow_the_latest_table_and_never_go_back_an_epoch(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    keys = [f"user-{i}" for i in range(300)]
    publish_table(
        factory,
        table_for_weights(model=MODEL, stable_version="v1", weights=[("v2", 20.0)], epoch=1),
    )
    async with running_router(factory) as router:
        assert router.tables.tables[MODEL].epoch == 1  # caught up before serving
        await submit(factory, *(request(f"a-{k}", k) for k in keys))
        await eventually(lambda: committed_up_to_end(broker, factory))
        at_20 = {r.routing_key for r in forwarded(factory, "v2")}
        # The candidate's range is [0, 2000): exactly the keys whose bucket falls there.
        assert at_20 == {k for k in keys if bucket_of(k) < 2000}
        assert 0.1 < len(at_20) / len(keys) < 0.3

        publish_table(
            factory,
            table_for_weights(model=MODEL, stable_version="v1", weights=[("v2", 60.0)], epoch=2),
        )
        await eventually(lambda: router.tables.tables[MODEL].epoch == 2)
        publish_table(
            factory,
            table_for_weights(model=MODEL, stable_version="v1", weights=[("v2", 0.0)], epoch=1),
        )
        await submit(factory, *(request(f"b-{k}", k) for k in keys))
        await eventually(lambda: committed_up_to_end(broker, factory))
        assert router.tables.tables[MODEL].epoch == 2  # the stale epoch-1 table is ignored
    at_60 = {r.routing_key for r in forwarded(factory, "v2") if r.request_id.startswith("b-")}
    assert at_20 <= at_60  # sticky: nobody who reached the candidate leaves it
    assert at_60 == {k for k in keys if bucket_of(k) < 6000}
    assert all(
        r.routing_epoch == 2 for r in forwarded(factory, "v2") if r.request_id.startswith("b-")
    )


async def test_rules_route_tagged_requests(broker: MemoryBroker, factory: MemoryFactory) -> None:
    rule = RoutingRule("testers", (("group", "internal"),), "v2")
    publish_table(
        factory,
        table_for_weights(
            model=MODEL, stable_version="v1", weights=[("v2", 0.0)], rules=[rule], epoch=1
        ),
    )
    async with running_router(factory):
        await submit(factory, request("in", "u1", tags={"group": "internal"}), request("out", "u1"))
        await eventually(lambda: committed_up_to_end(broker, factory))
    assert [r.request_id for r in forwarded(factory, "v2")] == ["in"]
    assert [r.request_id for r in forwarded(factory, "v1")] == ["out"]


async def test_shadow_copies_go_to_the_candidate_flagged_and_replying_to_the_shadow_topic(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    publish_table(
        factory,
        table_for_weights(
            model=MODEL, stable_version="v1", shadow_version="v2", shadow_share=1.0, epoch=3
        ),
    )
    async with running_router(factory):
        await submit(
            factory, *(request(f"r{i}", f"u{i}", reply_topic="t.reply.c") for i in range(5))
        )
        await eventually(lambda: committed_up_to_end(broker, factory))
    primaries, copies = forwarded(factory, "v1"), forwarded(factory, "v2")
    assert sorted(r.request_id for r in primaries) == sorted(r.request_id for r in copies)
    for p in primaries:
        assert p.mirror_result and not p.shadow and p.reply_topic == "t.reply.c"
    for c in copies:
        assert c.shadow and c.routed_version == "v2" and c.routing_epoch == 3
        assert c.reply_topic == factory.layout.shadow(MODEL)


async def test_shadow_pairs_carry_the_routers_pair_id_never_the_clients(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    """Both halves of a shadow pair carry one pair id of the router's own; a client's
    ``shadow_pair_id`` is overwritten, and two requests with one request id get two ids."""
    publish_table(
        factory,
        table_for_weights(
            model=MODEL, stable_version="v1", shadow_version="v2", shadow_share=1.0, epoch=1
        ),
    )
    async with running_router(factory) as router:
        await submit(
            factory,
            request("dup", "u1", shadow_pair_id="forged"),
            request("dup", "u1", shadow_pair_id="forged"),
        )
        await eventually(lambda: committed_up_to_end(broker, factory))
        publish_table(factory, table_for_weights(model=MODEL, stable_version="v1", epoch=2))
        await eventually(lambda: router.tables.tables[MODEL].epoch == 2)
        await submit(factory, request("solo", "u2", shadow_pair_id="forged"))
        await eventually(lambda: len(forwarded(factory, "v1")) == 3)
    primaries, copies = forwarded(factory, "v1"), forwarded(factory, "v2")
    assert len(copies) == 2
    ids = [p.shadow_pair_id for p in primaries[:2]]
    assert all(p.mirror_result for p in primaries[:2])
    assert sorted(ids) == sorted(c.shadow_pair_id for c in copies)
    assert len(set(ids)) == 2 and "forged" not in ids and "" not in ids
    assert not primaries[2].mirror_result and primaries[2].shadow_pair_id == ""


async def test_unknown_model_and_unknown_pinned_version_get_error_results(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    publish_table(
        factory, table_for_weights(model=MODEL, stable_version="v1", allow_pinning=True, epoch=1)
    )
    reply = factory.layout.reply("c1")
    await factory.ensure_topics([factory.layout.reply_spec("c1")])
    async with running_router(factory):
        await submit(
            factory,
            request("m", model="bert", reply_topic=reply),
            request("p", pinned_version="v9", reply_topic=reply),
            request("ok", pinned_version="v1", reply_topic=reply),
        )
        await eventually(lambda: committed_up_to_end(broker, factory))
    got = {r.request_id: r for r in results(factory, reply)}
    assert set(got) == {"m", "p"}
    assert got["m"].status == inference_pb2.ERROR
    assert got["m"].error_code == inference_pb2.UNKNOWN_MODEL
    assert got["m"].model == MODEL  # answered as the ingress topic's model
    assert got["p"].error_code == inference_pb2.UNKNOWN_VERSION and "v9" in got["p"].error_message
    assert [r.request_id for r in forwarded(factory, "v1")] == ["ok"]


async def test_oversized_and_expired_requests_are_rejected(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    async with running_router(factory):
        await submit(
            factory,
            request("big", prompt="x" * 5000),
            request("late", deadline_unix_ms=1),
        )
        await eventually(lambda: committed_up_to_end(broker, factory))
    got = {r.request_id: r.error_code for r in results(factory, factory.layout.results(MODEL))}
    assert got == {"big": inference_pb2.PAYLOAD_TOO_LARGE, "late": inference_pb2.DEADLINE_EXCEEDED}
    assert forwarded(factory, "v1") == []


async def test_bad_records_become_dead_letters_and_the_loop_goes_on(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    async with running_router(factory):
        await submit_raw(factory, b"\xff\xff\xff\xff", key=b"junk")
        await submit(factory, request("", "u1"))  # no request_id: nobody to answer
        await submit(factory, request("r1", "u1", reply_topic="t.reply.gone"))  # no such topic
        await submit(factory, request("good", "u2", model="bert", reply_topic="t.reply.gone"))
        await submit(factory, request("fine", "u3"))
        await eventually(lambda: committed_up_to_end(broker, factory))
    letters = {letter.error_code: letter for letter in dead_letters(factory)}
    # An error reply to a topic that does not exist becomes a dead letter too.
    assert sorted(letters) == sorted(
        [inference_pb2.DECODE_ERROR, inference_pb2.BAD_REQUEST, inference_pb2.UNKNOWN_MODEL]
    )
    junk = letters[inference_pb2.DECODE_ERROR]
    assert junk.original_value == b"\xff\xff\xff\xff" and junk.original_key == b"junk"
    assert junk.source_topic == factory.layout.ingress(MODEL) and junk.service == "router"
    assert "no request_id" in letters[inference_pb2.BAD_REQUEST].reason
    assert "does not exist" in letters[inference_pb2.UNKNOWN_MODEL].reason
    assert sorted(r.request_id for r in forwarded(factory, "v1")) == ["fine", "r1"]


async def test_ingress_offsets_are_committed_only_after_every_send_is_acknowledged(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    publish_table(
        factory,
        table_for_weights(
            model=MODEL, stable_version="v1", shadow_version="v2", shadow_share=1.0, epoch=1
        ),
    )
    topic = factory.layout.ingress(MODEL)
    async with running_router(factory) as router:
        broker.hold_acks()
        await submit(factory, request("r1", "u1"), request("bad", "u1", model="bert"))
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        # The router fetched the batch and queued its sends; none is acknowledged yet.
        await eventually(lambda: broker.sends_in_flight == 3)
        await asyncio.sleep(0.05)
        assert all(broker.committed(GROUP, tp) is None for tp in tps)
        assert broker.release_acks() == 3
        await eventually(lambda: committed_up_to_end(broker, factory))
        assert router.ready.is_set()
    assert [r.request_id for r in forwarded(factory, "v1")] == ["r1"]
    assert [r.request_id for r in forwarded(factory, "v2")] == ["r1"]  # the shadow copy
    assert [r.request_id for r in results(factory, factory.layout.results(MODEL))] == ["bad"]


async def test_a_retriable_send_failure_rewinds_the_batch_and_delivers_it_again(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    async with running_router(factory):
        broker.fail_next_sends(NotLeaderForPartitionError())
        await submit(factory, request("r1", "u1"))
        await eventually(lambda: committed_up_to_end(broker, factory))
        assert broker.pending_send_failures == 0  # the first attempt did fail
    assert [r.request_id for r in forwarded(factory, "v1")] == ["r1"]


async def test_lost_authorization_stops_the_router_without_committing(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    router = Router(factory, RouterConfig(stable_versions={MODEL: "v1"}, group_id=GROUP))
    broker.fail_next_sends(TopicAuthorizationFailedError())
    await submit(factory, request("r1", "u1"))
    with pytest.raises(TopicAuthorizationFailedError):
        await asyncio.wait_for(router.run(asyncio.Event()), 5)
    topic = factory.layout.ingress(MODEL)
    assert all(broker.committed(GROUP, TopicPartition(topic, p)) is None for p in (0, 1))


async def test_a_send_no_retry_can_fix_passes_its_record_over_and_the_router_goes_on(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    """The forward, its retry alone and its dead letter all refused: the router used to
    end uncommitted, and end again on the same record after every restart."""
    async with running_router(factory) as router:
        broker.fail_next_sends(RecordTooLargeError(), RecordTooLargeError(), RecordTooLargeError())
        await submit(factory, request("r1", "u1"))
        await eventually(lambda: committed_up_to_end(broker, factory))
        assert broker.pending_send_failures == 0
        await submit(factory, request("r2", "u1"))
        await eventually(lambda: [r.request_id for r in forwarded(factory, "v1")] == ["r2"])
        await eventually(lambda: committed_up_to_end(broker, factory))
        assert router.ready.is_set()
