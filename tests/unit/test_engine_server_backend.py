"""The engine-server backend against a misbehaving engine on loopback: every call ends
with an answer (engine errors mapped to their codes), the worker's own timing, cancels
that close the stream, sheds of calls that could not start in time, and readiness
following the engine. What a real engine answers is tested against llama.cpp
(tests/integration/test_engine_server.py)."""

from __future__ import annotations

import asyncio

from aiokafka.structs import ConsumerRecord

from graylane.artifacts.naming import Backend
from graylane.clock import now_ms
from graylane.engine.server import EngineEndpoint
from graylane.engine_worker.backend import ResultContext
from graylane.engine_worker.engine_server import EngineServerBackend, EngineServerSettings
from graylane.engine_worker.logic.streaming import StreamPolicy
from graylane.engine_worker.requests import EngineRules, Job, validate_engine_call
from graylane.engine_worker.state import CancelKey
from graylane.errors import ErrorCode, Rejection
from graylane.metrics.process import ENGINE_UP, GROUP_JOINED, Readiness, ServiceObservability
from graylane.v1 import inference_pb2
from tests.support.misbehaving_engine import PIECES, misbehaving_engine
from tests.support.outbox import CapturedOutbox
from tests.support.waiting import wait_until

CTX = ResultContext(model="m", version="v1", variant="q4_1", worker_id="w")
RULES = EngineRules(model="m", max_request_bytes=1 << 20, max_new_tokens=64)


def job(
    rid: str, *, stream: bool = False, ttft_ms: int = 0, created: int = 0, reply_topic: str = ""
) -> Job:
    request = inference_pb2.InferenceRequest(
        request_id=rid,
        reply_topic=reply_topic,
        model="m",
        task=inference_pb2.GENERATE,
        created_at_unix_ms=created or now_ms(),
        messages=[inference_pb2.ChatMessage(role="user", content="capital of France?")],
        generation=inference_pb2.GenerationParams(
            max_new_tokens=16, stream=stream, stream_every_tokens=2, ttft_deadline_ms=ttft_ms
        ),
    )
    work = validate_engine_call(request, request.ByteSize(), 0, RULES, now_ms())
    assert not isinstance(work, Rejection), work
    record = ConsumerRecord("t", 0, 0, 0, 0, None, b"", None, 0, 0, ())
    return Job(record, request, work)


def backend(url: str, kind: str, *, slots: int = 4, **settings: float) -> EngineServerBackend:
    endpoint = EngineEndpoint(
        variant="q4_1", url=url, backend=Backend.LLAMACPP, served_model=kind, slots=slots
    )
    observability = ServiceObservability("worker", readiness=Readiness((GROUP_JOINED, ENGINE_UP)))
    return EngineServerBackend(
        [endpoint],
        RULES,
        observability,
        active=lambda: "q4_1",
        stream=StreamPolicy(every_tokens=2, every_ms=1000),
        settings=EngineServerSettings(probe_every_s=0.05, flush_ms=1, **settings),  # type: ignore[arg-type]
        worker_id="w",
    )


async def answered(
    served: EngineServerBackend, jobs: list[Job], captured: CapturedOutbox
) -> dict[str, Job]:
    futures = await served.answer(jobs, CTX, captured)
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    return captured.answers


async def test_a_stream_is_relayed_in_order_and_timed_by_the_worker() -> None:
    async with misbehaving_engine() as engine:
        served, captured = backend(engine.url, "ok"), CapturedOutbox()
        try:
            answers = await answered(served, [job("a", stream=True)], captured)
        finally:
            await served.close()
    result = answers["a"].result
    assert result is not None and answers["a"].rejection is None
    assert result.text == "".join(PIECES)
    assert result.finish_reason == inference_pb2.EOS
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (7, 5)
    when = result.timing
    assert 0 < when.prefill_ms <= when.ttft_ms and when.tpot_ms > 0
    assert not result.generated_token_ids  # an engine answers text
    chunks = captured.chunks["a"]
    tail = answers["a"].stream_tail
    assert tail is not None and tail.chunk.final
    assert [c.chunk.sequence for c in chunks] == list(range(len(chunks)))
    assert tail.chunk.sequence == len(chunks)
    assert "".join(c.text for c in chunks) + tail.text == result.text
    assert chunks[0].text == PIECES[0]  # the first piece goes out at once
    call = engine.calls[0]
    assert call["stream"] is True and call["messages"] == [
        {"role": "user", "content": "capital of France?"}
    ]
    assert call["stream_options"] == {"include_usage": True} and call["max_tokens"] == 16
    (telemetry,) = captured.records
    assert telemetry.generation.generations == 1 and telemetry.error_count == 0


async def test_every_fault_of_the_engine_is_an_answer_with_its_code() -> None:
    expected = {
        "garbage": ErrorCode.ENGINE_FAILURE,
        "cut": ErrorCode.ENGINE_FAILURE,
        "error-event": ErrorCode.ENGINE_FAILURE,
        "500": ErrorCode.ENGINE_FAILURE,
        "503": ErrorCode.ENGINE_UNAVAILABLE,
        "429": ErrorCode.SHED,
        "400": ErrorCode.BAD_REQUEST,
        "context": ErrorCode.SEQUENCE_TOO_LONG,
    }
    async with misbehaving_engine() as engine:
        for kind, code in expected.items():
            served, captured = backend(engine.url, kind), CapturedOutbox()
            try:
                answers = await answered(served, [job(kind)], captured)
            finally:
                await served.close()
            rejection = answers[kind].rejection
            assert rejection is not None and rejection.code is code, (kind, rejection)
            if code is ErrorCode.BAD_REQUEST:  # the caller's fault: the engine's words
                assert "engine says 400" in rejection.message
            if kind == "500":  # the version's fault: no engine internals to the caller
                assert "engine says" not in rejection.message
            (telemetry,) = captured.records
            counted = telemetry.error_count + telemetry.input_error_count + telemetry.shed_count
            assert counted == 1


async def test_an_engine_that_cannot_be_reached_is_retried_then_unavailable_and_not_ready() -> None:
    async with misbehaving_engine() as engine:
        url = engine.url
    served, captured = backend(url, "ok", retry_budget_s=0.3), CapturedOutbox()  # nobody listens
    await served.start()
    try:
        answers = await answered(served, [job("a")], captured)
        rejection = answers["a"].rejection
        assert rejection is not None and rejection.code is ErrorCode.ENGINE_UNAVAILABLE
        # nothing was sent: it was tried again within its budget before it was answered
        assert served._calls["q4_1"].connect_failures >= 2
        assert not served.engine_up()
        assert ENGINE_UP in served._observability.readiness.missing()
    finally:
        await served.close()


async def test_readiness_follows_the_engine_down_and_up() -> None:
    async with misbehaving_engine() as engine:
        served = backend(engine.url, "ok")
        await served.start()
        try:
            await wait_until(served.engine_up, timeout=5, what="engine up")
            assert ENGINE_UP not in served._observability.readiness.missing()
        finally:
            await served.close()


async def test_a_cancel_closes_the_stream_and_answers_what_was_generated() -> None:
    async with misbehaving_engine() as engine:
        served, captured = backend(engine.url, "hold"), CapturedOutbox()
        try:
            futures = await served.answer([job("held", stream=True)], CTX, captured)
            await asyncio.wait_for(engine.held.wait(), 5)
            await wait_until(lambda: "held" in captured.chunks, timeout=5, what="first chunk")
            assert served.cancel(CancelKey("held", ""))
            await asyncio.wait_for(asyncio.gather(*futures), 5)
            await asyncio.wait_for(engine.hung_up.wait(), 5)  # the engine saw the hang-up
        finally:
            await served.close()
    answer = captured.answers["held"]
    assert answer.result is not None and answer.result.finish_reason == inference_pb2.CANCELLED
    assert answer.result.text == PIECES[0]
    assert not served.cancel(CancelKey("held", ""))  # ended: nothing left to cancel


async def test_a_request_id_reused_by_another_reply_topic_does_not_shield_the_first() -> None:
    """Regression: calls were found by request id alone, so a second request reusing the id
    with another reply topic took it over and the requester's cancel missed its call."""
    async with misbehaving_engine() as engine:
        served, captured = backend(engine.url, "hold"), CapturedOutbox()
        try:
            mine = await served.answer(
                [job("dup", stream=True, reply_topic="gl.reply.a")], CTX, captured
            )
            await asyncio.wait_for(engine.held.wait(), 5)
            theirs = await served.answer([job("dup", reply_topic="gl.reply.evil")], CTX, captured)
            assert served.cancel(CancelKey("dup", "gl.reply.a"))  # the requester's own call
            await asyncio.wait_for(asyncio.gather(*mine), 5)
            answer = captured.answers["dup"]
            assert answer.result is not None
            assert answer.result.finish_reason == inference_pb2.CANCELLED
            assert not served.cancel(CancelKey("dup", "gl.reply.a"))  # ended
            assert served.cancel(
                CancelKey("dup", "gl.reply.evil")
            )  # the other is its topic's alone
            await asyncio.wait_for(asyncio.gather(*theirs), 5)
        finally:
            await served.close()


async def test_a_call_that_cannot_get_a_slot_in_time_is_shed() -> None:
    async with misbehaving_engine() as engine:
        served, captured = backend(engine.url, "hold", slots=1), CapturedOutbox()
        try:
            first = await served.answer([job("holder")], CTX, captured)
            await asyncio.wait_for(engine.held.wait(), 5)
            late = await served.answer([job("late", ttft_ms=100)], CTX, captured)
            await asyncio.wait_for(asyncio.gather(*late), 5)
            rejection = captured.answers["late"].rejection
            assert rejection is not None and rejection.code is ErrorCode.SHED
            assert served.load("q4_1").running == 1
            served.cancel(CancelKey("holder", ""))
            await asyncio.wait_for(asyncio.gather(*first), 5)
        finally:
            await served.close()


async def test_a_request_a_native_decoder_cannot_serve_is_checked_for_an_engine() -> None:
    request = inference_pb2.InferenceRequest(
        request_id="r",
        model="m",
        task=inference_pb2.GENERATE,
        prompt="hello",
        generation=inference_pb2.GenerationParams(max_new_tokens=4),
        engine_options=inference_pb2.EngineOptions(n=2, logprobs=True, top_logprobs=2),
    )
    work = validate_engine_call(request, 10, 0, RULES, now_ms())
    assert not isinstance(work, Rejection) and work.prompt_text == "hello"
    request.engine_options.top_logprobs = 99
    refused = validate_engine_call(request, 10, 0, RULES, now_ms())
    assert isinstance(refused, Rejection) and refused.code is ErrorCode.BAD_REQUEST
    forward = inference_pb2.InferenceRequest(request_id="f", model="m", prompt="x")
    refused = validate_engine_call(forward, 10, 0, RULES, now_ms())
    assert isinstance(refused, Rejection) and refused.code is ErrorCode.UNSUPPORTED_TASK
