"""The router's shadow pair id travels from the request to every result sent for pairing:
an error result of a shadow copy carries it too (or a candidate's errors would never meet
their baseline answer and never count as disagreement), and a shadow flag the worker
does not trust loses its pair id. (The router's stamping: ``test_router_memory.py``;
the whole path on the broker: ``test_request_path.py``.)"""

from __future__ import annotations

import asyncio

from graylane import serde
from graylane.engine_worker.requests import distrust_shadow
from graylane.errors import Rejection
from graylane.kafka.replies import ReplySink
from graylane.settings import Settings
from graylane.v1 import inference_pb2
from tests.support.memory_kafka import MemoryBroker, MemoryFactory


async def test_an_error_result_of_a_shadow_copy_echoes_its_pair_id() -> None:
    broker = MemoryBroker()
    factory = MemoryFactory(broker, Settings(topic_prefix="t"))
    layout = factory.layout
    broker.create_topic(layout.shadow("m"), 1)
    producer = factory.producer()
    await producer.start()
    sink = ReplySink(producer, layout, "test")
    sink._known, sink._known_at = {layout.shadow("m")}, 1e18  # the topic exists
    request = inference_pb2.InferenceRequest(
        request_id="r1",
        model="m",
        shadow=True,
        reply_topic=layout.shadow("m"),
        routed_version="v2",
        shadow_pair_id="0-7-1",
    )
    sent = await sink.error_result(request, Rejection(inference_pb2.ENGINE_FAILURE, "boom"), None)  # type: ignore[arg-type]
    await asyncio.wait_for(asyncio.gather(sent), 5)
    [value] = broker.values(layout.shadow("m"))
    result = serde.decode(inference_pb2.InferenceResult, value)
    assert result.status == inference_pb2.ERROR
    assert result.shadow_pair_id == "0-7-1" and result.request_id == "r1"


def test_a_shadow_flag_the_worker_distrusts_takes_its_pair_id_with_it() -> None:
    forged = inference_pb2.InferenceRequest(
        request_id="r", shadow=True, routed_version="v2", shadow_pair_id="forged"
    )
    assert distrust_shadow(forged, "v2") and not forged.shadow and forged.shadow_pair_id == ""
    routed = inference_pb2.InferenceRequest(
        request_id="r",
        mirror_result=True,
        routed_version="v1",
        routed_at_unix_ms=5,
        shadow_pair_id="0-7-1",
    )
    assert not distrust_shadow(routed, "v1") and routed.shadow_pair_id == "0-7-1"
