"""The gateway's edge under hostile callers, over HTTP against the real broker.

The model's topics exist and nothing serves them: a call that gets past the edge waits
for an answer that never comes, which is what a tenant filling the gateway looks like.
Each test pins a defect of the edge and would fail on the code that had it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import pytest

from graylane import serde
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import KafkaFactory, Record
from graylane.request_tags import TENANT_TAG
from graylane.services.gateway.logic.admission import GatewayLimits, KeyRing, parse_api_keys
from graylane.services.gateway.service import Gateway
from graylane.v1 import inference_pb2
from tests.support.gateway import running_gateway
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

MODEL = "edge"
NOISY = "noisy-0123456789abcdef"
QUIET = "quiet-0123456789abcdef"
TRUSTED = "trusted-0123456789abcdef"
KEYS = KeyRing(
    parse_api_keys(
        f"{NOISY}:infer:noisy:1000:1000,{QUIET}:infer:quiet:1000:1000,"
        f"{TRUSTED}:infer:trusted:1000:1000:critical+standard:cohort"
    )
)


async def _served(factory: KafkaFactory) -> None:
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(MODEL, ["v1"]))


def _auth(key: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **headers}


def _refused(gateway: Gateway, reason: str) -> float:
    value = gateway.observability.registry.get_sample_value(
        "graylane_gateway_refused_total", {"reason": reason}
    )
    return value or 0.0


@contextlib.asynccontextmanager
async def _hanging(
    http: httpx.AsyncClient, path: str, bodies: list[bytes], key: str
) -> AsyncIterator[list[asyncio.Task[httpx.Response]]]:
    """Calls that wait (nothing answers them) until the block ends, then hang up."""
    headers = _auth(key, **{"x-graylane-timeout-ms": "120000"})
    tasks = [asyncio.create_task(http.post(path, content=b, headers=headers)) for b in bodies]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_body_full_of_ignored_fields_is_not_kept_while_its_call_waits(
    factory: KafkaFactory,
) -> None:
    """Pins the High defect: each parsed body stayed referenced until its generation
    ended, so 100 waiting calls of 680 KB held over a gigabyte."""
    await _served(factory)
    filler = ["x" * 60] * 10_000  # 10,000 strings: within the containers bound
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "x": filler}
    ).encode()
    calls = 40
    async with (
        running_gateway(factory, keys=KEYS) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=120) as http,
    ):
        tracemalloc.start()
        try:
            gc.collect()
            before, _ = tracemalloc.get_traced_memory()
            async with _hanging(http, "/v1/chat/completions", [body] * calls, NOISY) as tasks:
                # Each call holds its place in the gate and has been sent: its body was
                # read and parsed, and is not read any more.
                await wait_until(
                    lambda: (
                        gateway.admission.gate.running == calls and gateway.client.waiting == calls
                    ),
                    timeout=60,
                    what="every call sent and waiting for its answer",
                )
                gc.collect()  # what is kept, not what waits for the collector
                held, _ = tracemalloc.get_traced_memory()
                assert not any(t.done() for t in tasks)
        finally:
            tracemalloc.stop()
        # A body of {} fillers past the containers bound is refused before it is kept.
        fillers = json.dumps({"model": MODEL, "prompt": "hi", "x": [{}] * 40_000}).encode()
        refused = await http.post("/v1/completions", content=fillers, headers=_auth(NOISY))
    grown_mb = (held - before) / 2**20
    # each body is ~600 KB and ~1 MB parsed: kept, 40 of them are 40+ MB
    assert grown_mb < 12, f"{grown_mb:.1f} MB held by {calls} waiting calls"
    assert refused.status_code == 400
    assert "objects and arrays" in refused.json()["error"]["message"]


async def test_one_tenant_cannot_take_the_whole_gate_and_waits_before_its_body_is_read(
    factory: KafkaFactory,
) -> None:
    """Pins the global gate: one key filled every slot and every other tenant got 503."""
    await _served(factory)
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    limits = GatewayLimits(max_in_flight=8)
    async with (
        running_gateway(factory, keys=KEYS, limits=limits) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=120) as http,
    ):
        gate = gateway.admission.gate
        async with _hanging(http, "/v1/completions", [body] * 4, NOISY):
            await wait_until(lambda: gate.running == 4, timeout=60, what="noisy's 4 calls")
            # past its share, the noisy tenant is refused, before its body is read
            over = await http.post(
                "/v1/completions",
                content=b"x" * 900_000,  # not even JSON: never read
                headers=_auth(NOISY),
            )
            async with _hanging(http, "/v1/completions", [body] * 4, QUIET):
                await wait_until(lambda: gate.running == 8, timeout=60, what="quiet's calls")
                assert gate.running_of("quiet") == 4 and gate.running_of("noisy") == 4
        shared = _refused(gateway, "tenant_share")
    assert over.status_code == 429 and "retry-after" in over.headers
    assert "noisy" in over.json()["error"]["message"]
    assert shared == 1


async def _requests_on_ingress(
    factory: KafkaFactory, count: int
) -> list[inference_pb2.InferenceRequest]:
    found: list[inference_pb2.InferenceRequest] = []
    seen = asyncio.Event()

    def keep(record: Record) -> None:
        found.append(serde.decode(inference_pb2.InferenceRequest, record.value))
        if len(found) >= count:
            seen.set()

    async with TopicFollower(
        factory,
        factory.layout.ingress(MODEL),
        keep,
        start_at=FollowFrom.BEGINNING,
        client_suffix="ingress",
    ):
        await asyncio.wait_for(seen.wait(), 30)
    return found


async def test_identity_decides_priority_tags_and_the_tenant_tag(factory: KafkaFactory) -> None:
    """Pins caller-chosen priority and tags: any tenant could send ``critical`` and any
    tag, and the tenant bound to the key was never forwarded."""
    await _served(factory)
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    short = {"x-graylane-timeout-ms": "300"}
    async with (
        running_gateway(factory, keys=KEYS) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=30) as http,
    ):

        async def call(key: str, **headers: str) -> httpx.Response:
            return await http.post(
                "/v1/completions", content=body, headers=_auth(key, **short, **headers)
            )

        forged_priority = await call(QUIET, **{"x-graylane-priority": "critical"})
        forged_tag = await call(QUIET, **{"x-graylane-tag-cohort": "beta"})
        forged_tenant = await call(TRUSTED, **{"x-graylane-tag-tenant": "quiet"})
        forged_reserved = await call(TRUSTED, **{"x-graylane-tag-priority": "critical"})
        plain = await call(QUIET)  # reaches Kafka; nothing answers: 504
        trusted = await call(
            TRUSTED, **{"x-graylane-priority": "critical", "x-graylane-tag-cohort": "beta"}
        )
    for refused in (forged_priority, forged_tag, forged_tenant, forged_reserved):
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["type"] == "permission_error"
    assert plain.status_code == trusted.status_code == 504
    sent = await _requests_on_ingress(factory, 2)
    # the ingress topic has several partitions: no order between the two records
    assert sorted((dict(r.tags) for r in sent), key=lambda tags: tags[TENANT_TAG]) == [
        {"priority": "standard", TENANT_TAG: "quiet"},
        {"priority": "critical", "cohort": "beta", TENANT_TAG: "trusted"},
    ]


async def test_replies_no_one_waits_for_are_dropped_and_counted(factory: KafkaFactory) -> None:
    """Pins the unread queue: every unmatched reply went into the SDK client's queue,
    which the gateway never reads, until the pod died."""
    await _served(factory)
    async with running_gateway(factory, keys=KEYS, replica="edge") as gateway:
        topic = gateway.client.reply_topic
        # named gateway-edge-<32 hex>: not guessable from the replica's name
        secret = topic.rsplit("-", 1)[1]
        assert topic.startswith(f"{factory.layout.prefix}.reply.gateway-edge-")
        assert len(secret) == 32 and int(secret, 16) >= 0
        producer = factory.producer(client_suffix="stray")
        await producer.start()
        try:
            for i in range(200):
                stray = inference_pb2.InferenceResult(
                    request_id=f"stray-{i}", status=inference_pb2.OK, text="x" * 1000
                )
                await producer.send_and_wait(topic, serde.encode(stray))
        finally:
            await producer.stop()
        registry = gateway.observability.registry
        await wait_until(
            lambda: registry.get_sample_value("graylane_gateway_unclaimed_replies_total") == 200,
            timeout=30,
            what="200 unclaimed replies counted",
        )
        assert gateway.client.unclaimed_dropped == 200
        assert gateway.client._queue.qsize() == 0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000),
        ("/v1/completions", b'{"model": "edge", "prompt": ' + b"[" * 40 + b"]" * 40 + b"}"),
        ("/v2/models/edge/infer", b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("/v1/completions", b'{"model": "edge", "prompt": "\xff\xfe"}'),
    ],
    ids=["deep-chat", "over-the-depth-bound", "deep-infer", "invalid-utf8"],
)
async def test_a_hostile_body_is_400_never_500(
    factory: KafkaFactory, path: str, body: bytes
) -> None:
    """Pins the uncaught RecursionError: a deeply nested body answered 500 with a
    traceback per call."""
    await _served(factory)
    async with (
        running_gateway(factory, keys=KEYS) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=30) as http,
    ):
        answer = await http.post(path, content=body, headers=_auth(QUIET))
        assert gateway.admission.gate.running == 0
        assert gateway.admission.bodies.held == 0
    assert answer.status_code == 400, answer.text
    assert "Traceback" not in answer.text
