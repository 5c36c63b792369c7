"""The gateway's HTTP edge in process (ASGI, no broker): what is refused before any
request reaches Kafka, and in which error body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.requests import Request

from graylane.client import Result, Usage
from graylane.kafka.seam import KafkaFactory
from graylane.priority import Priority
from graylane.services.gateway.catalog import ModelDirectory
from graylane.services.gateway.front_door import ROUTES, keyed_route
from graylane.services.gateway.logic.admission import (
    CallerRole,
    GatewayLimits,
    KeyRing,
    Tenant,
    parse_api_keys,
)
from graylane.services.gateway.service import (
    Gateway,
    GatewayConfig,
    replica_client_id,
)

KEY = "edge-key-0123456789abcdef"
SLOW_KEY = "slow-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "gpt", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def gateway(factory: KafkaFactory) -> Gateway:
    keys = KeyRing(
        parse_api_keys(
            f"{KEY}:infer:edge:::critical+standard+sheddable:team,{SLOW_KEY}:infer:slow:0.001:1"
        )
    )
    limits = GatewayLimits(max_body_bytes=2048, max_in_flight=4, sheddable_share=0.5)
    gateway = Gateway(factory, GatewayConfig(limits=limits, metrics_port=-1), keys)

    async def topics() -> set[str]:  # the cluster, as the directory would see it
        return {factory.layout.ingress("gpt")}

    gateway.directory = ModelDirectory(factory.layout, topics)
    return gateway


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client


def _openai_error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, object] = body["error"]
    return error


async def test_a_missing_or_unknown_key_is_401(http: httpx.AsyncClient) -> None:
    missing = await http.post("/v1/chat/completions", json=CHAT)
    wrong = await http.post(
        "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"}
    )
    for response in (missing, wrong):
        assert response.status_code == 401
        assert _openai_error(response)["code"] == "invalid_api_key"
    oip = await http.post("/v2/models/m/infer", json={"inputs": []})
    assert oip.status_code == 401 and set(oip.json()) == {"error"}


async def test_a_key_over_its_rate_is_429_with_retry_after(http: httpx.AsyncClient) -> None:
    slow = {"Authorization": f"Bearer {SLOW_KEY}"}
    first = await http.post("/v1/completions", content=b"not json", headers=slow)
    second = await http.post("/v1/completions", content=b"not json", headers=slow)
    assert first.status_code == 400  # it passed the bucket, then its body was refused
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1
    assert _openai_error(second)["type"] == "rate_limit_error"


async def test_the_front_door_refuses_before_the_app_sees_the_call(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """401 and 429 are answered from the headers alone: the app (routing, the body's
    parser) never runs for them, and they are counted as the handlers count theirs."""
    reached: list[str] = []
    app = gateway.app.app

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await app(scope, receive, send)

    gateway.app.app = counting
    slow = {"Authorization": f"Bearer {SLOW_KEY}"}
    first = await http.post("/v1/completions", content=b"not json", headers=slow)
    second = await http.post("/v1/completions", content=b"not json", headers=slow)
    wrong = await http.post("/v2/models/m/infer", content=b"{", headers={"Authorization": "x"})
    assert (first.status_code, second.status_code, wrong.status_code) == (400, 429, 401)
    assert reached == ["/v1/completions"]  # only the call the bucket let through
    assert set(wrong.json()) == {"error"}  # the inference protocol's error body
    registry = gateway.observability.registry
    assert (
        registry.get_sample_value(
            "graylane_gateway_requests_total", {"endpoint": "completions", "status": "429"}
        )
        == 1.0
    )
    assert (
        registry.get_sample_value(
            "graylane_gateway_requests_total", {"endpoint": "v2_infer", "status": "401"}
        )
        == 1.0
    )
    # Probes and unknown paths are the app's to answer, key or none.
    assert (await http.get("/healthz")).status_code == 200
    assert (await http.get("/v1/nowhere")).status_code == 404
    assert reached == ["/v1/completions", "/healthz", "/v1/nowhere"]


async def test_a_refusal_after_the_body_was_read_is_answered_at_once(
    factory: KafkaFactory,
) -> None:
    """A handler that refuses a call whose body it has read (feedback's 404 and 409) drops
    nothing more: it must not wait on the connection for a body that is not coming."""
    limits = GatewayLimits(drain_s=60.0)
    gateway = Gateway(factory, GatewayConfig(limits=limits, metrics_port=-1), None)
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b'{"id": "x"}', "more_body": False}
        await asyncio.Event().wait()  # an open keep-alive connection: nothing more comes
        raise AssertionError("unreachable")

    scope = {"type": "http", "method": "POST", "path": "/v1/feedback", "headers": []}
    request = Request(scope, receive)
    assert await request.body() == b'{"id": "x"}'
    await asyncio.wait_for(gateway._unread(request), timeout=limits.drain_s / 4)


@pytest.mark.parametrize(
    ("method", "path", "keyed"),
    [
        ("POST", "/v1/completions", True),
        ("POST", "/v1/chat/completions", True),
        ("POST", "/v1/feedback", True),
        ("GET", "/v1/models", True),
        ("GET", "/v1/models/gpt", True),
        ("GET", "/v2/models/gpt", True),
        ("GET", "/v2/models/gpt/ready", True),
        ("POST", "/v2/models/gpt/infer", True),
        ("GET", "/v2/models/gpt/versions/v2", True),
        ("GET", "/v2/models/gpt/versions/v2/ready", True),
        ("POST", "/v2/models/gpt/versions/v2/infer", True),
        ("GET", "/v1/completions", False),
        ("POST", "/v1/models", False),
        ("GET", "/v1/models/gpt/extra", False),
        ("GET", "/v1/nowhere", False),
        ("GET", "/v2", False),
        ("GET", "/v2/health/ready", False),
        ("GET", "/v2/models/gpt/infer", False),
        ("POST", "/v2/models/gpt/other", False),
        ("GET", "/metrics", False),
    ],
)
def test_the_front_door_knows_the_keyed_routes(method: str, path: str, keyed: bool) -> None:
    assert (keyed_route(method, path) is not None) is keyed


def test_the_app_mounts_the_front_doors_route_table(gateway: Gateway) -> None:
    """One table: every route the app answers is one the door knows, keyed or open."""
    app = gateway.app.app  # behind the door
    mounted = sorted(
        (method, r.path) for r in app.routes if isinstance(r, APIRoute) for method in r.methods
    )
    assert mounted == sorted((r.method, r.path) for r in ROUTES)
    for route in ROUTES:
        concrete = route.path.replace("{model}", "gpt").replace("{name}", "gpt")
        concrete = concrete.replace("{version}", "v2")
        assert keyed_route(route.method, concrete) is (route if route.keyed else None)


async def test_bodies_are_capped_and_checked(http: httpx.AsyncClient) -> None:
    big = await http.post(
        "/v1/completions", json={"model": "gpt", "prompt": "x" * 4000}, headers=AUTH
    )
    assert big.status_code == 413 and _openai_error(big)["code"] == "request_too_large"
    broken = await http.post("/v1/completions", content=b"{", headers=AUTH)
    assert broken.status_code == 400 and "JSON" in str(_openai_error(broken)["message"])
    many = await http.post("/v1/chat/completions", json={**CHAT, "n": 9}, headers=AUTH)
    assert many.status_code == 400 and _openai_error(many)["param"] == "n"
    streamed_choices = await http.post(
        "/v1/chat/completions", json={**CHAT, "n": 2, "stream": True}, headers=AUTH
    )
    assert streamed_choices.status_code == 400 and _openai_error(streamed_choices)["param"] == "n"
    bad_priority = await http.post(
        "/v1/chat/completions", json=CHAT, headers={**AUTH, "x-graylane-priority": "vip"}
    )
    assert bad_priority.status_code == 400
    tensors = await http.post(
        "/v2/models/m/infer",
        json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]},
        headers=AUTH,
    )
    assert tensors.status_code == 400 and "do not fill" in tensors.json()["error"]


async def test_a_full_replica_refuses_sheddable_calls_with_503_and_retry_after(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    for i in range(2):  # half of max_in_flight: the sheddable share
        gateway._enter(Tenant(f"other-{i}", CallerRole.INFER), Priority.STANDARD)
    refused = await http.post(
        "/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={**AUTH, "x-graylane-priority": "sheddable"},
    )
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert _openai_error(refused)["code"] == "overloaded"
    assert "sheddable" in str(_openai_error(refused)["message"])
    metric = gateway.observability.registry.get_sample_value(
        "graylane_gateway_refused_total", {"reason": "overload"}
    )
    assert metric == 1.0


async def test_probes_and_unknown_paths(gateway: Gateway, http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).status_code == 200
    not_ready = await http.get("/readyz")
    assert not_ready.status_code == 503 and "producer_up" in not_ready.text
    assert (await http.get("/v2/health/live")).status_code == 200
    assert (await http.get("/v2/health/ready")).status_code == 503
    assert (await http.get("/v2")).json()["extensions"] == ["binary_tensor_data"]
    metrics = await http.get("/metrics")
    assert "graylane_gateway_requests_total" in metrics.text
    lost = await http.get("/v1/nowhere")
    assert lost.status_code == 404 and _openai_error(lost)["type"] == "not_found_error"
    assert json.loads((await http.get("/v2/nowhere")).text).keys() == {"error"}


def test_a_replica_name_becomes_a_usable_client_id() -> None:
    assert replica_client_id("gateway-7d9f_Pod.2", "s") == "gateway-gateway-7d9f-pod-2-s"
    assert replica_client_id("0", "s") == "gateway-0-s"
    assert len(replica_client_id("x" * 300)) <= 100
    first, second = replica_client_id("0"), replica_client_id("0")
    assert first != second and len(first.rsplit("-", 1)[1]) == 32  # unguessable


async def test_an_unserved_model_is_404_in_each_protocol(http: httpx.AsyncClient) -> None:
    chat = await http.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=AUTH)
    assert chat.status_code == 404 and _openai_error(chat)["code"] == "model_not_found"
    tensors = await http.post(
        "/v2/models/nope/infer",
        json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]},
        headers=AUTH,
    )
    assert tensors.status_code == 404 and "nope" in tensors.json()["error"]
    listed = await http.get("/v1/models", headers=AUTH)
    assert [m["id"] for m in listed.json()["data"]] == ["gpt"]


async def test_headers_become_the_requests_routing_key_tags_priority_and_deadline(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    seen: dict[str, Any] = {}

    async def infer(model: str, **kwargs: Any) -> Result:
        seen.update(kwargs, model=model)
        return Result(
            request_id=kwargs["request_id"],
            model=model,
            version="1.1.0",
            variant="int8",
            ok=True,
            error_code="",
            error_message="",
            text="hey",
            finish_reason="EOS",
            usage=Usage(4, 1),
        )

    gateway.client.infer = infer  # type: ignore[method-assign]
    answer = await http.post(
        "/v1/chat/completions",
        json={**CHAT, "user": "from-body", "temperature": 0, "max_tokens": 3},
        headers={
            **AUTH,
            "x-graylane-routing-key": "from-header",
            "x-graylane-tag-team": "a",
            "x-graylane-priority": "critical",
            "x-graylane-timeout-ms": "2500",
        },
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-graylane-version"] == "1.1.0"
    assert answer.headers["x-graylane-variant"] == "int8"
    body = answer.json()
    assert body["choices"][0]["message"]["content"] == "hey"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    assert seen["routing_key"] == "from-header"  # the header wins over the body's user
    assert seen["tags"] == {"team": "a", "priority": "critical", "tenant": "edge"}
    assert seen["deadline_s"] == 2.5 and seen["timeout"] == 2.5
    assert (seen["max_new_tokens"], seen["temperature"]) == (3, 0.0)
    assert seen["stop"] == [] and seen["turn_end"] == ["<|im_end|>"]
    seen.clear()
    await http.post(
        "/v1/completions", json={"model": "gpt", "prompt": "x", "user": "u-7"}, headers=AUTH
    )
    assert seen["routing_key"] == "u-7" and seen["tags"] == {
        "priority": "standard",
        "tenant": "edge",
    }
    assert seen["deadline_s"] is None  # no deadline unless the caller gives one


async def test_a_kafka_failure_is_answered_without_its_text(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Pins the leak: Kafka's exception text (hosts, principals) reached callers verbatim."""
    from aiokafka.errors import KafkaConnectionError

    secret = "broker kafka-0.internal:9093 refused SASL user gateway-prod"

    async def infer(*_: Any, **__: Any) -> Result:
        raise KafkaConnectionError(secret)

    gateway.client.infer = infer  # type: ignore[method-assign]
    answer = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    message = str(_openai_error(answer)["message"])
    assert "kafka-0" not in message and "SASL" not in message
    assert message == "the request could not be queued; retry shortly"


class _SlowTemplate:
    """A chat template that takes its time, as a hostile conversation could make one."""

    stop = ("<e>",)

    def __init__(self) -> None:
        self.loop_was_free = False

    def render(self, messages: object) -> str:
        import threading
        import time

        self.loop_was_free = threading.current_thread() is not threading.main_thread()
        time.sleep(0.5)
        return "prompt"


async def test_a_template_renders_off_the_event_loop_within_its_time_limit(
    factory: KafkaFactory,
) -> None:
    """Pins templates rendered on the event loop with no time limit."""
    template = _SlowTemplate()
    limits = GatewayLimits(template_timeout_s=0.1)
    config = GatewayConfig(limits=limits, metrics_port=-1, templates={"gpt": template})
    gateway = Gateway(factory, config, KeyRing(parse_api_keys(f"{KEY}:infer:edge")))
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        answer = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert answer.status_code == 400
    assert "took longer than 0.1 s" in str(_openai_error(answer)["message"])
    assert template.loop_was_free
    assert gateway.admission.gate.running == 0
