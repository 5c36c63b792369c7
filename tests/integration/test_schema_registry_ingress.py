"""A request framed by a Confluent Schema Registry protobuf serializer (what most JVM
producers send) is answered like the raw message, on the real broker: it used to land
in the dead-letter topic as ``DECODE_ERROR``."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane import serde
from graylane.kafka.seam import KafkaFactory
from graylane.v1 import inference_pb2
from tests.support.confluent_framing import frame
from tests.support.records import produce
from tests.support.stack import dead_letters, read_topic, running_stack

pytestmark = pytest.mark.kafka

MODEL = "srframed"


def request(request_id: str) -> inference_pb2.InferenceRequest:
    return inference_pb2.InferenceRequest(
        request_id=request_id, model=MODEL, routing_key="u1", token_ids=[71, 72, 73, 74]
    )


async def test_a_framed_request_is_answered_like_a_raw_one(
    factory: KafkaFactory, models: dict[str, Path]
) -> None:
    layout = factory.layout
    ingress = layout.ingress(MODEL)
    async with running_stack(factory, model=MODEL, versions={"v1": models["v1"]}, stable="v1"):
        await produce(factory, ingress, serde.encode(request("raw")), key="u1")
        framed = frame(serde.encode(request("framed")), 1001, [1])
        assert framed[:1] == b"\x00"
        await produce(factory, ingress, framed, key="u1")
        wrong_type = frame(serde.encode(request("wrong-type")), 1002, [0])
        await produce(factory, ingress, wrong_type, key="u1")
        values = await read_topic(factory, layout.results(MODEL), expect=2, timeout_s=60)
        results = {
            r.request_id: r
            for r in (serde.decode(inference_pb2.InferenceResult, v) for v in values)
        }
        assert set(results) == {"raw", "framed"}
        raw, answered = results["raw"], results["framed"]
        assert answered.error_code == raw.error_code == inference_pb2.ERROR_CODE_UNSPECIFIED, (
            answered.error_message
        )
        assert (answered.version, answered.variant) == (raw.version, raw.variant) == ("v1", "fp32")
        assert [t.SerializeToString() for t in answered.outputs] == [
            t.SerializeToString() for t in raw.outputs
        ]
        assert answered.outputs, "the real engine's logits came back"
        [letter] = await dead_letters(factory, expect=1)
        assert letter.error_code == inference_pb2.DECODE_ERROR
        assert bytes(letter.original_value) == wrong_type
        assert "message indexes [0]" in letter.reason and "InferenceRequest" in letter.reason
