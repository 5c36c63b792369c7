"""The worker's trace spans: a batch's hop through the worker, and each ended
generation's spans (see :mod:`graylane.tracing`), ended on the broker's ack."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from graylane import tracing
from graylane.engine_worker.backend import ResultContext
from graylane.engine_worker.requests import Job
from graylane.errors import ErrorCode
from graylane.v1 import inference_pb2

__all__ = ["generation_hop", "trace_batch", "trace_generations"]

log = logging.getLogger(__name__)


def trace_batch(jobs: Sequence[Job], sends: Sequence[object], hop: tracing.WorkerHop) -> None:
    """The batch's request spans (see :mod:`graylane.tracing`), ended on the broker's ack."""
    requests = [
        tracing.TracedRequest(
            headers=job.record.headers,
            timestamp_ms=job.record.timestamp,
            shadow=job.request.shadow,
            request_id=job.request.request_id,
        )
        for job in jobs
    ]
    tracing.end_when_acknowledged(tracing.record_worker_hop(requests, hop), sends)


def generation_hop(job: Job, context: ResultContext, now_ns: int) -> tracing.GenerationHop:
    """What the span of one ended generation says, from its answer's timing (or, answered
    with an error, from its rejection): see :func:`graylane.tracing.record_generation`."""
    result, rejection = job.result, job.rejection
    if result is None or rejection is not None:
        return tracing.GenerationHop(
            dequeued_ns=0,
            first_token_ns=0,
            finished_ns=now_ns,
            model=context.model,
            version=context.version,
            variant=context.variant,
            prompt_tokens=len(job.work.prompt_tokens),
            generated_tokens=0,
            ttft_ms=0.0,
            finish_reason=inference_pb2.FinishReason.Name(inference_pb2.FAILED),
            error_code=(rejection.code if rejection else ErrorCode.INTERNAL).name,
        )
    when = result.timing
    dequeued_ns = when.dequeued_at_unix_ms * 1_000_000
    first_ns = dequeued_ns + int(when.prefill_ms * 1_000_000) if when.ttft_ms > 0 else 0
    return tracing.GenerationHop(
        dequeued_ns=dequeued_ns,
        first_token_ns=first_ns,
        finished_ns=when.completed_at_unix_ms * 1_000_000 or now_ns,
        model=context.model,
        version=context.version,
        variant=context.variant,
        prompt_tokens=result.usage.prompt_tokens or len(job.work.prompt_tokens),
        generated_tokens=len(result.generated_token_ids),
        ttft_ms=when.ttft_ms,
        finish_reason=inference_pb2.FinishReason.Name(result.finish_reason),
        stream_chunks=job.stream_tail.chunk.sequence if job.stream_tail is not None else 0,
    )


def trace_generations(jobs: Sequence[Job], sends: Sequence[object], context: ResultContext) -> None:
    """Each ended generation's spans (see :mod:`graylane.tracing`), ended on the broker's
    ack. A tracing failure costs the spans, never the answers."""
    try:
        now_ns = time.time_ns()
        spans = [
            span
            for job in jobs
            for span in tracing.record_generation(
                tracing.TracedRequest(
                    headers=job.record.headers,
                    timestamp_ms=job.record.timestamp,
                    shadow=job.request.shadow,
                    request_id=job.request.request_id,
                ),
                generation_hop(job, context, now_ns),
            )
        ]
        tracing.end_when_acknowledged(spans, sends)
    except Exception:
        log.exception("the spans of %d generations were not recorded", len(jobs))
