"""An outbox for backend tests: answers mapped with the worker's own wire, kept, not sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from graylane.clock import now_ms
from graylane.engine_worker import wire
from graylane.engine_worker.backend import BatchReport, EndedTogether, RanJobs, ResultContext
from graylane.engine_worker.logic.streaming import ChunkPiece
from graylane.engine_worker.requests import Job
from graylane.errors import Rejection
from graylane.v1 import inference_pb2, telemetry_pb2

__all__ = ["CapturedOutbox"]


def _sent() -> Awaitable[object]:
    done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


class CapturedOutbox:
    """The worker's :class:`~graylane.engine_worker.backend.Outbox`, keeping what it would
    send: reports (their jobs answered, their telemetry), chunks by request id, refusals."""

    def __init__(self) -> None:
        self.reports: list[BatchReport] = []
        self.chunks: dict[str, list[inference_pb2.InferenceResult]] = {}
        self.records: list[telemetry_pb2.BatchTelemetry] = []
        """Every telemetry record, in the order sent."""
        self.finished: list[Job] = []
        """Every answered job (results and refusals), in the order answered."""
        self._batch_ids = wire.BatchIds("test-worker")

    @property
    def order(self) -> list[str]:
        return [job.request.request_id for job in self.finished]

    @property
    def answers(self) -> dict[str, Job]:
        return {job.request.request_id: job for job in self.finished}

    def _keep(self, report: BatchReport) -> None:
        self.reports.append(report)
        self.finished.extend(report.answers)
        self.records.append(report.telemetry)

    async def batch(
        self, ran: RanJobs, context: ResultContext
    ) -> tuple[BatchReport, list[Awaitable[object]]]:
        report = wire.batch_report(ran, context, self._batch_ids.of(ran.jobs[0].record))
        self._keep(report)
        return report, [_sent()]

    async def generations(self, together: EndedTogether) -> list[Awaitable[object]]:
        first = together.ended[0].job.record
        self._keep(wire.generations_report(together, self._batch_ids.of(first)))
        return [_sent()]

    async def chunk(
        self,
        job: Job,
        piece: ChunkPiece,
        context: ResultContext,
        logprobs: Sequence[inference_pb2.TokenLogprob] = (),
    ) -> Awaitable[object]:
        chunk = wire.stream_chunk(job, context, piece, logprobs)
        self.chunks.setdefault(job.request.request_id, []).append(chunk)
        return _sent()

    async def refuse(self, job: Job, rejection: Rejection, variant: str) -> Awaitable[object]:
        job.rejection = rejection
        self.finished.append(job)
        return _sent()

    async def sheds(self, context: ResultContext, count: int) -> Awaitable[object]:
        self.records.append(wire.shed_telemetry(context, count, now_ms()))
        return _sent()
