"""The router's shadow pair id travels from the request to every result sent for pairing:
an error result of a shadow copy carries it too, or a candidate's errors would never meet
their baseline answer and never count as disagreement."""

from __future__ import annotations

from graylane import serde
from graylane.kafka.replies import Rejection, ReplySink
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2


class _Capture:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> object:
        self.sent.append((topic, value, key))
        return None


async def test_an_error_result_of_a_shadow_copy_echoes_its_pair_id() -> None:
    layout = TopicLayout(prefix="t")
    producer = _Capture()
    sink = ReplySink(producer, layout, "test")  # type: ignore[arg-type]
    sink._known, sink._known_at = {layout.shadow("m")}, 1e18  # the topic exists
    request = inference_pb2.InferenceRequest(
        request_id="r1",
        model="m",
        shadow=True,
        reply_topic=layout.shadow("m"),
        routed_version="v2",
        shadow_pair_id="0-7-1",
    )
    await sink.error_result(request, Rejection(inference_pb2.ENGINE_FAILURE, "boom"), None)  # type: ignore[arg-type]
    [(topic, value, _)] = producer.sent
    result = serde.decode(inference_pb2.InferenceResult, value)
    assert topic == layout.shadow("m") and result.status == inference_pb2.ERROR
    assert result.shadow_pair_id == "0-7-1" and result.request_id == "r1"
