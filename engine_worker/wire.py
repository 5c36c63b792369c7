"""The worker's protobuf out: results, stream chunks and telemetry records (pure, no I/O).

The worker's edge: the outbox (:class:`~graylane.engine_worker.outbox.WorkerOutbox`)
maps what a backend hands it (:mod:`~graylane.engine_worker.backend`: a batch the engine
ran, generations that ended together, a stream's next piece) onto the wire here, and
only here; nothing of the worker's domain imports this module. One
:class:`~graylane.engine_worker.backend.BatchReport` per batch: every job answered (its
result or its rejection filled in) and the one telemetry record for the batch;
:func:`shed_telemetry` is the record of a cycle in which nothing ran. Batch ids
(:class:`BatchIds`) let the policy engine count a re-sent batch once. Error codes are
:class:`~graylane.errors.ErrorCode` throughout; only the telemetry map (the wire) keys
them by name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from graylane import serde
from graylane.clock import now_ms
from graylane.engine_worker.backend import (
    BatchClock,
    BatchReport,
    Decoded,
    DecodeLoad,
    Ended,
    EndedTogether,
    RanJobs,
    ResultContext,
    TokenTimes,
)
from graylane.engine_worker.compute import (
    BatchRun,
    ForwardOutcome,
    GenerateOutcome,
    engine_rejection,
)
from graylane.engine_worker.kv_decode import FinishReason, GenerationResult
from graylane.engine_worker.logic.streaming import ChunkPiece
from graylane.engine_worker.openai_calls import EngineAnswer
from graylane.engine_worker.requests import Job, TaskKind, input_rejection
from graylane.errors import ErrorCode, Rejection
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.seam import Record
from graylane.v1 import inference_pb2, telemetry_pb2

__all__ = [
    "BatchIds",
    "GenerationTally",
    "answer_ended",
    "batch_report",
    "build_batch",
    "decoded_result",
    "decoding_of",
    "engine_result",
    "final_chunk",
    "generation_report",
    "generation_result",
    "generations_report",
    "shed_telemetry",
    "stream_chunk",
    "timing",
]

_MIN_MS = 0.001  # histograms take positive values only
_INPUT_CODES = frozenset(
    {
        ErrorCode.BAD_REQUEST,
        ErrorCode.BAD_SHAPE,
        ErrorCode.BAD_DTYPE,
        ErrorCode.MISSING_INPUT,
        ErrorCode.UNEXPECTED_INPUT,
        ErrorCode.SEQUENCE_TOO_LONG,
        ErrorCode.PAYLOAD_TOO_LARGE,
    }
)
_REMEMBERED = 4096
_FINISH = {
    FinishReason.EOS: inference_pb2.EOS,
    FinishReason.LENGTH: inference_pb2.LENGTH,
    FinishReason.MAX_SEQ: inference_pb2.MAX_SEQUENCE,
    FinishReason.STOP: inference_pb2.STOP,
    FinishReason.CANCELLED: inference_pb2.CANCELLED,
}
"""Why a generation ended, on the wire."""


def _since_routed(request: inference_pb2.InferenceRequest, clock: BatchClock) -> float:
    """Latency the worker vouches for: from the router's stamp, not the client's."""
    start = request.routed_at_unix_ms or request.created_at_unix_ms or clock.dequeued_ms
    return max(float(max(0, clock.done_ms - start)), _MIN_MS)


def timing(
    request: inference_pb2.InferenceRequest,
    clock: BatchClock,
    compute_ms: float,
    batch_size: int,
) -> inference_pb2.Timing:
    created = request.created_at_unix_ms or request.routed_at_unix_ms or clock.dequeued_ms
    queued_since = request.routed_at_unix_ms or created
    return inference_pb2.Timing(
        created_at_unix_ms=created,
        routed_at_unix_ms=request.routed_at_unix_ms,
        dequeued_at_unix_ms=clock.dequeued_ms,
        completed_at_unix_ms=clock.done_ms,
        queue_wait_ms=float(max(0, clock.dequeued_ms - queued_since)),
        compute_ms=compute_ms,
        total_ms=float(max(0, clock.done_ms - created)),
        batch_size=batch_size,
    )


def _result(
    request: inference_pb2.InferenceRequest,
    outcome: ForwardOutcome | GenerateOutcome,
    ctx: ResultContext,
    when: inference_pb2.Timing,
    prompt_tokens: int,
) -> inference_pb2.InferenceResult:
    result = inference_pb2.InferenceResult(
        request_id=request.request_id,
        model=request.model,
        version=ctx.version,
        variant=ctx.variant,
        status=inference_pb2.OK,
        shadow=request.shadow,
        shadow_pair_id=request.shadow_pair_id,
        prompt_sha256=prompt_digest(request),
        worker_id=ctx.worker_id,
        routing_key=request.routing_key,
        task=request.task or inference_pb2.FORWARD,
        timing=when,
    )
    if isinstance(outcome, ForwardOutcome):
        result.outputs.extend(serde.to_tensors(outcome.outputs))
    else:
        generation = outcome.result
        tokens = generation.tokens
        result.generated_token_ids.extend(tokens)
        if generation.text is not None:  # cut before a stop string
            result.text = generation.text
        elif ctx.tokenizer is not None:
            result.text = ctx.tokenizer.decode(tokens)
        result.finish_reason = _FINISH[generation.finished_reason]
        result.decoding = decoding_of(request.generation)
        result.usage.prompt_tokens = prompt_tokens
        result.usage.completion_tokens = len(tokens)
        if request.generation.stream and not request.shadow:
            result.chunk.final = True  # decoded per batch: the whole stream in one chunk
    return result


def prompt_digest(request: inference_pb2.InferenceRequest) -> str:
    """sha256 of a shadow-paired generation's question: its prompt, messages and token ids,
    the engine options and the sampling parameters but the seed and the streaming; "" for
    other requests. Shadow agreement on text takes two answers with the same digest as two
    draws of one question (the baseline's own variation)."""
    if not request.shadow_pair_id or request.task != inference_pb2.GENERATE:
        return ""
    params = inference_pb2.GenerationParams()
    params.CopyFrom(request.generation)
    for name in ("seed", "has_seed", "stream", "stream_every_tokens", "stream_every_ms"):
        params.ClearField(name)
    question = inference_pb2.InferenceRequest(
        model=request.model,
        prompt=request.prompt,
        token_ids=request.token_ids,
        messages=request.messages,
        generation=params,
        engine_options=request.engine_options,
        task=request.task,
    )
    return hashlib.sha256(question.SerializeToString(deterministic=True)).hexdigest()


def decoding_of(params: inference_pb2.GenerationParams) -> inference_pb2.Decoding:
    """How a generation with ``params`` chooses its tokens (shadow agreement compares
    greedy or same-seed answers token for token, never unseeded samples)."""
    if params.temperature <= 0.0:
        return inference_pb2.GREEDY
    return inference_pb2.SEEDED if params.has_seed else inference_pb2.UNSEEDED


def generation_result(
    job: Job,
    outcome: GenerationResult,
    ctx: ResultContext,
    *,
    started_ms: int,
) -> inference_pb2.InferenceResult:
    """The answer of one generation of the continuous decode loop; its timing is the
    request's own, from ``started_ms``."""
    done = now_ms()
    clock = BatchClock(dequeued_ms=started_ms, started_ms=started_ms, done_ms=done)
    when = timing(job.request, clock, float(max(0, done - started_ms)), 1)
    return _result(job.request, GenerateOutcome(outcome), ctx, when, len(job.work.prompt_tokens))


def decoded_result(job: Job, decoded: Decoded, ctx: ResultContext) -> inference_pb2.InferenceResult:
    """The answer of one generation of the continuous decode loop, timed by its own
    token times: time to first token from the request's creation, time per output token
    between its first and last token, the prefill from when it got its decode row."""
    times = decoded.times
    started = times.started_ms or times.submitted_ms
    result = generation_result(job, decoded.result, ctx, started_ms=started)
    _token_timing(result.timing, times, len(decoded.result.tokens))
    return result


def _token_timing(when: inference_pb2.Timing, times: TokenTimes, tokens: int) -> None:
    created = when.created_at_unix_ms or times.submitted_ms
    if times.first_token_ms:
        when.ttft_ms = float(max(0, times.first_token_ms - created))
    if tokens > 1 and times.last_token_ms > times.first_token_ms:
        when.tpot_ms = (times.last_token_ms - times.first_token_ms) / (tokens - 1)
    if times.first_token_ms and times.started_ms:
        when.prefill_ms = float(max(0, times.first_token_ms - times.started_ms))
    when.inter_token_p99_ms = times.inter_token_p99_ms
    when.dequeued_at_unix_ms = times.started_ms or times.submitted_ms
    queued_since = when.routed_at_unix_ms or created
    when.queue_wait_ms = float(max(0, when.dequeued_at_unix_ms - queued_since))
    when.compute_ms = float(max(0, when.completed_at_unix_ms - when.dequeued_at_unix_ms))


def stream_chunk(
    job: Job,
    ctx: ResultContext,
    piece: ChunkPiece,
    logprobs: Sequence[inference_pb2.TokenLogprob] = (),
) -> inference_pb2.InferenceResult:
    """One chunk of a streamed generation (what is new since the last one)."""
    request = job.request
    chunk = inference_pb2.InferenceResult(
        request_id=request.request_id,
        model=request.model,
        version=ctx.version,
        variant=ctx.variant,
        worker_id=ctx.worker_id,
        status=inference_pb2.OK,
        task=inference_pb2.GENERATE,
        routing_key=request.routing_key,
        text=piece.text,
        chunk=inference_pb2.StreamChunk(sequence=piece.sequence, final=piece.final),
    )
    chunk.generated_token_ids.extend(piece.token_ids)
    chunk.logprobs.extend(logprobs)
    return chunk


def final_chunk(
    result: inference_pb2.InferenceResult,
    piece: ChunkPiece,
    logprobs: Sequence[inference_pb2.TokenLogprob] = (),
) -> inference_pb2.InferenceResult:
    """The last chunk of a stream: the whole answer (finish reason, usage, timings) with
    only what was not published yet."""
    tail = inference_pb2.InferenceResult()
    tail.CopyFrom(result)
    del tail.generated_token_ids[:]
    tail.generated_token_ids.extend(piece.token_ids)
    tail.text = piece.text
    del tail.logprobs[:]
    tail.logprobs.extend(logprobs)
    tail.chunk.sequence = piece.sequence
    tail.chunk.final = True
    return tail


def answer_ended(ended: Ended, ctx: ResultContext) -> None:
    """Fill in the answer of one ended generation: its result (and the final chunk of a
    stream), or its rejection."""
    job, outcome = ended.job, ended.outcome
    if isinstance(outcome, Rejection):
        job.result, job.rejection = None, outcome
        return
    if isinstance(outcome, Decoded):
        job.result = decoded_result(job, outcome, ctx)
    else:
        job.result = engine_result(job, outcome, ctx)
    if ended.tail is not None:
        job.stream_tail = final_chunk(job.result, ended.tail, ended.tail_logprobs)


def generations_report(
    together: EndedTogether, batch_id: telemetry_pb2.BatchId | None = None
) -> BatchReport:
    """Answer generations that ended together; their one report."""
    for ended in together.ended:
        answer_ended(ended, together.context)
    return generation_report(
        [ended.job for ended in together.ended],
        together.context,
        started_ms=together.started_ms,
        device_load=together.device_load,
        batch_id=batch_id,
        load=together.load,
    )


def batch_report(
    ran: RanJobs, ctx: ResultContext, batch_id: telemetry_pb2.BatchId | None = None
) -> BatchReport:
    """Answer a batch the engine ran; its report, carrying the cycle's pending sheds."""
    report = build_batch(
        ran.jobs,
        ran.ran.run,
        ran.ran.failure,
        ctx,
        ran.clock,
        bucket_len=ran.bucket_len,
        device_load=ran.ran.device_load,
        batch_id=batch_id,
    )
    report.telemetry.shed_count = ran.shed_count
    return report


def engine_result(
    job: Job, answer: EngineAnswer, ctx: ResultContext
) -> inference_pb2.InferenceResult:
    """The answer of one generation an engine server ran, timed by the worker: time to
    first token from the request's creation, time per output token over the engine's
    token count."""
    request = job.request
    done = now_ms()
    clock = BatchClock(dequeued_ms=answer.started_ms, started_ms=answer.started_ms, done_ms=done)
    when = timing(request, clock, float(max(0, done - answer.started_ms)), 1)
    if answer.first_token_ms:
        when.ttft_ms = float(max(0, answer.first_token_ms - when.created_at_unix_ms))
        when.prefill_ms = float(max(0, answer.first_token_ms - answer.started_ms))
    tokens = answer.completion_tokens
    if tokens > 1 and answer.last_token_ms > answer.first_token_ms:
        when.tpot_ms = (answer.last_token_ms - answer.first_token_ms) / (tokens - 1)
    when.inter_token_p99_ms = answer.inter_token_p99_ms
    first, reason = answer.choices[0]
    result = inference_pb2.InferenceResult(
        request_id=request.request_id,
        model=request.model,
        version=ctx.version,
        variant=ctx.variant,
        status=inference_pb2.OK,
        shadow=request.shadow,
        shadow_pair_id=request.shadow_pair_id,
        prompt_sha256=prompt_digest(request),
        worker_id=ctx.worker_id,
        routing_key=request.routing_key,
        task=inference_pb2.GENERATE,
        timing=when,
        text=first.text,
        finish_reason=reason,
        decoding=decoding_of(request.generation),
    )
    result.usage.prompt_tokens = answer.prompt_tokens
    result.usage.completion_tokens = tokens
    result.logprobs.extend(first.logprobs)
    result.tool_calls.extend(first.calls())
    for choice, choice_reason in answer.choices[1:]:
        extra = result.extra_choices.add(
            index=choice.index, text=choice.text, finish_reason=choice_reason
        )
        extra.logprobs.extend(choice.logprobs)
        extra.tool_calls.extend(choice.calls())
    return result


class GenerationTally:
    """The generation part of a batch's telemetry, built from its OK answers."""

    def __init__(self) -> None:
        self.ttft = LatencyHistogram()
        self.tpot = LatencyHistogram()
        self.inter_token_p99 = LatencyHistogram()
        self.prefill = LatencyHistogram()
        self.output_tokens = LatencyHistogram()
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.generations = 0
        self.finish_reasons: dict[int, int] = {}

    def add(self, result: inference_pb2.InferenceResult) -> None:
        """Count one generation's answer (a timing of 0 is unknown, not recorded)."""
        when = result.timing
        for hist, value in (
            (self.ttft, when.ttft_ms),
            (self.tpot, when.tpot_ms),
            (self.inter_token_p99, when.inter_token_p99_ms),
            (self.prefill, when.prefill_ms),
        ):
            if value > 0.0:
                hist.record(value)
        tokens = max(0, result.usage.completion_tokens)
        self.output_tokens.record(float(tokens))
        self.prompt_tokens += max(0, result.usage.prompt_tokens)
        self.generated_tokens += tokens
        self.generations += 1
        reason = int(result.finish_reason)
        self.finish_reasons[reason] = self.finish_reasons.get(reason, 0) + 1

    def to_pb(self, load: DecodeLoad | None) -> telemetry_pb2.GenerationTelemetry:
        load = load or DecodeLoad()
        pb = telemetry_pb2.GenerationTelemetry(
            ttft=histogram_to_pb(self.ttft),
            tpot=histogram_to_pb(self.tpot),
            inter_token_p99=histogram_to_pb(self.inter_token_p99),
            prefill=histogram_to_pb(self.prefill),
            output_tokens=histogram_to_pb(self.output_tokens),
            prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated_tokens,
            generations=self.generations,
            kv_cache_occupancy=min(1.0, max(0.0, load.kv_cache_occupancy)),
            waiting_sequences=max(0, load.waiting),
            running_sequences=max(0, load.running),
        )
        for reason, n in sorted(self.finish_reasons.items()):
            pb.finish_reasons.add(reason=reason, count=n)
        return pb


class _Tally:
    """What one batch's answers add up to: its telemetry's counts and histograms.

    One builder for every kind of batch (per-cycle batches and generations of the
    continuous decode loop), so their telemetry means the same.
    """

    def __init__(self) -> None:
        self.latency = LatencyHistogram()
        self.queue_wait = LatencyHistogram()
        self.error_codes: dict[ErrorCode, int] = {}
        self.shadow = 0
        self.input_errors = 0
        self.shed = 0
        self.generation: GenerationTally | None = None

    def seen(self, request: inference_pb2.InferenceRequest) -> None:
        self.shadow += int(request.shadow)

    def refused(self, code: ErrorCode, *, input_error: bool) -> None:
        """An answer of error ``code`` that is no failure of the version: a request
        refused for its own input (``input_error``), else a shed."""
        self._count(code)
        if input_error:
            self.input_errors += 1
        else:
            self.shed += 1

    def failed(self, code: ErrorCode, latency_ms: float) -> None:
        """An error answer the version is accountable for."""
        self._count(code)
        self.latency.record(latency_ms)

    def _count(self, code: ErrorCode) -> None:
        self.error_codes[code] = self.error_codes.get(code, 0) + 1

    def served(self, result: inference_pb2.InferenceResult, latency_ms: float) -> None:
        self.latency.record(latency_ms)
        self.queue_wait.record(max(result.timing.queue_wait_ms, _MIN_MS))
        if result.task == inference_pb2.GENERATE:
            if self.generation is None:
                self.generation = GenerationTally()
            self.generation.add(result)

    def telemetry(
        self,
        ctx: ResultContext,
        *,
        jobs: int,
        compute_ms: float,
        device_load: float,
        started_ms: int,
        done_ms: int,
        task: str,
        batch_id: telemetry_pb2.BatchId | None,
        bucket_len: int = 0,
        load: DecodeLoad | None = None,
    ) -> telemetry_pb2.BatchTelemetry:
        ran = jobs - self.shed
        telemetry = telemetry_pb2.BatchTelemetry(
            model=ctx.model,
            version=ctx.version,
            variant=ctx.variant,
            worker_id=ctx.worker_id,
            batch_size=ran,
            request_count=ran,
            error_count=sum(self.error_codes.values()) - self.input_errors - self.shed,
            input_error_count=self.input_errors,
            shed_count=self.shed,
            batch_id=batch_id,
            latency=histogram_to_pb(self.latency),
            queue_wait=histogram_to_pb(self.queue_wait),
            queue_wait_ms_mean=self.queue_wait.mean_ms if self.queue_wait.count else 0.0,
            compute_ms=compute_ms,
            device_load=device_load,
            started_at_unix_ms=started_ms,
            completed_at_unix_ms=done_ms,
            shadow_count=self.shadow,
            error_codes={code.name: n for code, n in self.error_codes.items()},
            sequence_bucket=bucket_len,
            task=task,
        )
        if self.generation is not None:
            telemetry.generation.CopyFrom(self.generation.to_pb(load))
        return telemetry


def generation_report(
    jobs: Sequence[Job],
    ctx: ResultContext,
    *,
    started_ms: int,
    device_load: float,
    batch_id: telemetry_pb2.BatchId | None = None,
    load: DecodeLoad | None = None,
) -> BatchReport:
    """The report of generations that ended together, each already answered (result or
    rejection): sheds count as sheds, input errors as input errors, the rest as errors.
    ``load``: the decode loop's state as they ended (the telemetry's load signals)."""
    tally = _Tally()
    done = now_ms()
    for job in jobs:
        tally.seen(job.request)
        if job.rejection is not None:
            code = job.rejection.code
            if code is ErrorCode.SHED or code in _INPUT_CODES:
                tally.refused(code, input_error=code is not ErrorCode.SHED)
            else:
                clock = BatchClock(dequeued_ms=done, started_ms=started_ms, done_ms=done)
                tally.failed(code, _since_routed(job.request, clock))
        elif job.result is not None:
            when = job.result.timing
            clock = BatchClock(
                dequeued_ms=when.dequeued_at_unix_ms, started_ms=started_ms, done_ms=done
            )
            tally.served(job.result, _since_routed(job.request, clock))
    served = [job.result for job in jobs if job.result is not None]
    compute = sum(result.timing.compute_ms for result in served)
    telemetry = tally.telemetry(
        ctx,
        jobs=len(jobs),
        compute_ms=compute / len(served) if served else 0.0,
        device_load=device_load,
        started_ms=started_ms,
        done_ms=done,
        task=TaskKind.GENERATE.value,
        batch_id=batch_id,
        load=load,
    )
    return BatchReport(tuple(jobs), telemetry, tally.error_codes)


def build_batch(
    jobs: Sequence[Job],
    run: BatchRun,
    failure: Rejection | None,
    ctx: ResultContext,
    clock: BatchClock,
    *,
    bucket_len: int,
    device_load: float,
    batch_id: telemetry_pb2.BatchId | None = None,
) -> BatchReport:
    """Answer every job of a batch from its run, and the batch's telemetry.

    Requests the engine refused for their own input count in ``input_error_count``,
    never in ``error_count``: a client cannot fail a version's error gate.
    """
    tally = _Tally()
    for job in jobs:
        request = job.request
        tally.seen(request)
        outcome = run.outcomes.get(job.index)
        bad_input = run.input_errors.get(job.index)
        if failure is None and bad_input is not None:
            job.rejection = input_rejection(bad_input)
            tally.refused(job.rejection.code, input_error=True)
            continue
        broken = run.engine_errors.get(job.index)
        failure_here = (
            engine_rejection(broken) if failure is None and broken is not None else failure
        )
        if failure_here is not None or outcome is None:
            job.rejection = failure_here or Rejection(ErrorCode.INTERNAL, "no outcome")
            tally.failed(job.rejection.code, _since_routed(request, clock))
            continue
        when = timing(request, clock, run.compute_ms, len(jobs))
        job.result = _result(request, outcome, ctx, when, len(job.work.prompt_tokens))
        tally.served(job.result, _since_routed(request, clock))
    telemetry = tally.telemetry(
        ctx,
        jobs=len(jobs),
        compute_ms=run.compute_ms,
        device_load=device_load,
        started_ms=clock.started_ms,
        done_ms=clock.done_ms,
        task=jobs[0].task.value if jobs else "",
        batch_id=batch_id,
        bucket_len=bucket_len,
    )
    return BatchReport(tuple(jobs), telemetry, tally.error_codes)


def shed_telemetry(
    ctx: ResultContext, shed_count: int, done_ms: int
) -> telemetry_pb2.BatchTelemetry:
    """A telemetry record of sheds alone (no request ran): the load is still seen."""
    return telemetry_pb2.BatchTelemetry(
        model=ctx.model,
        version=ctx.version,
        variant=ctx.variant,
        worker_id=ctx.worker_id,
        completed_at_unix_ms=done_ms,
        shed_count=shed_count,
    )


class BatchIds:
    """Ids for batch telemetry: (worker, partition, first offset, attempt).

    A rewind or a restart re-sends a batch with the same (worker, partition, first
    offset), so the policy engine counts it once; ``attempt`` says how often this
    process ran it. The last attempts are remembered (bounded).
    """

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id
        self._attempts: dict[tuple[int, int], int] = {}

    def of(self, first: Record) -> telemetry_pb2.BatchId:
        """Who ran the batch starting at ``first``, and how often this process did."""
        where = (first.partition, first.offset)
        attempt = self._attempts.pop(where, -1) + 1
        self._attempts[where] = attempt
        while len(self._attempts) > _REMEMBERED:
            del self._attempts[next(iter(self._attempts))]
        return telemetry_pb2.BatchId(
            worker_id=self._worker_id,
            partition=first.partition,
            first_offset=first.offset,
            attempt=attempt,
        )
