"""Build results and batch telemetry from a batch run (pure: protobuf out, no I/O).

One :class:`BatchReport` per planned batch: an answer per request (a result or a
rejection) in batch order, and the one telemetry record for the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from graylane import tensors
from graylane.engine.errors import EngineError, InvalidInputError
from graylane.engine_worker.compute import BatchRun, ForwardOutcome, GenerateOutcome
from graylane.engine_worker.faults import InjectedFault
from graylane.engine_worker.requests import WorkItem
from graylane.engine_worker.tokenizer import Tokenizer
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.replies import Rejection
from graylane.v1 import inference_pb2, telemetry_pb2

__all__ = [
    "Answer",
    "BatchClock",
    "BatchReport",
    "ResultContext",
    "build_batch",
    "engine_rejection",
    "timing",
]

_MIN_MS = 0.001  # histograms take positive values only


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
class Answer:
    """What one request gets: a result, or a rejection to send as an error result."""

    index: int
    """Position of the request's record in the fetched cycle."""
    request: inference_pb2.InferenceRequest
    result: inference_pb2.InferenceResult | None = None
    rejection: Rejection | None = None


@dataclass(frozen=True)
class BatchReport:
    answers: tuple[Answer, ...]
    telemetry: telemetry_pb2.BatchTelemetry
    error_codes: dict[str, int] = field(default_factory=dict)

    @property
    def served(self) -> int:
        return sum(1 for a in self.answers if a.result is not None)


def engine_rejection(exc: EngineError) -> Rejection:
    """The error result for a batch whose engine failed: its own code if it has one."""
    if isinstance(exc, InjectedFault):
        return Rejection(inference_pb2.INJECTED_FAULT, str(exc))
    return Rejection(inference_pb2.ENGINE_FAILURE, f"engine failed: {exc}")


def input_rejection(exc: InvalidInputError) -> Rejection:
    """The error result for a request the engine refused for its own input."""
    names = inference_pb2.ErrorCode.keys()
    code = exc.code if exc.code in names else "BAD_REQUEST"
    return Rejection(cast("inference_pb2.ErrorCode", inference_pb2.ErrorCode.Value(code)), str(exc))


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
) -> inference_pb2.InferenceResult:
    result = inference_pb2.InferenceResult(
        request_id=request.request_id,
        model=request.model,
        version=ctx.version,
        variant=ctx.variant,
        status=inference_pb2.OK,
        shadow=request.shadow,
        worker_id=ctx.worker_id,
        routing_key=request.routing_key,
        task=request.task or inference_pb2.FORWARD,
        timing=when,
    )
    if isinstance(outcome, ForwardOutcome):
        result.outputs.extend(tensors.to_tensors(outcome.outputs))
    else:
        tokens = outcome.result.tokens
        result.generated_token_ids.extend(tokens)
        if ctx.tokenizer is not None:
            result.text = ctx.tokenizer.decode(tokens)
    return result


def build_batch(
    items: Sequence[WorkItem],
    requests: Mapping[int, inference_pb2.InferenceRequest],
    run: BatchRun,
    failure: Rejection | None,
    ctx: ResultContext,
    clock: BatchClock,
    *,
    bucket_len: int,
    device_load: float,
    batch_id: telemetry_pb2.BatchId | None = None,
) -> BatchReport:
    """Answers for ``items`` (``requests`` by item index) and the batch's telemetry.

    Requests the engine refused for their own input count in ``input_error_count``,
    never in ``error_count``: a client cannot fail a version's error gate.
    """
    latency, queue_wait = LatencyHistogram(), LatencyHistogram()
    error_codes: dict[str, int] = {}
    answers: list[Answer] = []
    shadow_count = input_errors = 0
    for item in items:
        request = requests.get(item.index)
        if request is None:
            continue
        shadow_count += int(request.shadow)
        outcome = run.outcomes.get(item.index)
        bad_input = run.input_errors.get(item.index)
        if failure is None and bad_input is not None:
            rejection = input_rejection(bad_input)
            name = inference_pb2.ErrorCode.Name(rejection.code)
            error_codes[name] = error_codes.get(name, 0) + 1
            input_errors += 1
            answers.append(Answer(item.index, request, rejection=rejection))
            continue
        broken = run.engine_errors.get(item.index)
        if failure is None and broken is not None:
            failure_here: Rejection | None = engine_rejection(broken)
        else:
            failure_here = failure
        if failure_here is not None or outcome is None:
            rejection = failure_here or Rejection(inference_pb2.INTERNAL, "no outcome")
            name = inference_pb2.ErrorCode.Name(rejection.code)
            error_codes[name] = error_codes.get(name, 0) + 1
            latency.record(_since_routed(request, clock))
            answers.append(Answer(item.index, request, rejection=rejection))
            continue
        when = timing(request, clock, run.compute_ms, len(items))
        latency.record(_since_routed(request, clock))
        queue_wait.record(max(when.queue_wait_ms, _MIN_MS))
        answers.append(Answer(item.index, request, result=_result(request, outcome, ctx, when)))
    telemetry = telemetry_pb2.BatchTelemetry(
        model=ctx.model,
        version=ctx.version,
        variant=ctx.variant,
        worker_id=ctx.worker_id,
        batch_size=len(items),
        request_count=len(items),
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
        error_codes=error_codes,
        sequence_bucket=bucket_len,
        task=items[0].task.value if items else "",
    )
    return BatchReport(tuple(answers), telemetry, error_codes)
