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
one pass, a :class:`~graylane.kafka.replies.Rejection` or a work item), answers a
cycle's jobs (:meth:`WorkerBackend.answer`) and hands every answer to the worker's
:class:`Outbox`. Generations that run on after their cycle (a continuous decode batch,
a streamed engine call) are a :class:`RunningGenerations` each: ``submit`` returns what the
consume loop waits on before it commits the request's offset.

A further backend (Triton over the Open Inference Protocol, say) is one more class of
this shape; nothing else in the worker changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from graylane.engine_worker.requests import Job, Tokenizer, WorkItem
from graylane.engine_worker.wire import BatchReport, DecodeLoad, ResultContext
from graylane.kafka.replies import Rejection
from graylane.kafka.seam import BatchConsumer, Record
from graylane.v1 import inference_pb2, telemetry_pb2

__all__ = ["Outbox", "RunningGenerations", "WorkerBackend"]


class Outbox(Protocol):
    """Where a backend's answers go: the worker's sends, each counted in its metrics."""

    async def deliver(self, report: BatchReport) -> list[Awaitable[object]]:
        """A batch's answers (results, error results, shadow copies) and its telemetry."""
        ...

    async def chunk(self, job: Job, chunk: inference_pb2.InferenceResult) -> Awaitable[object]:
        """One chunk of a streamed generation, to the job's reply topic."""
        ...

    async def refuse(self, job: Job, rejection: Rejection, variant: str) -> Awaitable[object]:
        """An error result for ``job``, stamped with this worker's version and id."""
        ...

    async def telemetry(self, telemetry: telemetry_pb2.BatchTelemetry) -> Awaitable[object]:
        """A telemetry record of its own (sheds of a cycle in which nothing ran)."""
        ...


class RunningGenerations(Protocol):
    """The generations of one variant that outlive their fetched cycle."""

    def submit(self, job: Job) -> Awaitable[object]:
        """Start ``job``; resolves once its answer (and every chunk) is acknowledged."""
        ...

    def cancel(self, request_id: str, reply_topic: str) -> bool:
        """Stop ``request_id`` if it runs here and ``reply_topic`` is the one it named."""
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

    def cancel(self, request_id: str, reply_topic: str) -> bool:
        """Stop a running generation (see :meth:`RunningGenerations.cancel`)."""
        ...

    async def close(self) -> None:
        """Stop every generator and release the engines."""
        ...
