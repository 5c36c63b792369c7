"""The worker's outbox: what a backend answers, mapped onto the wire and sent.

:class:`WorkerOutbox` is the worker's :class:`~graylane.engine_worker.backend.Outbox`.
A backend hands it plain values (a batch the engine ran, generations that ended
together, a stream's next piece); the outbox maps them with
:mod:`~graylane.engine_worker.wire` (results, chunks, one telemetry record per batch,
batch ids) and sends them: results to their reply topics, shadow copies, stream chunks,
error results and dead letters (through the
:class:`~graylane.kafka.replies.ReplySink`) and telemetry, each counted in the worker's
metrics. The sends it returns are what the consume loop waits on before committing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from graylane import serde, tracing
from graylane.clock import now_ms
from graylane.engine_worker import wire
from graylane.engine_worker.backend import BatchReport, EndedTogether, RanJobs, ResultContext
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.logic.streaming import ChunkPiece
from graylane.engine_worker.observer import WorkerObserver
from graylane.engine_worker.requests import Job
from graylane.engine_worker.spans import trace_generations
from graylane.errors import ErrorCode, Rejection
from graylane.kafka.replies import ReplySink
from graylane.kafka.seam import Producer
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2, telemetry_pb2

__all__ = ["WorkerOutbox"]


class WorkerOutbox:
    """Where a backend's answers go (the worker's :class:`~graylane.engine_worker.backend.Outbox`):
    results to their reply topics, shadow copies, stream chunks, error results and
    telemetry, each counted in the worker's metrics."""

    def __init__(
        self,
        config: WorkerConfig,
        layout: TopicLayout,
        sink: ReplySink,
        producer: Producer,
        observer: WorkerObserver,
    ) -> None:
        self._config = config
        self._layout = layout
        self.sink = sink
        self._producer = producer
        self._observer = observer
        self._batch_ids = wire.BatchIds(config.worker_id)
        self.served = 0

    async def deliver(self, report: BatchReport) -> list[Awaitable[object]]:
        """Send a batch's answers (results, error results, shadow copies), then telemetry."""
        report.telemetry.lag = self._observer.lag
        variant = report.telemetry.variant
        self._observer.record(report, variant)
        self.served += report.served
        sink, producer = self.sink, self._producer
        futures: list[Awaitable[object]] = []
        for job in report.answers:
            request = job.request
            payload = b"" if job.result is None else serde.encode(job.result)
            rejection = job.rejection
            key = request.request_id.encode("utf-8")
            shadow_topic = self._layout.shadow(request.model)
            if job.result is not None and rejection is None:
                too_large = await self._oversized(job, payload, key)
                if too_large is not None:
                    self._observer.count_error(variant, ErrorCode.RESULT_TOO_LARGE)
                    rejection = Rejection(ErrorCode.RESULT_TOO_LARGE, f"result: {too_large}")
            if job.result is None or rejection is not None:
                rejection = rejection or Rejection(ErrorCode.INTERNAL, "no outcome")
                futures.append(await self.refuse(job, rejection, variant))
                continue
            if request.shadow:
                futures.append(await producer.send(shadow_topic, payload, key=key))
                continue
            topic = sink.reply_topic(request)
            if not await sink.topic_exists(topic):
                reason = f"reply topic {topic!r} does not exist"
                futures.append(await sink.dead_letter(job.record, ErrorCode.BAD_REQUEST, reason))
                continue
            answer = payload if job.stream_tail is None else serde.encode(job.stream_tail)
            futures.append(await producer.send(topic, answer, key=key))
            if request.mirror_result:
                futures.append(await producer.send(shadow_topic, payload, key=key))
        futures.append(await self.telemetry(report.telemetry))
        return futures

    async def _oversized(self, job: Job, payload: bytes, key: bytes) -> str | None:
        """Why ``job``'s result cannot go to its topics (each one's limit), or None."""
        request = job.request
        shadow_topic = self._layout.shadow(request.model)
        topics = [shadow_topic] if request.shadow else [self.sink.reply_topic(request)]
        if request.mirror_result and not request.shadow:
            topics.append(shadow_topic)
        for topic in topics:
            too_large = await self.sink.oversized(topic, payload, key)
            if too_large is not None:
                return too_large
        return None

    async def batch(
        self, ran: RanJobs, context: ResultContext
    ) -> tuple[BatchReport, list[Awaitable[object]]]:
        report = wire.batch_report(ran, context, self._batch_ids.of(ran.jobs[0].record))
        return report, await self.deliver(report)

    async def generations(self, together: EndedTogether) -> list[Awaitable[object]]:
        first = together.ended[0].job.record
        report = wire.generations_report(together, self._batch_ids.of(first))
        sends = await self.deliver(report)
        if tracing.enabled():
            trace_generations(report.answers, sends, together.context)
        return sends

    async def chunk(
        self,
        job: Job,
        piece: ChunkPiece,
        context: ResultContext,
        logprobs: Sequence[inference_pb2.TokenLogprob] = (),
    ) -> Awaitable[object]:
        chunk = wire.stream_chunk(job, context, piece, logprobs)
        topic = self.sink.reply_topic(job.request)
        key = job.request.request_id.encode("utf-8")
        return await self._producer.send(topic, serde.encode(chunk), key=key)

    async def refuse(self, job: Job, rejection: Rejection, variant: str) -> Awaitable[object]:
        return await self.sink.error_result(
            job.request,
            rejection,
            job.record,
            version=self._config.version,
            variant=variant,
            worker_id=self._config.worker_id,
        )

    async def sheds(self, context: ResultContext, count: int) -> Awaitable[object]:
        return await self.telemetry(wire.shed_telemetry(context, count, now_ms()))

    async def telemetry(self, telemetry: telemetry_pb2.BatchTelemetry) -> Awaitable[object]:
        # Keyed by model, like the commands and outcomes: a policy engine sharded by model
        # finds all of a model's records on one partition index.
        key = self._config.model.encode("utf-8")
        return await self._producer.send(self._layout.telemetry(), serde.encode(telemetry), key=key)
