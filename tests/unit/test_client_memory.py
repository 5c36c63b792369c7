"""The client SDK (graylane/client.py) over the in-memory Kafka double: requests go to
the model's ingress, results are matched by request_id (duplicates dropped), timeouts
and error results raise the SDK's typed errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from graylane import serde
from graylane.client import GraylaneClient, InferenceTimeout, RequestRejected, UnknownModel
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import Record
from graylane.settings import Settings
from graylane.v1 import inference_pb2
from tests.support.memory_kafka import MemoryBroker, MemoryFactory

MODEL = "gpt"

Answer = Callable[[inference_pb2.InferenceRequest], list[inference_pb2.InferenceResult]]


@pytest.fixture
def factory() -> MemoryFactory:
    factory = MemoryFactory(MemoryBroker(), Settings(topic_prefix="t", partitions=2))
    for spec in factory.layout.model_specs(MODEL, ["v1"]):
        factory.broker.create_topic(spec.name, spec.partitions)
    return factory


def ok(request: inference_pb2.InferenceRequest) -> inference_pb2.InferenceResult:
    return inference_pb2.InferenceResult(
        request_id=request.request_id,
        model=request.model,
        version="v1",
        variant="fp32",
        status=inference_pb2.OK,
        text=f"echo {request.prompt}",
        generated_token_ids=[1, 2],
    )


def error(
    request: inference_pb2.InferenceRequest, code: inference_pb2.ErrorCode
) -> inference_pb2.InferenceResult:
    return inference_pb2.InferenceResult(
        request_id=request.request_id,
        model=request.model,
        status=inference_pb2.ERROR,
        error_code=code,
        error_message="no",
    )


@contextlib.asynccontextmanager
async def responder(factory: MemoryFactory, answer: Answer) -> AsyncIterator[list[str]]:
    """A stand-in for router + worker: answers each ingress request on its reply topic."""
    seen: list[str] = []

    def handle(record: Record) -> None:
        request = serde.decode(inference_pb2.InferenceRequest, record.value)
        seen.append(request.request_id)
        for result in answer(request):
            factory.broker.append(
                request.reply_topic, serde.encode(result), key=request.request_id.encode()
            )

    async with TopicFollower(
        factory, factory.layout.ingress(MODEL), handle, start_at=FollowFrom.BEGINNING
    ):
        yield seen


async def test_infer_sends_to_the_ingress_and_returns_the_matching_result(
    factory: MemoryFactory,
) -> None:
    async with responder(factory, lambda r: [ok(r)]), GraylaneClient(factory) as client:
        result = await client.infer(MODEL, prompt="hi", routing_key="user-1", timeout=5)
    assert result.ok and result.version == "v1" and result.text == "echo hi"
    assert result.tokens == (1, 2) and result.client_latency_ms is not None
    [sent] = factory.broker.records(factory.layout.ingress(MODEL))
    request = serde.decode(inference_pb2.InferenceRequest, sent.value)
    assert sent.key == b"user-1"
    assert request.request_id == result.request_id
    assert request.reply_topic == client.reply_topic == factory.layout.reply(client.client_id)


async def test_concurrent_requests_each_get_their_own_result_whatever_the_order(
    factory: MemoryFactory,
) -> None:
    held: list[inference_pb2.InferenceRequest] = []

    def hold_then_answer_in_reverse(
        request: inference_pb2.InferenceRequest,
    ) -> list[inference_pb2.InferenceResult]:
        held.append(request)
        if len(held) < 5:
            return []
        return [ok(r) for r in reversed(held)]

    async with (
        responder(factory, hold_then_answer_in_reverse),
        GraylaneClient(factory) as client,
    ):
        results = await asyncio.gather(
            *(client.infer(MODEL, prompt=f"p{i}", timeout=5) for i in range(5))
        )
    assert [r.text for r in results] == [f"echo p{i}" for i in range(5)]


async def test_a_duplicate_result_is_handed_out_once(factory: MemoryFactory) -> None:
    async with responder(factory, lambda r: [ok(r), ok(r)]), GraylaneClient(factory) as client:
        first = await client.submit(MODEL, prompt="a")
        second = await client.submit(MODEL, prompt="b")
        got: list[str] = []
        async with asyncio.timeout(5):
            async for result in client.results():
                got.append(result.request_id)
                if len(got) == 2:
                    break
        await asyncio.sleep(0.05)  # the duplicates have arrived by now; none is queued
        assert client._queue.empty()
    assert sorted(got) == sorted([first, second])


async def test_no_result_within_the_timeout_raises_inference_timeout(
    factory: MemoryFactory,
) -> None:
    async with responder(factory, lambda r: []) as seen, GraylaneClient(factory) as client:
        with pytest.raises(InferenceTimeout) as caught:
            await client.infer(MODEL, prompt="hi", timeout=0.1)
        assert caught.value.retriable
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("code", "raised"),
    [
        (inference_pb2.UNKNOWN_MODEL, UnknownModel),
        (inference_pb2.UNKNOWN_VERSION, UnknownModel),
        (inference_pb2.DEADLINE_EXCEEDED, RequestRejected),
        (inference_pb2.BAD_SHAPE, RequestRejected),
    ],
)
async def test_error_results_raise_the_sdk_error_of_their_code(
    factory: MemoryFactory, code: inference_pb2.ErrorCode, raised: type[Exception]
) -> None:
    async with responder(factory, lambda r: [error(r, code)]), GraylaneClient(factory) as client:
        with pytest.raises(raised) as caught:
            await client.infer(MODEL, prompt="hi", timeout=5)
    result = caught.value.result  # type: ignore[attr-defined]
    assert result is not None and not result.ok
    assert result.error_code == inference_pb2.ErrorCode.Name(code)
    assert result.error_message == "no"


async def test_a_model_without_an_ingress_topic_is_refused_before_sending(
    factory: MemoryFactory,
) -> None:
    async with GraylaneClient(factory) as client:
        with pytest.raises(UnknownModel, match=r"topic t\.requests\.bert does not exist"):
            await client.infer("bert", prompt="hi", timeout=5)
    assert "t.requests.bert" not in factory.broker.topics()


async def test_results_written_before_the_client_started_are_not_delivered(
    factory: MemoryFactory,
) -> None:
    client = GraylaneClient(factory, client_id="c1")
    factory.broker.create_topic(client.reply_topic, 1)
    stale = inference_pb2.InferenceResult(request_id="old", status=inference_pb2.OK)
    factory.broker.append(client.reply_topic, serde.encode(stale))
    async with responder(factory, lambda r: [ok(r)]), client:
        fresh = await client.infer(MODEL, prompt="new", timeout=5)
        assert client._queue.empty()  # "old" never arrived
    assert fresh.text == "echo new"


async def test_close_stops_every_client_it_started(factory: MemoryFactory) -> None:
    async with GraylaneClient(factory):
        pass
    assert all(p.stopped for p in factory.producers)
    assert factory.consumers and not any(c.running for c in factory.consumers)
