"""The client's reader survives a bad result record and maps unknown error codes to UNKNOWN."""

from __future__ import annotations

import asyncio

import pytest

from graylane import serde
from graylane.client import GraylaneClient, InferenceTimeout, RequestRejected
from graylane.v1 import inference_pb2, tensor_pb2
from tests.support.memory_kafka import MemoryFactory
from tests.unit.test_client_memory import MODEL, factory, responder  # noqa: F401


def _bad_then_unknown(
    request: inference_pb2.InferenceRequest,
) -> list[inference_pb2.InferenceResult]:
    broken = inference_pb2.InferenceResult(request_id=request.request_id, status=inference_pb2.OK)
    broken.outputs.add().CopyFrom(
        tensor_pb2.Tensor(name="x", dtype=tensor_pb2.FLOAT32, shape=[3], data=b"\x00")
    )
    unknown = inference_pb2.InferenceResult(
        request_id=request.request_id,
        model=request.model,
        status=inference_pb2.ERROR,
        error_code=999,  # type: ignore[arg-type]
        error_message="from a newer worker",
    )
    return [broken, unknown]


async def test_reader_survives_a_bad_record_and_unknown_codes_map_to_unknown(
    factory: MemoryFactory,  # noqa: F811
) -> None:
    async with responder(factory, _bad_then_unknown), GraylaneClient(factory) as client:
        with pytest.raises(RequestRejected) as caught:
            await client.infer(MODEL, prompt="hi", timeout=5)
    assert caught.value.result.error_code == "UNKNOWN"


async def test_a_late_result_after_the_timeout_is_dropped(factory: MemoryFactory) -> None:  # noqa: F811
    held: list[inference_pb2.InferenceRequest] = []

    def hold(request: inference_pb2.InferenceRequest) -> list[inference_pb2.InferenceResult]:
        held.append(request)
        return []

    async with responder(factory, hold), GraylaneClient(factory) as client:
        with pytest.raises(InferenceTimeout):
            await client.infer(MODEL, prompt="slow", timeout=0.2)
        [late] = held
        factory.broker.append(
            late.reply_topic,
            serde.encode(inference_pb2.InferenceResult(request_id=late.request_id)),
        )
        answered = await client.submit(MODEL, prompt="next")
        factory.broker.append(
            late.reply_topic,
            serde.encode(inference_pb2.InferenceResult(request_id=answered)),
        )
        async with asyncio.timeout(5):
            first = await anext(aiter(client.results()))
        assert first.request_id == answered  # the late one was dropped, not queued first
        assert late.request_id not in client._sent_at


async def test_submit_surfaces_a_send_failure(factory: MemoryFactory) -> None:  # noqa: F811
    async with GraylaneClient(factory) as client:
        factory.broker.fail_next_sends(RuntimeError("OutOfOrderSequenceNumber"))
        with pytest.raises(RuntimeError, match="OutOfOrderSequenceNumber"):
            await client.submit(MODEL, prompt="lost?")
