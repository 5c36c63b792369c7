"""The worker's protobuf out: results, error codes and telemetry records (pure, no I/O).

One :class:`BatchReport` per planned batch: every job of the batch answered (its
result or its rejection filled in) and the one telemetry record for the batch;
:func:`shed_telemetry` is the record of a cycle in which nothing ran. Batch ids
(:class:`BatchIds`) let the policy engine count a re-sent batch once. Error codes are
:class:`~graylane.errors.ErrorCode` throughout; only the telemetry map (the wire)
keys them by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from graylane import serde
from graylane.clock import now_ms
from graylane.engine_worker.compute import (
    BatchRun,
    ForwardOutcome,
    GenerateOutcome,
    engine_rejection,
)
from graylane.engine_worker.requests import Job, TaskKind, Tokenizer, input_rejection
from graylane.engine_worker.tasks import FinishReason, GenerationResult
from graylane.errors import ErrorCode
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.replies import Rejection
from graylane.kafka.seam import Record
from graylane.v1 import inference_pb2, telemetry_pb2

__all__ = [
    "BatchClock",
    "BatchIds",
    "BatchReport",
    "ResultContext",
    "build_batch",
    "generation_report",
    "generation_result",
    "shed_telemetry",
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


@dataclass(frozen=True, kw_only=True)
class ResultContext:
    """Who answers: the worker's identity and the variant that ran."""

    model: str
    version: str
    variant: str
    worker_id: str
    tokenizer: Tokenizer | None = None


@dataclass(frozen=True, kw_only=True)
class BatchClock:
    """Wall-clock milliseconds of one batch's life."""

    dequeued_ms: int
    started_ms: int
    done_ms: int


@dataclass(frozen=True)
class BatchReport:
    answers: tuple[Job, ...]
    """The batch's jobs, each with its result or its rejection."""
    telemetry: telemetry_pb2.BatchTelemetry
    error_codes: dict[ErrorCode, int] = field(default_factory=dict)
    """Answers per error code (input errors included)."""

    @property
    def served(self) -> int:
        return sum(1 for job in self.answers if job.result is not None)


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
        result.usage.prompt_tokens = prompt_tokens
        result.usage.completion_tokens = len(tokens)
        if request.generation.stream and not request.shadow:
            result.chunk.final = True  # decoded per batch: the whole stream in one chunk
    return result


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


def generation_report(
    jobs: Sequence[Job],
    ctx: ResultContext,
    *,
    started_ms: int,
    device_load: float,
    batch_id: telemetry_pb2.BatchId | None = None,
) -> BatchReport:
    """The report of generations that ended together, each already answered (result or
    rejection): sheds count as sheds, input errors as input errors, the rest as errors."""
    latency, queue_wait = LatencyHistogram(), LatencyHistogram()
    error_codes: dict[ErrorCode, int] = {}
    shadow_count = input_errors = shed = 0
    done = now_ms()
    for job in jobs:
        shadow_count += int(job.request.shadow)
        if job.rejection is not None:
            code = job.rejection.code
            error_codes[code] = error_codes.get(code, 0) + 1
            if code is ErrorCode.SHED:
                shed += 1
            elif code in _INPUT_CODES:
                input_errors += 1
            else:
                latency.record(
                    _since_routed(
                        job.request,
                        BatchClock(dequeued_ms=done, started_ms=started_ms, done_ms=done),
                    )
                )
            continue
        if job.result is None:
            continue
        when = job.result.timing
        clock = BatchClock(
            dequeued_ms=when.dequeued_at_unix_ms, started_ms=started_ms, done_ms=done
        )
        latency.record(_since_routed(job.request, clock))
        queue_wait.record(max(when.queue_wait_ms, _MIN_MS))
    served = [job for job in jobs if job.result is not None]
    compute = sum(job.result.timing.compute_ms for job in served if job.result is not None)
    telemetry = telemetry_pb2.BatchTelemetry(
        model=ctx.model,
        version=ctx.version,
        variant=ctx.variant,
        worker_id=ctx.worker_id,
        batch_size=len(jobs) - shed,
        request_count=len(jobs) - shed,
        error_count=sum(error_codes.values()) - input_errors - shed,
        input_error_count=input_errors,
        shed_count=shed,
        batch_id=batch_id,
        latency=histogram_to_pb(latency),
        queue_wait=histogram_to_pb(queue_wait),
        queue_wait_ms_mean=queue_wait.mean_ms if queue_wait.count else 0.0,
        compute_ms=compute / len(served) if served else 0.0,
        device_load=device_load,
        started_at_unix_ms=started_ms,
        completed_at_unix_ms=done,
        shadow_count=shadow_count,
        error_codes={code.name: n for code, n in error_codes.items()},
        task=TaskKind.GENERATE.value,
    )
    return BatchReport(tuple(jobs), telemetry, error_codes)


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
    latency, queue_wait = LatencyHistogram(), LatencyHistogram()
    error_codes: dict[ErrorCode, int] = {}
    shadow_count = input_errors = 0

    def refuse(job: Job, rejection: Rejection) -> None:
        job.rejection = rejection
        error_codes[rejection.code] = error_codes.get(rejection.code, 0) + 1

    for job in jobs:
        request = job.request
        shadow_count += int(request.shadow)
        outcome = run.outcomes.get(job.index)
        bad_input = run.input_errors.get(job.index)
        if failure is None and bad_input is not None:
            refuse(job, input_rejection(bad_input))
            input_errors += 1
            continue
        broken = run.engine_errors.get(job.index)
        failure_here = (
            engine_rejection(broken) if failure is None and broken is not None else failure
        )
        if failure_here is not None or outcome is None:
            refuse(job, failure_here or Rejection(ErrorCode.INTERNAL, "no outcome"))
            latency.record(_since_routed(request, clock))
            continue
        when = timing(request, clock, run.compute_ms, len(jobs))
        latency.record(_since_routed(request, clock))
        queue_wait.record(max(when.queue_wait_ms, _MIN_MS))
        job.result = _result(request, outcome, ctx, when, len(job.work.prompt_tokens))
    telemetry = telemetry_pb2.BatchTelemetry(
        model=ctx.model,
        version=ctx.version,
        variant=ctx.variant,
        worker_id=ctx.worker_id,
        batch_size=len(jobs),
        request_count=len(jobs),
        error_count=sum(error_codes.values()) - input_errors,
        input_error_count=input_errors,
        batch_id=batch_id,
        latency=histogram_to_pb(latency),
        queue_wait=histogram_to_pb(queue_wait),
        queue_wait_ms_mean=queue_wait.mean_ms if queue_wait.count else 0.0,
        compute_ms=run.compute_ms,
        device_load=device_load,
        started_at_unix_ms=clock.started_ms,
        completed_at_unix_ms=clock.done_ms,
        shadow_count=shadow_count,
        error_codes={code.name: n for code, n in error_codes.items()},
        sequence_bucket=bucket_len,
        task=jobs[0].task.value if jobs else "",
    )
    return BatchReport(tuple(jobs), telemetry, error_codes)


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
