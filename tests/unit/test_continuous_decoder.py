"""The continuous decode loop of the worker, on the real demo GPT (ONNX Runtime), with
its sends captured instead of produced: joins, cancels, sheds and streamed chunks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from graylane.clock import now_ms
from graylane.engine.errors import EngineRunError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.backend import ResultContext
from graylane.engine_worker.compute import WorkerEngines
from graylane.engine_worker.faults import FaultInjection, extends_cache
from graylane.engine_worker.generation import ContinuousDecoder, DecoderLimits
from graylane.engine_worker.kv_decode import generate_with_cache
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.logic.streaming import StreamPolicy
from graylane.engine_worker.requests import Job, TaskKind, WorkItem
from graylane.engine_worker.spans import generation_hop
from graylane.engine_worker.state import CancelKey
from graylane.errors import ErrorCode
from graylane.models.demo_gpt import write_demo_gpt
from graylane.tracing import TracedRequest, record_generation
from graylane.v1 import inference_pb2
from tests.support.outbox import CapturedOutbox

CTX = ResultContext(model="gpt", version="v1", variant="fp32", worker_id="w")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> OnnxRuntimeEngine:
    path = write_demo_gpt(tmp_path_factory.mktemp("kv") / "kv.onnx", "tiny", seed=4, kv_cache=True)
    return OnnxRuntimeEngine.load(path, "fp32", intra_op_threads=1)


def job(
    rid: str,
    prompt: list[int],
    new: int,
    *,
    stream: bool = False,
    ttft_ms: int = 0,
    created: int = 0,
    reply_topic: str = "",
    cancel_token: str = "",
) -> Job:
    request = inference_pb2.InferenceRequest(
        request_id=rid,
        reply_topic=reply_topic,
        cancel_token=cancel_token,
        model="gpt",
        task=inference_pb2.GENERATE,
        created_at_unix_ms=created or now_ms(),
        generation=inference_pb2.GenerationParams(
            max_new_tokens=new, stream=stream, stream_every_tokens=2, ttft_deadline_ms=ttft_ms
        ),
    )
    record = ConsumerRecord("t", 0, 0, 0, 0, None, b"", None, 0, 0, ())
    work = WorkItem(
        index=0,
        task=TaskKind.GENERATE,
        seq_len=len(prompt),
        prompt_tokens=tuple(prompt),
        max_new_tokens=new,
    )
    return Job(record, request, work)


def decoder(engine: OnnxRuntimeEngine, captured: CapturedOutbox, rows: int) -> ContinuousDecoder:
    engines = WorkerEngines(
        {"fp32": engine},
        FaultInjection(),
        policy=BucketPolicy(),
        max_seq_len=256,
        failure_limit=5,
        reload=None,
        give_up=lambda exc: None,
        active=lambda: "fp32",
    )

    return ContinuousDecoder(
        engines,
        CTX,
        engine,
        DecoderLimits(max_sequences=rows, max_seq_len=256),
        stream=StreamPolicy(),
        outbox=captured,
    )


async def test_a_late_short_request_joins_and_finishes_first_with_exact_tokens(
    engine: OnnxRuntimeEngine,
) -> None:
    captured = CapturedOutbox()
    dec = decoder(engine, captured, rows=4)
    # created 50 ms ago: its TTFT (counted from creation, in whole ms) is at least that,
    # however fast this machine prefills
    long_done = dec.submit(job("long", [5, 6, 7], 120, stream=True, created=now_ms() - 50))
    while "long" not in captured.chunks:  # it is decoding
        await asyncio.sleep(0.001)
    short_done = dec.submit(job("short", [9, 8], 5))
    await short_done
    assert not long_done.done()  # answered while the long one still decodes
    await long_done
    await dec.close()
    assert captured.order == ["short", "long"]
    assert dec.peak_rows == 2
    expected = generate_with_cache(engine, [[5, 6, 7], [9, 8]], [120, 5], None, 256)
    by_id = {j.request.request_id: j for j in captured.finished}
    assert tuple(by_id["long"].result.generated_token_ids) == expected[0].tokens
    assert tuple(by_id["short"].result.generated_token_ids) == expected[1].tokens
    chunks = captured.chunks["long"]
    streamed = [t for c in chunks for t in c.generated_token_ids]
    tail = list(by_id["long"].stream_tail.generated_token_ids)
    assert streamed + tail == list(expected[0].tokens)
    assert [c.chunk.sequence for c in chunks] == list(range(len(chunks)))
    assert by_id["long"].stream_tail.chunk.final
    assert by_id["long"].result.timing.ttft_ms >= 50
    assert by_id["long"].result.finish_reason == inference_pb2.LENGTH


async def test_a_request_id_reused_by_another_reply_topic_does_not_shield_the_first(
    engine: OnnxRuntimeEngine,
) -> None:
    """Regression: generations were found by request id alone, so a second request that
    reused the id with another reply topic took the id over, and the requester's own
    cancel no longer reached its generation."""
    captured = CapturedOutbox()
    dec = decoder(engine, captured, rows=2)
    mine = dec.submit(job("dup", [3, 4], 200, stream=True, reply_topic="gl.reply.a"))
    theirs = dec.submit(job("dup", [5, 6], 12, reply_topic="gl.reply.evil"))
    while "dup" not in captured.chunks:  # mine is decoding
        await asyncio.sleep(0.001)
    assert dec.cancel(CancelKey("dup", "gl.reply.a"))
    await asyncio.gather(mine, theirs)
    await dec.close()
    by_topic = {j.request.reply_topic: j for j in captured.finished}
    assert by_topic["gl.reply.a"].result.finish_reason == inference_pb2.CANCELLED
    assert len(by_topic["gl.reply.a"].result.generated_token_ids) < 200
    assert by_topic["gl.reply.evil"].result.finish_reason == inference_pb2.LENGTH
    assert not dec.cancel(CancelKey("dup", "gl.reply.a"))  # ended: nothing left under its key


async def test_a_cancel_without_the_requests_token_stops_nothing(
    engine: OnnxRuntimeEngine,
) -> None:
    """A request id and a reply topic are no secret (a reply topic is named in every
    request on the ingress); the token only the requester holds is."""
    captured = CapturedOutbox()
    dec = decoder(engine, captured, rows=2)
    done = dec.submit(
        job("t", [3, 4], 200, stream=True, reply_topic="gl.reply.a", cancel_token="k1")
    )
    while "t" not in captured.chunks:
        await asyncio.sleep(0.001)
    assert not dec.cancel(CancelKey("t", "gl.reply.a"))  # no token
    assert not dec.cancel(CancelKey("t", "gl.reply.a", "guessed"))
    assert dec.cancel(CancelKey("t", "gl.reply.a", "k1"))
    await done
    await dec.close()
    (answered,) = captured.finished
    assert answered.result.finish_reason == inference_pb2.CANCELLED


async def test_a_cancel_ends_a_running_sequence_and_frees_its_rows(
    engine: OnnxRuntimeEngine,
) -> None:
    captured = CapturedOutbox()
    dec = decoder(engine, captured, rows=2)
    done = dec.submit(job("c", [3, 4], 200, stream=True))
    while "c" not in captured.chunks:
        await asyncio.sleep(0.001)
    assert not dec.cancel(CancelKey("c", "gl.reply.someone-else"))  # not the requester's topic
    assert dec.cancel(CancelKey("c", ""))
    await done
    await dec.close()
    (answered,) = captured.finished
    assert answered.result is not None
    assert answered.result.finish_reason == inference_pb2.CANCELLED
    assert 0 < len(answered.result.generated_token_ids) < 200
    assert dec.live == 0
    assert dec._loop.scheduler.running == () and dec._loop.scheduler.reserved_kv_tokens == 0


async def test_a_request_that_cannot_start_within_its_ttft_budget_is_shed(
    engine: OnnxRuntimeEngine,
) -> None:
    captured = CapturedOutbox()
    dec = decoder(engine, captured, rows=1)
    busy = dec.submit(job("busy", [3, 4], 150))
    late = dec.submit(job("late", [5], 4, ttft_ms=30))
    await late
    assert not busy.done()
    shed = next(j for j in captured.finished if j.request.request_id == "late")
    assert shed.rejection is not None and shed.rejection.code is ErrorCode.SHED
    await busy
    await dec.close()


async def test_a_prompt_the_loop_refuses_is_answered_not_fatal(engine: OnnxRuntimeEngine) -> None:
    captured = CapturedOutbox()
    dec = decoder(engine, captured, rows=2)
    await dec.submit(job("empty", [], 4))
    ok = dec.submit(job("fine", [1, 2], 3))
    await ok
    await dec.close()
    by_id = {j.request.request_id: j for j in captured.finished}
    assert by_id["empty"].rejection is not None
    assert len(by_id["fine"].result.generated_token_ids) == 3


async def test_a_step_where_a_streamed_row_joins_counts_its_rows_once(
    engine: OnnxRuntimeEngine,
) -> None:
    captured = CapturedOutbox()
    dec = decoder(engine, captured, rows=1)
    await dec.submit(job("alone", [5, 6, 7], 6, stream=True))
    await dec.close()
    assert dec.steps > 0
    assert dec.peak_rows == 1
    assert dec.rows_stepped == dec.steps  # one row in every step, the joining one too


class FailsTheDecodeAfterAPrefill:
    """The real engine, except that once armed, the decode step right after the next
    prefill fails (as a device error would)."""

    def __init__(self, inner: OnnxRuntimeEngine) -> None:
        self._inner = inner
        self.armed = False
        self._prefilled = False
        self.name, self.variant, self.io = inner.name, inner.variant, inner.io

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.armed and not extends_cache(feeds):
            self._prefilled = True
        elif self.armed and self._prefilled:
            self.armed = False
            raise EngineRunError("device lost")
        return self._inner.run(feeds)

    def close(self) -> None:
        self._inner.close()


async def test_a_row_finished_by_its_prefill_keeps_its_answer_when_the_decode_fails(
    engine: OnnxRuntimeEngine,
) -> None:
    captured = CapturedOutbox()
    faulty = FailsTheDecodeAfterAPrefill(engine)
    dec = decoder(faulty, captured, rows=4)  # type: ignore[arg-type]
    running = dec.submit(job("running", [5, 6, 7], 200))
    while not dec.rows_stepped:  # it is decoding
        await asyncio.sleep(0.001)
    faulty.armed = True  # two join the next step; its decode fails after their prefill
    one_token = dec.submit(job("one-token", [9, 8], 1))
    streamed = dec.submit(job("streamed", [4, 3], 8, stream=True))
    await asyncio.wait_for(asyncio.gather(running, one_token, streamed), timeout=30)
    await dec.close()
    by_id = {j.request.request_id: j for j in captured.finished}
    assert by_id["running"].rejection is not None  # rows of the failed decode
    assert by_id["streamed"].rejection is not None
    assert by_id["one-token"].rejection is None  # done before the failure: answered
    expected = generate_with_cache(engine, [[9, 8]], [1], None, 256)
    assert tuple(by_id["one-token"].result.generated_token_ids) == expected[0].tokens


async def test_the_span_of_a_streamed_generation_says_what_it_decoded(
    engine: OnnxRuntimeEngine,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    captured = CapturedOutbox()
    dec = decoder(engine, captured, rows=2)
    # created 50 ms ago: TTFT counts from creation, so a fast prefill cannot round it to 0
    await dec.submit(job("streamed", [5, 6, 7], 9, stream=True, created=now_ms() - 50))
    await dec.submit(job("late", [1, 2], 3, ttft_ms=1, created=now_ms() - 1000))  # shed
    await dec.close()
    by_id = {j.request.request_id: j for j in captured.finished}
    streamed = by_id["streamed"]
    hop = generation_hop(streamed, CTX, time.time_ns())
    assert (hop.model, hop.version, hop.variant) == ("gpt", "v1", "fp32")
    assert (hop.prompt_tokens, hop.generated_tokens) == (3, 9)
    assert hop.finish_reason == "LENGTH" and hop.error_code == ""
    assert hop.ttft_ms == streamed.result.timing.ttft_ms >= 50
    assert hop.stream_chunks == len(captured.chunks["streamed"]) > 0
    assert hop.dequeued_ns <= hop.first_token_ns <= hop.finished_ns
    shed = generation_hop(by_id["late"], CTX, time.time_ns())
    assert shed.error_code == "SHED" and shed.finish_reason == "FAILED"
    for j, h in ((streamed, hop), (by_id["late"], shed)):
        request = TracedRequest(
            headers=None, timestamp_ms=0, shadow=False, request_id=j.request.request_id
        )
        for span in record_generation(request, h, provider.get_tracer("w")):
            span.end()
    roots = {
        s.attributes["graylane.request_id"]: s
        for s in exporter.get_finished_spans()
        if s.name == "graylane.worker generation" and s.attributes is not None
    }
    assert roots["streamed"].attributes["graylane.generated_tokens"] == 9
    assert roots["late"].status.status_code is StatusCode.ERROR
