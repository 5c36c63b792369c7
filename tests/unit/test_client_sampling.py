"""The SDK's sampling: ``build_request`` writes temperature, top-p, sampling top-k, seed and
stops into ``GenerationParams``; a ``Result`` reads the finish reason and the usage."""

from __future__ import annotations

import numpy as np
import pytest

from graylane import serde
from graylane.client import GraylaneClient, Result, Task, Usage
from graylane.settings import Settings
from graylane.v1 import inference_pb2
from tests.support.memory_kafka import MemoryBroker, MemoryFactory
from tests.unit.test_client_memory import MODEL, factory, responder  # noqa: F401


def test_the_client_asks_for_sampling_and_reads_finish_and_usage() -> None:
    client = GraylaneClient(MemoryFactory(MemoryBroker(), Settings(topic_prefix="t")))
    built = client.build_request(
        "gpt",
        prompt="hi",
        max_new_tokens=8,
        temperature=0.7,
        top_p=0.9,
        sampling_top_k=50,
        seed=0,
        stop=["\n"],
        stop_token_ids=[257],
        top_k=3,  # the FORWARD post-process's, unrelated
    )
    gen = built.generation
    assert (gen.temperature, gen.top_p) == (np.float32(0.7), np.float32(0.9))
    assert gen.sampling_top_k == 50 and built.top_k == 3
    assert gen.has_seed and gen.seed == 0
    assert list(gen.stop) == ["\n"] and list(gen.stop_token_ids) == [257]
    unseeded = client.build_request("gpt", prompt="hi").generation
    assert not unseeded.has_seed and unseeded.temperature == 0.0 and not unseeded.stop
    with pytest.raises(TypeError, match="sequence of strings"):
        client.build_request("gpt", stop="\n")  # type: ignore[arg-type]

    pb = inference_pb2.InferenceResult(
        request_id="r",
        status=inference_pb2.OK,
        finish_reason=inference_pb2.STOP,
        usage=inference_pb2.Usage(prompt_tokens=3, completion_tokens=5),
    )
    result = Result.from_pb(pb, None)
    assert result.finish_reason == "STOP" and result.usage == Usage(3, 5)
    forward = Result.from_pb(inference_pb2.InferenceResult(request_id="f"), None)
    assert forward.finish_reason == "" and forward.usage is None
    newer = Result.from_pb(inference_pb2.InferenceResult(request_id="n", finish_reason=99), None)  # type: ignore[arg-type]
    assert newer.finish_reason == "UNKNOWN"


def _stopped(request: inference_pb2.InferenceRequest) -> list[inference_pb2.InferenceResult]:
    """Answers as a worker does for a request that stopped on its stop string."""
    gen = request.generation
    assert (gen.temperature, gen.has_seed, gen.seed) == (np.float32(0.8), True, 42)
    assert list(gen.stop) == ["\n"]
    return [
        inference_pb2.InferenceResult(
            request_id=request.request_id,
            model=request.model,
            version="v1",
            status=inference_pb2.OK,
            task=inference_pb2.GENERATE,
            text="one line",
            generated_token_ids=[1, 2, 3],
            finish_reason=inference_pb2.STOP,
            usage=inference_pb2.Usage(prompt_tokens=2, completion_tokens=3),
        )
    ]


async def test_infer_sends_the_sampling_and_hands_back_finish_and_usage(
    factory: MemoryFactory,  # noqa: F811
) -> None:
    async with responder(factory, _stopped), GraylaneClient(factory) as client:
        result = await client.infer(
            MODEL,
            prompt="hi",
            task=Task.GENERATE,
            max_new_tokens=8,
            temperature=0.8,
            seed=42,
            stop=["\n"],
            timeout=5,
        )
    assert result.finish_reason == "STOP" and result.usage == Usage(2, 3)
    assert result.text == "one line"


def test_each_generation_carries_a_cancel_token_of_its_own() -> None:
    client = GraylaneClient(Settings(), client_id="c")
    first = client.build_request("gpt", prompt="hi", task=Task.GENERATE)
    second = client.build_request("gpt", prompt="hi", task=Task.GENERATE)
    assert len(first.cancel_token) >= 16 and first.cancel_token != second.cancel_token
    assert client.build_request("gpt", prompt="hi").cancel_token == ""  # a FORWARD: no cancel


async def test_a_cancel_carries_the_token_of_the_generation_it_stops(
    factory: MemoryFactory,  # noqa: F811
) -> None:
    factory.broker.create_topic(factory.layout.cancels(), 1)
    async with GraylaneClient(factory) as client:
        request = client.build_request(MODEL, prompt="hi", task=Task.GENERATE)
        await client.send(request)
        await client.cancel(request.request_id, model=MODEL)
        await client.cancel("someone-elses", model=MODEL)  # a token it never had: none
    sent = [
        serde.decode(inference_pb2.CancelRequest, r.value)
        for r in factory.broker.records(factory.layout.cancels())
    ]
    assert [(c.request_id, c.cancel_token) for c in sent] == [
        (request.request_id, request.cancel_token),
        ("someone-elses", ""),
    ]
    assert request.cancel_token
