"""Issue 10 at the worker (in-memory Kafka, the demo GPT): an unexpected error on one
record, a result too large for the broker, and a batch id on every telemetry record."""

from __future__ import annotations

import pytest

from graylane import serde
from graylane.engine_worker import native as native_module
from graylane.engine_worker import requests as requests_module
from graylane.kafka.admin import MessageLimits
from graylane.v1 import inference_pb2, telemetry_pb2
from tests.unit.test_worker import (
    Rig,
    engine,
    gpt_path,
    publish,
    request,
    results_by_id,
    rig,
    serve_until_committed,
)

__all__ = ["engine", "gpt_path", "rig"]  # fixtures


async def test_an_unexpected_error_on_one_record_is_internal_and_the_rest_are_served(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = requests_module.validate

    def flaky(req: inference_pb2.InferenceRequest, *args: object) -> object:
        if req.request_id == "boom":
            raise RuntimeError("surprise")
        return real(req, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(native_module, "validate", flaky)
    boom = request("boom", token_ids=[1, 2], post_process=inference_pb2.ARGMAX_LAST)
    good = request("good", token_ids=[9, 8, 7], post_process=inference_pb2.ARGMAX_LAST)
    await publish(rig, serde.encode(boom), serde.encode(good))
    await serve_until_committed(rig, 2)
    results = results_by_id(rig)
    assert results["boom"].error_code == inference_pb2.INTERNAL
    assert results["good"].status == inference_pb2.OK


async def test_a_result_over_the_broker_limit_is_result_too_large(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = MessageLimits.limit

    async def tiny_results_topic(self: MessageLimits, topic: str) -> int:
        return 64 if topic == rig.factory.layout.results("demo") else await real(self, topic)

    monkeypatch.setattr(MessageLimits, "limit", tiny_results_topic)
    big = request("big", token_ids=[1, 2, 3])  # full logits: far over 64 bytes
    await publish(rig, serde.encode(big))
    await serve_until_committed(rig, 1)
    got = results_by_id(rig)["big"]
    assert got.status == inference_pb2.ERROR and got.error_code == inference_pb2.RESULT_TOO_LARGE


async def test_telemetry_carries_a_batch_id(rig: Rig) -> None:
    await publish(
        rig, serde.encode(request("a", token_ids=[4, 5], post_process=inference_pb2.ARGMAX_LAST))
    )
    await serve_until_committed(rig, 1)
    [t] = [
        serde.decode(telemetry_pb2.BatchTelemetry, v)
        for v in rig.read(rig.factory.layout.telemetry())
    ]
    assert (t.batch_id.worker_id, t.batch_id.partition, t.batch_id.first_offset) == ("w-test", 0, 0)
    assert t.batch_id.attempt == 0


async def test_a_client_set_shadow_flag_does_not_divert_the_requesters_answer(rig: Rig) -> None:
    version = rig.worker.config.version
    forged = request(
        "forged", token_ids=[1, 2], post_process=inference_pb2.ARGMAX_LAST, shadow=True
    )
    forged.mirror_result, forged.routed_version = True, version  # no routed_at: not the router
    routed = request(
        "routed", token_ids=[3, 4], post_process=inference_pb2.ARGMAX_LAST, shadow=True
    )
    routed.routed_version, routed.routed_at_unix_ms = version, 1_700_000_000_000
    await publish(rig, serde.encode(forged), serde.encode(routed))
    await serve_until_committed(rig, 2)
    results = results_by_id(rig)
    assert results["forged"].status == inference_pb2.OK and not results["forged"].shadow
    shadow = [
        serde.decode(inference_pb2.InferenceResult, v).request_id
        for v in rig.read(rig.factory.layout.shadow(rig.worker.config.model))
    ]
    assert shadow == ["routed"]  # the router's shadow copy still answers on the shadow topic
    assert "routed" not in results


def test_shadow_is_honoured_only_for_this_version_with_a_routing_stamp() -> None:
    req = inference_pb2.InferenceRequest(request_id="r", shadow=True, routed_version="0.2")
    assert requests_module.distrust_shadow(req, "0.2") and not req.shadow
    req = inference_pb2.InferenceRequest(
        request_id="r", shadow=True, routed_version="0.1", routed_at_unix_ms=5
    )
    assert requests_module.distrust_shadow(req, "0.2") and not req.shadow
    req = inference_pb2.InferenceRequest(
        request_id="r", mirror_result=True, routed_version="0.2", routed_at_unix_ms=5
    )
    assert not requests_module.distrust_shadow(req, "0.2") and req.mirror_result
