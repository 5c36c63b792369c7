"""The seam between a worker and what runs its requests: a backend, and the outbox it
answers through.

A worker (:mod:`~graylane.engine_worker.service`) owns what every version's worker
does the same way: the consume loop, decoding and refusing records, precision and
cancel commands, delivery, metrics and readiness. What runs the requests is a
:class:`WorkerBackend`:

- :class:`~graylane.engine_worker.native.NativeBackend`: ONNX Runtime or TensorRT
  engines in the worker's process (shape buckets, dynamic batches, admission, the
  continuous decoder over a KV cache);
- :class:`~graylane.engine_worker.engine_server.EngineServerBackend`: an
  OpenAI-compatible engine server (llama.cpp, vLLM, TensorRT-LLM, SGLang) called over
  HTTP, many calls in flight, the engine batching them itself.

A backend checks a decoded request against what it can run (:meth:`WorkerBackend.check`,
one pass, a :class:`~graylane.errors.Rejection` or a work item), answers a
cycle's jobs (:meth:`WorkerBackend.answer`) and hands every answer to the worker's
:class:`Outbox` as plain values: a batch the engine ran (:class:`RanJobs`), generations
that ended together (:class:`EndedTogether`: each :class:`Ended` with a
:class:`Decoded` result, an :class:`~graylane.engine_worker.openai_calls.EngineAnswer` or
a refusal), a stream's next :class:`~graylane.engine_worker.logic.streaming.ChunkPiece`.
The outbox maps them onto the wire (:mod:`~graylane.engine_worker.wire`) and sends them;
no backend builds a protobuf answer itself. Generations that run on after their cycle
(a continuous decode batch, a streamed engine call) are a :class:`RunningGenerations`
each: ``submit`` returns what the consume loop waits on before it commits the
request's offset (:func:`settle_when_sent`).

A further backend (Triton over the Open Inference Protocol, say) is one more class of
this shape; nothing else in the worker changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from graylane.engine_worker.compute import RanBatch
from graylane.engine_worker.kv_decode import GenerationResult
from graylane.engine_worker.logic.streaming import ChunkPiece
from graylane.engine_worker.openai_calls import EngineAnswer
from graylane.engine_worker.requests import Job, Tokenizer, WorkItem
from graylane.engine_worker.state import CancelKey
from graylane.errors import ErrorCode, Rejection
from graylane.kafka.seam import BatchConsumer, Record
from graylane.v1 import inference_pb2, telemetry_pb2

__all__ = [
    "BatchClock",
    "BatchReport",
    "DecodeLoad",
    "Decoded",
    "Ended",
    "EndedTogether",
    "Outbox",
    "RanJobs",
    "ResultContext",
    "RunningGenerations",
    "TokenTimes",
    "WorkerBackend",
    "settle_when_sent",
]


@dataclass(frozen=True, kw_only=True)
class ResultContext:
    """Who answers: the worker's identity and the variant that ran."""

    model: str
    version: str
    variant: str
    worker_id: str
    tokenizer: Tokenizer | None = None


@dataclass(frozen=True, kw_only=True)
class DecodeLoad:
    """The decode loop when a batch of generations ended: load signals for QoS and scale."""

    kv_cache_occupancy: float = 0.0
    """Cache positions the running rows reserve over the loop's budget, 0..1."""
    waiting: int = 0
    """Sequences not yet given a decode row."""
    running: int = 0


@dataclass(frozen=True, kw_only=True)
class BatchClock:
    """Wall-clock milliseconds of one batch's life."""

    dequeued_ms: int
    started_ms: int
    done_ms: int


@dataclass(frozen=True)
class BatchReport:
    """A batch's answers and its one telemetry record, as the outbox sends them."""

    answers: tuple[Job, ...]
    """The batch's jobs, each with its result or its rejection."""
    telemetry: telemetry_pb2.BatchTelemetry
    error_codes: dict[ErrorCode, int] = field(default_factory=dict)
    """Answers per error code (input errors included)."""

    @property
    def served(self) -> int:
        return sum(1 for job in self.answers if job.result is not None)


@dataclass(frozen=True, kw_only=True)
class RanJobs:
    """A planned batch the engine ran (or failed), to be answered job by job."""

    jobs: tuple[Job, ...]
    ran: RanBatch
    clock: BatchClock
    bucket_len: int
    shed_count: int = 0
    """Sheds of this cycle not reported yet (they ride on this batch's telemetry)."""


@dataclass(frozen=True, kw_only=True)
class TokenTimes:
    """When one generation's tokens came (unix ms; 0: none yet)."""

    submitted_ms: int
    started_ms: int
    """When it got its decode row (0: never did)."""
    first_token_ms: int
    last_token_ms: int
    inter_token_p99_ms: float


@dataclass(frozen=True)
class Decoded:
    """A generation the continuous decoder finished, and its token times."""

    result: GenerationResult
    times: TokenTimes


@dataclass(frozen=True)
class Ended:
    """One generation that ended: its job, how, and the rest of its stream (if streamed)."""

    job: Job
    outcome: Decoded | EngineAnswer | Rejection
    tail: ChunkPiece | None = None
    """The final chunk of a streamed generation (what was not published yet)."""
    tail_logprobs: tuple[inference_pb2.TokenLogprob, ...] = ()


@dataclass(frozen=True, kw_only=True)
class EndedTogether:
    """Generations that ended in the same step (or flush): one telemetry record."""

    ended: tuple[Ended, ...]
    context: ResultContext
    started_ms: int
    """When the first of them started."""
    device_load: float
    load: DecodeLoad | None = None
    """The decode loop (or engine) as they ended: its load signals."""


def settle_when_sent(done: asyncio.Future[None] | None, sends: Sequence[Awaitable[object]]) -> None:
    """Resolve ``done`` once every one of ``sends`` is acknowledged (or fail it with the
    first failure): what the consume loop waits on before it commits a request."""
    waits = asyncio.gather(*sends)

    def finish(fut: asyncio.Future[list[object]]) -> None:
        if done is None or done.done():
            return
        if fut.cancelled():
            done.cancel()
        elif fut.exception() is not None:
            done.set_exception(fut.exception())  # type: ignore[arg-type]
        else:
            done.set_result(None)

    waits.add_done_callback(finish)


class Outbox(Protocol):
    """Where a backend's answers go: mapped onto the wire, sent, counted in the metrics."""

    async def batch(
        self, ran: RanJobs, context: ResultContext
    ) -> tuple[BatchReport, list[Awaitable[object]]]:
        """Answer a batch the engine ran (results, error results, shadow copies) and send
        them with its telemetry; the report sent, and the sends."""
        ...

    async def generations(self, together: EndedTogether) -> list[Awaitable[object]]:
        """Answer generations that ended together and send them with one telemetry record."""
        ...

    async def chunk(
        self,
        job: Job,
        piece: ChunkPiece,
        context: ResultContext,
        logprobs: Sequence[inference_pb2.TokenLogprob] = (),
    ) -> Awaitable[object]:
        """One chunk of a streamed generation, to the job's reply topic."""
        ...

    async def refuse(self, job: Job, rejection: Rejection, variant: str) -> Awaitable[object]:
        """An error result for ``job``, stamped with this worker's version and id."""
        ...

    async def sheds(self, context: ResultContext, count: int) -> Awaitable[object]:
        """A telemetry record of sheds alone (a cycle in which nothing ran)."""
        ...


class RunningGenerations(Protocol):
    """The generations of one variant that outlive their fetched cycle."""

    def submit(self, job: Job) -> Awaitable[object]:
        """Start ``job``; resolves once its answer (and every chunk) is acknowledged."""
        ...

    def cancel(self, key: CancelKey) -> bool:
        """Stop the generation ``key`` names if it runs here (its request id, reply topic
        and cancel token all the request's)."""
        ...

    def load(self) -> DecodeLoad:
        """Waiting and running sequences and KV-cache occupancy now."""
        ...

    async def drain_and_close(self) -> None:
        """Let what runs finish (new work goes elsewhere), then stop."""
        ...

    async def close(self) -> None: ...


class WorkerBackend(Protocol):
    """What runs a worker's requests (see the module's docstring)."""

    @property
    def variants(self) -> tuple[str, ...]:
        """The variants it can run, the names precision commands use."""
        ...

    @property
    def tokenizer(self) -> Tokenizer | None:
        """Text of a result's tokens (None: the results carry token ids, or text already)."""
        ...

    @property
    def max_in_flight(self) -> int:
        """Fetched cycles whose answers may be unacknowledged at once."""
        ...

    def check(
        self,
        request: inference_pb2.InferenceRequest,
        size_bytes: int,
        index: int,
        variant: str,
        now_ms: int,
    ) -> WorkItem | Rejection:
        """One pass over a decoded request: the work to run on ``variant``, or why not."""
        ...

    async def warm_up(self, *, low_priority: bool) -> int:
        """Make every variant ready to serve at once; how many shapes it ran."""
        ...

    async def start(self) -> None:
        """Begin what runs beside the loop (an engine's probes); called once, before serving."""
        ...

    async def fetch(self, consumer: BatchConsumer) -> list[Record]:
        """The records of one cycle (none while the backend cannot take more)."""
        ...

    async def answer(
        self, jobs: Sequence[Job], context: ResultContext, outbox: Outbox
    ) -> list[Awaitable[object]]:
        """Run a cycle's checked jobs on ``context.variant``; the sends to wait on."""
        ...

    def cancel(self, key: CancelKey) -> bool:
        """Stop a running generation (see :meth:`RunningGenerations.cancel`)."""
        ...

    async def close(self) -> None:
        """Stop every generator and release the engines."""
        ...
