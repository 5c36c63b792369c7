"""The native backend: ONNX Runtime or TensorRT engines run in the worker's process.

One fetched cycle (:class:`CycleFetch`) is checked record by record against the active
variant's IO signature (:func:`~graylane.engine_worker.requests.validate`); its
``GENERATE`` jobs on a model with a KV cache join the variant's running decode batch
(:class:`~graylane.engine_worker.generation.ContinuousDecoder`); the rest are planned
into shape-bucketed batches (:mod:`~graylane.engine_worker.logic.batching`), admitted against
their deadlines (:mod:`~graylane.engine_worker.logic.admission`) and run on the engine
thread (:class:`~graylane.engine_worker.compute.WorkerEngines`, so aiokafka's
heartbeats keep running on the event loop), one batch ahead: the next batch runs while
this one's results are built and sent. The batch size and wait are learned from
measured engine time (:mod:`~graylane.engine_worker.logic.batch_learner`). Fault injection is
an engine wrapper (:mod:`~graylane.engine_worker.faults`), not a step of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from graylane import tracing
from graylane.clock import now_ms
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.backend import BatchClock, Outbox, RanJobs, ResultContext
from graylane.engine_worker.compute import (
    RanBatch,
    Reloader,
    WorkerEngines,
    profile_buckets,
    warm_up,
)
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.generation import ContinuousDecoder, DecoderLimits
from graylane.engine_worker.layouts import kv_cache_layout
from graylane.engine_worker.logic.admission import (
    ADMISSION_PROBE_MS,
    AdmissionPlan,
    Candidate,
    admit_by_priority,
    effective_deadline,
    request_priority,
)
from graylane.engine_worker.logic.batch_learner import BatchChoice, BatchLearner, LearnerConfig
from graylane.engine_worker.logic.batching import BucketPolicy, PlannedBatch, split_first
from graylane.engine_worker.observer import WorkerObserver
from graylane.engine_worker.requests import (
    IntakeRules,
    Job,
    Limits,
    TaskKind,
    Tokenizer,
    WorkItem,
    detect_tokenizer,
    validate,
)
from graylane.engine_worker.spans import trace_batch
from graylane.engine_worker.standby import run_at_low_priority
from graylane.engine_worker.state import CancelKey
from graylane.errors import ErrorCode, Rejection
from graylane.kafka.seam import BatchConsumer, Record
from graylane.supervision import BackgroundTasks
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2

__all__ = ["FETCH_WAIT_MS", "CycleFetch", "NativeBackend"]

log = logging.getLogger(__name__)


FETCH_WAIT_MS = 50
"""How long the broker may hold a fetch of partitions it has nothing new on. It delays
no record (a fetch is answered as soon as one arrives; the batch's own wait is the
fetch loop's), but every expired one is a request: at 5 ms a worker whose prefetched
partitions are at their end sent ~100 empty fetches a second while it drained them
(8x the fetch requests, and about 20 % fewer requests served than at 50 ms, measured by
``graylane bench path``'s worker-alone drain)."""


class CycleFetch:
    """Fetches the records of one cycle under the learner's batching choice."""

    def __init__(
        self,
        config: WorkerConfig,
        learner: BatchLearner,
        *,
        fill: bool = True,
        lag: Callable[[], int] = lambda: 0,
    ) -> None:
        """``fill=False``: hand over what the first fetch brought at once (a continuous
        decode batch takes requests one by one; waiting to fill a batch only delays them).
        ``lag``: records known to be waiting on the topic (the last lag check)."""
        self.config = config
        self.learner = learner
        self.fill = fill
        self._lag = lag
        self.choice = BatchChoice(config.max_batch_size, float(config.max_wait_ms))
        """The choice of the cycle fetched last (the planner uses it too)."""
        self._steady = self.choice
        """The last choice that was not exploring (logged when it changes)."""
        self.queued = 0
        """Rows waiting when the cycle's first fetch came in (a queue, when at least a
        batch): what it brought, or the topic's lag if more."""

    async def collect(self, consumer: BatchConsumer) -> list[Record]:
        """Fetch up to max_batch_size*fetch_factor records, waiting after the first one
        for a batch to fill: the learned wait and batch size, else max_wait_ms.

        The learner chooses once the first fetch is in, knowing how many rows are
        already waiting (what that fetch brought, or the topic's lag if more: a fetch
        can return one partition's few records while thousands wait): a queue is
        served in batches as large as pay, with no wait."""
        cap = self.config.max_batch_size * self.config.fetch_factor
        first = await consumer.getmany(timeout_ms=200, max_records=cap)
        records = [r for rs in first.values() for r in rs]
        self.queued = max(len(records), self._lag()) if records else 0
        if self.config.adaptive_batching:
            choice = self.learner.choose(backlog=self.queued)
            if not choice.exploring and choice != self._steady:
                log.info("batching: up to %d rows, wait %.1f ms", choice.max_batch, choice.wait_ms)
                self._steady = choice
            self.choice = choice
        if not records or not self.fill:
            return records
        deadline = time.monotonic() + self.choice.wait_ms / 1000.0
        while len(records) < self.choice.max_batch:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            more = await consumer.getmany(timeout_ms=left_ms, max_records=cap - len(records))
            records.extend(r for rs in more.values() for r in rs)
        return records


@dataclass(frozen=True)
class _Running:
    """A batch handed to the engine thread."""

    task: asyncio.Future[RanBatch]
    submitted_ms: int


class NativeBackend:
    """A worker's backend over engines loaded in its process (see the module's docstring)."""

    def __init__(
        self,
        config: WorkerConfig,
        engines: Mapping[str, InferenceEngine],
        observer: WorkerObserver,
        background: BackgroundTasks,
        *,
        active: Callable[[], str],
        layout: TopicLayout,
        max_request_bytes: int,
        reload: Reloader | None = None,
    ) -> None:
        """``reload`` loads ``engines`` again (same variants and artifacts) for a broken engine."""
        if not engines:
            raise ValueError("a native backend needs at least one engine")
        self.config = config
        self._observer = observer
        self._layout = layout
        self._max_request_bytes = max_request_bytes
        self._tokenizer = config.tokenizer or detect_tokenizer(engines.values())
        buckets = profile_buckets(config.profiles, config.model_info, config.max_seq_len)
        self.policy = BucketPolicy(
            buckets=buckets or config.buckets, max_batch_size=config.max_batch_size
        )
        """Buckets from the artifact's build profiles when it has them, else the config's."""
        self.limits = Limits(
            max_seq_len=min(config.max_seq_len, self.policy.max_seq_len),
            max_new_tokens=config.max_new_tokens,
        )
        self.learner = BatchLearner(
            LearnerConfig(
                max_batch_size=config.max_batch_size,
                max_wait_ms=config.max_wait_ms,
                latency_budget_ms=config.latency_budget_ms,
            ),
            reference_len=self.policy.bucket_for(min(64, self.policy.max_seq_len)),
        )
        self._pending_shed = 0
        """Sheds not yet reported in a batch telemetry."""
        self.last_run_ms = 0
        """When the last admitted batch started (unix ms): admission probes after a pause."""
        continuous = config.continuous_batching and any(
            kv_cache_layout(e.io) is not None for e in engines.values()
        )
        self._fetch = CycleFetch(
            config, self.learner, fill=not continuous, lag=lambda: observer.lag
        )
        self._cycle_done = 0.0
        """perf_counter when the last cycle's answers were all sent (0: none yet)."""
        self._cycle_batches: list[tuple[int, float]] = []
        """This cycle's forward batches so far: (rows, ms spent on each)."""
        self.decoders: dict[str, tuple[InferenceEngine, ContinuousDecoder]] = {}
        self._background = background
        self._engines = WorkerEngines(
            engines,
            config.faults,
            policy=self.policy,
            max_seq_len=self.limits.max_seq_len,
            failure_limit=config.engine_failure_limit,
            reload=reload,
            give_up=background.abort,
            active=active,
            decode=self._tokenizer.decode if self._tokenizer is not None else None,
        )
        self._rules: dict[str, tuple[InferenceEngine, IntakeRules]] = {}

    @property
    def engines(self) -> Mapping[str, InferenceEngine]:
        """The loaded variants, as they run (with injected faults, if any)."""
        return self._engines.engines

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self._engines.engines)

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    @property
    def max_in_flight(self) -> int:
        return self.config.max_in_flight

    # -- intake -------------------------------------------------------------------------
    def _rules_for(self, variant: str) -> IntakeRules:
        engine = self.engines[variant]
        known = self._rules.get(variant)
        if known is not None and known[0] is engine:
            return known[1]
        rules = IntakeRules(
            model=self.config.model,
            max_request_bytes=self._max_request_bytes,
            io=engine.io,
            limits=self.limits,
            tokenizer=self._tokenizer,
            model_info=self.config.model_info,
            layout=self._layout,
        )
        self._rules[variant] = (engine, rules)
        return rules

    def check(
        self,
        request: inference_pb2.InferenceRequest,
        size_bytes: int,
        index: int,
        variant: str,
        now_ms: int,
    ) -> WorkItem | Rejection:
        return validate(request, size_bytes, index, self._rules_for(variant), now_ms)

    # -- warm-up and lifecycle -------------------------------------------------------------
    def warm_up_now(self) -> int:
        """Run every loaded variant (without injected faults) once per warm-up shape."""
        cfg = self.config
        return warm_up(
            self._engines.plain.values(),
            self.policy,
            self.limits.max_seq_len,
            cfg.profiles,
            cfg.model_info,
            cfg.warm_up,
        )

    async def warm_up(self, *, low_priority: bool) -> int:
        if low_priority:
            return await run_at_low_priority(self.warm_up_now)
        return await self._engines.in_thread(self.warm_up_now)

    async def start(self) -> None:
        return None

    async def fetch(self, consumer: BatchConsumer) -> list[Record]:
        return await self._fetch.collect(consumer)

    def cancel(self, key: CancelKey) -> bool:
        return any(decoder.cancel(key) for _, decoder in self.decoders.values())

    async def close(self) -> None:
        for _, decoder in self.decoders.values():
            await decoder.close()
        self._engines.close()

    # -- one cycle -----------------------------------------------------------------------
    async def answer(
        self, jobs: Sequence[Job], context: ResultContext, outbox: Outbox
    ) -> list[Awaitable[object]]:
        """Answer a cycle's jobs; the sends to wait on before committing. Its cost outside
        the batches teaches the learner what a cycle costs."""
        began = time.perf_counter()
        self._cycle_batches = []
        futures = await self._answer_cycle(jobs, context, outbox)
        done = time.perf_counter()
        previous, self._cycle_done = self._cycle_done, done
        ran = self._cycle_batches
        self._cycle_batches = []
        if ran and previous and self._fetch.queued >= self._fetch.choice.max_batch:
            # a queue was waiting: the time since the last cycle ended (its commit, this
            # fetch, decode and planning) outside the batches is the cycle's own cost
            outside_ms = (done - max(previous, began - 1.0)) * 1000.0 - sum(ms for _, ms in ran)
            self.learner.observe_cycle(len(ran), sum(n for n, _ in ran), max(0.0, outside_ms))
        return futures

    async def _answer_cycle(
        self, jobs: Sequence[Job], context: ResultContext, outbox: Outbox
    ) -> list[Awaitable[object]]:
        dequeued = now_ms()
        variant = context.variant
        engine = self.engines[variant]
        futures: list[Awaitable[object]] = []
        batched: list[Job] = []
        decoder = self._decoder(context, engine, outbox)
        for job in jobs:
            if decoder is not None and job.task is TaskKind.GENERATE:
                futures.append(decoder.submit(job))
            else:
                batched.append(job)
        choice = self._fetch.choice
        planned_batches = self.policy.plan_batches(batched, choice.steady_batch)
        if choice.then:  # exploring: one batch of the explored size first
            planned_batches = split_first(planned_batches, choice.max_batch)
        admission = admit_cycle(
            planned_batches,
            self.learner.estimate_ms,
            default_deadline_ms=self.config.default_deadline_ms,
            now_unix_ms=now_ms(),
            last_run_unix_ms=self.last_run_ms,
        )
        self._pending_shed += len(admission.shed)
        cfg = self.config
        for shed in admission.shed:
            reason = "priority" if shed.displaced else "deadline"
            self._observer.metrics.shed.labels(cfg.model, cfg.version, variant, reason).inc()
            rejection = Rejection(ErrorCode.SHED, shed.reason)
            futures.append(await outbox.refuse(shed.item, rejection, variant))
        if admission.shed and not any(admission.admitted):
            # nothing runs this cycle: report the sheds now, the policy engine steps on them
            shed_count, self._pending_shed = self._pending_shed, 0
            futures.append(await outbox.sheds(context, shed_count))
        batches = [
            PlannedBatch(planned.bucket_len, kept)
            for planned, kept in zip(planned_batches, admission.admitted, strict=True)
            if kept
        ]
        # One batch ahead: the next batch runs on the engine thread while this one's
        # results are built and sent on the loop, so the engine does not wait for them.
        ahead = self._start(batches[0], context, engine) if batches else None
        try:
            for i, batch in enumerate(batches):
                if ahead is None:
                    break
                running, ahead = ahead, None
                ran = await running.task
                if i + 1 < len(batches):
                    ahead = self._start(batches[i + 1], context, engine)
                returned = time.perf_counter()
                report, sends = await outbox.batch(
                    self._ran_jobs(batch, running, ran, dequeued), context
                )
                futures.extend(sends)
                if tracing.enabled():
                    ran_ns = report.telemetry.completed_at_unix_ms * 1_000_000
                    hop = tracing.WorkerHop(
                        dequeued_ns=dequeued * 1_000_000,
                        started_ns=report.telemetry.started_at_unix_ms * 1_000_000,
                        ran_ns=ran_ns,
                        sent_ns=time.time_ns(),
                        model=context.model,
                        version=context.version,
                        variant=context.variant,
                        batch_size=len(batch.items),
                    )
                    trace_batch(batch.items, sends, hop)
                if report.telemetry.error_count == 0 and forward_only(batch.items):
                    # engine time plus the worker's own per-batch cost (results, sends)
                    spent_ms = ran.run.compute_ms + (time.perf_counter() - returned) * 1000.0
                    self.learner.observe(len(batch.items), spent_ms, batch.bucket_len)
                    self._cycle_batches.append((len(batch.items), spent_ms))
        finally:
            if ahead is not None:  # the cycle failed: it is handled again, record by record
                ahead.task.cancel()
        return futures

    def _start(
        self, batch: PlannedBatch[Job], context: ResultContext, engine: InferenceEngine
    ) -> _Running:
        """Hand one planned batch to the engine thread (queued behind the one running).

        An input error re-runs the batch item by item (only the bad item fails);
        an unknown exception answers ``INTERNAL`` and the loop goes on.
        """
        self.last_run_ms = now_ms()
        items = [job.work for job in batch.items]
        task = asyncio.ensure_future(self._engines.run(context.variant, items, engine))
        return _Running(task, self.last_run_ms)

    def _ran_jobs(
        self, batch: PlannedBatch[Job], running: _Running, ran: RanBatch, dequeued: int
    ) -> RanJobs:
        """A batch the engine ran, with the cycle's sheds not reported yet."""
        done = now_ms()
        # a batch queued behind another started when that one was done
        started = min(done, max(running.submitted_ms, done - round(ran.run.compute_ms)))
        shed_count, self._pending_shed = self._pending_shed, 0
        return RanJobs(
            jobs=tuple(batch.items),
            ran=ran,
            clock=BatchClock(dequeued_ms=dequeued, started_ms=started, done_ms=done),
            bucket_len=batch.bucket_len,
            shed_count=shed_count,
        )

    # -- continuous decoding -----------------------------------------------------------
    def _decoder(
        self, context: ResultContext, engine: InferenceEngine, outbox: Outbox
    ) -> ContinuousDecoder | None:
        """The running decode batch of the active variant (None: generation runs per batch)."""
        cfg = self.config
        if not cfg.continuous_batching or kv_cache_layout(engine.io) is None:
            return None
        known = self.decoders.get(context.variant)
        if known is not None and known[0] is engine:
            return known[1]
        sequences = cfg.max_sequences or cfg.max_batch_size
        decoder = ContinuousDecoder(
            self._engines,
            context,
            engine,
            DecoderLimits(
                max_sequences=sequences,
                max_seq_len=self.limits.max_seq_len,
                max_prefill_tokens=cfg.max_prefill_tokens or None,
                max_kv_tokens=cfg.max_kv_tokens or None,
            ),
            stream=cfg.stream,
            outbox=outbox,
        )
        if known is not None:  # the engine was reloaded: the old batch finishes first
            self._background.spawn(known[1].drain_and_close(), name="decoder-retire")
        self.decoders[context.variant] = (engine, decoder)
        return decoder


def forward_only(jobs: Sequence[Job]) -> bool:
    """Whether every job is a plain forward pass (what the learner's estimates cover)."""
    return all(job.task is TaskKind.FORWARD for job in jobs)


def admit_cycle(
    planned: Sequence[PlannedBatch[Job]],
    estimate_ms: Callable[[int, int], float | None],
    *,
    default_deadline_ms: float,
    now_unix_ms: int,
    last_run_unix_ms: int,
) -> AdmissionPlan[Job]:
    """Shed what cannot meet its deadline behind the batches planned ahead of it.

    ``estimate_ms(rows, bucket_len)`` prices forward-only batches (others are
    unknown); the first batch is a probe after ``ADMISSION_PROBE_MS`` without a run.
    """

    def deadline(job: Job) -> int:
        request = job.request
        return effective_deadline(
            request.deadline_unix_ms, request.created_at_unix_ms, default_deadline_ms
        )

    def service_ms(position: int, rows: int) -> float | None:
        batch = planned[position]
        if not forward_only(batch.items):
            return None
        return estimate_ms(rows, batch.bucket_len)

    candidates = [
        [Candidate(job, deadline(job), request_priority(job.request.tags)) for job in b.items]
        for b in planned
    ]
    probe = now_unix_ms - last_run_unix_ms > ADMISSION_PROBE_MS
    return admit_by_priority(candidates, now_unix_ms, service_ms, probe=probe)
