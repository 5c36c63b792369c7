"""The engine worker: a consumer group per (model, version) running engine variants.

The worker runs the library's consume loop (:class:`~graylane.kafka.loop.ConsumeLoop`:
its consumer, the guard, the backoff and the commit after delivery) with its own
:meth:`Worker.hooks`. One fetched cycle goes fetch (:class:`CycleFetch`) → decode and
validate each record into a :class:`~graylane.engine_worker.requests.Job` → plan
batches (:mod:`~graylane.engine_worker.batching`) → admit them against their deadlines
(:mod:`~graylane.engine_worker.admission`) → run each batch on the engine thread
(:class:`~graylane.engine_worker.compute.WorkerEngines`, so aiokafka's heartbeats keep
running on the event loop) → answer its jobs and build its telemetry
(:mod:`~graylane.engine_worker.wire`) → send. Offsets are committed only after every
result and the batch telemetry are acknowledged (at-least-once; duplicates carry the
same request_id). Fault injection is an engine wrapper
(:mod:`~graylane.engine_worker.faults`), not a step of its own.

Here: the worker's config, its :class:`Worker` (the cycle, the sends, precision
commands, readiness and its lifecycle), its metrics
(:class:`WorkerObserver`) and warm standby: a worker that loaded and warmed its
engines but waits out of its group. A supervisor keeps one such process per scaled
version (``--warm-standby``), so a scale-out is a signal (``SIGUSR1``: join the
consumer group and serve), not a process start, an ONNX Runtime load and a warm-up
competing for the CPU with the overloaded workers at the worst moment. Until then it
holds no partitions, reads nothing and is not ready (``/readyz``). Its warm-up runs
at the lowest CPU priority (a thread of its own, niced, that ends with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from aiokafka.structs import ConsumerRecord

from graylane import serde, tracing
from graylane.artifacts.build_info import ShapeProfile
from graylane.artifacts.model_info import ModelInfo
from graylane.artifacts.signing import RefusedArtifact
from graylane.clock import now_ms
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.admission import admit_cycle, forward_only
from graylane.engine_worker.batch_learner import BatchChoice, BatchLearner, LearnerConfig
from graylane.engine_worker.batching import (
    DEFAULT_BUCKETS,
    BucketPolicy,
    PlannedBatch,
    split_first,
)
from graylane.engine_worker.compute import (
    RanBatch,
    Reloader,
    WorkerEngines,
    profile_buckets,
    warm_up,
)
from graylane.engine_worker.faults import FaultInjection
from graylane.engine_worker.generation import (
    CancelBook,
    ContinuousDecoder,
    DecoderLimits,
    Finished,
    StreamPolicy,
)
from graylane.engine_worker.requests import (
    IntakeRules,
    Job,
    Limits,
    TaskKind,
    Tokenizer,
    decode,
    detect_tokenizer,
    distrust_shadow,
    validate,
)
from graylane.engine_worker.tasks import GenerationResult, kv_cache_layout
from graylane.engine_worker.wire import (
    BatchClock,
    BatchIds,
    BatchReport,
    ResultContext,
    build_batch,
    generation_report,
    generation_result,
    shed_telemetry,
)
from graylane.errors import ErrorCode, SerdeError
from graylane.kafka.admin import MessageLimits
from graylane.kafka.loop import ConsumeLoop, LoopHooks
from graylane.kafka.reading import CompactedFollower, FollowFrom, consumer_lag, follow
from graylane.kafka.replies import Rejection, ReplySink
from graylane.kafka.seam import BatchConsumer, ConsumerOptions, KafkaFactory, Producer, Record
from graylane.metrics import (
    CONTROL_CAUGHT_UP,
    NvmlCollector,
    ServiceObservability,
    WorkerMetrics,
    load_nvml,
)
from graylane.settings import Settings
from graylane.supervision import BackgroundTasks
from graylane.topics import TopicLayout
from graylane.v1 import control_pb2, inference_pb2, telemetry_pb2

__all__ = [
    "ACTIVATE",
    "FETCH_WAIT_MS",
    "CycleFetch",
    "Records",
    "Worker",
    "WorkerConfig",
    "WorkerObserver",
    "consumer_options",
    "default_worker_id",
    "generation_hop",
    "run_at_low_priority",
    "wait_for_activation",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

Records = Sequence[Record]


def _where(record: Record) -> tuple[str, int, int]:
    return record.topic, record.partition, record.offset


# --- configuration ----------------------------------------------------------------------


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    model: str
    version: str
    initial_variant: str
    max_batch_size: int = 8
    max_wait_ms: int = 5
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    max_seq_len: int = 256
    max_new_tokens: int = 256
    worker_id: str = field(default_factory=default_worker_id)
    metrics_port: int | None = None
    """Overrides ``GRAYLANE_METRICS_PORT`` (0 = a free port, below 0 = off)."""
    faults: FaultInjection = field(default_factory=FaultInjection)
    group_id: str = ""
    fetch_factor: int = 4
    """Records fetched per cycle = max_batch_size * fetch_factor (then planned into batches)."""
    adaptive_batching: bool = True
    """Learn the batch cap and wait from measured engine time (see batch_learner)."""
    latency_budget_ms: float = 0.0
    """Engine time one batch may take; 0 = no budget (learner and admission)."""
    default_deadline_ms: float = 0.0
    """Deadline of a request that names none, from its creation; 0 = no admission control."""
    engine_failure_limit: int = 5
    """Consecutive failed batches before the engine is reloaded, and after that before the
    worker exits non-zero (:class:`~graylane.engine_worker.compute.EngineHealth`); 0 = never."""
    tokenizer: Tokenizer | None = None
    """Text for prompts and results; ``None``: the one the model's metadata names, if any."""
    model_info: ModelInfo | None = None
    """Declared task and input vocabulary (from the manifest or the ONNX metadata)."""
    profiles: tuple[ShapeProfile, ...] = ()
    """The artifact's build profiles: warm-up shapes (and buckets: ``profile_buckets``)."""
    standby: bool = False
    """Warm up, then wait out of the group until activated (:func:`wait_for_activation`)."""
    continuous_batching: bool = True
    """GENERATE on a model with a KV cache runs in one continuous decode batch per variant
    (:mod:`~graylane.engine_worker.generation`), not per fetched cycle."""
    max_sequences: int = 0
    """Sequences decoding together (0 = max_batch_size)."""
    max_prefill_tokens: int = 0
    """Prompt tokens prefilled in one decode step (0 = no cap; one prompt always joins)."""
    max_kv_tokens: int = 0
    """Cache positions the running sequences may reserve together (0 = no cap)."""
    stream: StreamPolicy = field(default_factory=StreamPolicy)
    """When a streamed generation publishes a chunk (a request may name its own)."""
    max_in_flight: int = 8
    """Fetched cycles whose answers may be unacknowledged at once (offsets are committed
    in order as they are): what lets a request join a running decode batch."""
    refused_artifacts: tuple[RefusedArtifact, ...] = ()
    """Artifacts not loaded because their signature did not verify (counted as
    ``graylane_artifact_verification_failures_total{reason}``)."""


# --- warm standby -----------------------------------------------------------------------

ACTIVATE = signal.SIGUSR1
"""The signal that makes a standby worker join its group."""


async def wait_for_activation(stop: asyncio.Event, what: str) -> bool:
    """Wait for :data:`ACTIVATE` (True) or ``stop`` (False); ``what`` names the worker."""
    loop = asyncio.get_running_loop()
    activated = asyncio.Event()
    loop.add_signal_handler(ACTIVATE, activated.set)
    log.info("%s on warm standby: engines warmed, joins its group on SIGUSR1", what)
    waits = [asyncio.ensure_future(activated.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        loop.remove_signal_handler(ACTIVATE)
    if stop.is_set():
        return False
    log.info("%s activated: joining its group", what)
    return True


async def run_at_low_priority(fn: Callable[[], T]) -> T:
    """``fn()`` in a thread of its own at nice 19 (where the OS allows), awaited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting task
            loop.call_soon_threadsafe(done.set_exception, exc)
        else:
            loop.call_soon_threadsafe(done.set_result, result)

    threading.Thread(target=target, name="standby-warm-up", daemon=True).start()
    return await done


# --- fetching ---------------------------------------------------------------------------


FETCH_WAIT_MS = 50
"""How long the broker may hold a fetch of partitions it has nothing new on. It delays
no record (a fetch is answered as soon as one arrives; the batch's own wait is the
fetch loop's), but every expired one is a request: at 5 ms a worker whose prefetched
partitions are at their end sent ~100 empty fetches a second while it drained them
(8x the fetch requests, and about 20 % fewer requests served than at 50 ms, measured by
``graylane bench path``'s worker-alone drain)."""


def consumer_options(config: WorkerConfig, layout: TopicLayout) -> ConsumerOptions:
    """The worker's consumer group and fetch sizes, from its config."""
    return ConsumerOptions(
        group_id=config.group_id or layout.worker_group(config.model, config.version),
        max_poll_records=config.max_batch_size * config.fetch_factor,
        fetch_max_wait_ms=max(FETCH_WAIT_MS, config.max_wait_ms),
    )


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


# --- metrics ----------------------------------------------------------------------------


class WorkerObserver:
    """Counts what one worker serves and exports it; no decision depends on it."""

    def __init__(self, config: WorkerConfig) -> None:
        self._config = config
        self.observability = ServiceObservability("worker")
        self.registry = self.observability.registry
        self.metrics = WorkerMetrics.create(self.registry)
        self.count_refused(config.refused_artifacts)
        self._lag_checked = 0.0
        self.lag = 0
        """Records not yet consumed on the version topic at the last check (for telemetry)."""

    def count_refused(self, refused: Sequence[RefusedArtifact]) -> None:
        """Count artifacts refused for their signature, at start or on a reload."""
        for artifact in refused:
            self.metrics.artifact_verification_failures.labels(
                self._config.model, self._config.version, artifact.reason.value
            ).inc()

    def count_error(self, variant: str, code: ErrorCode, n: int = 1) -> None:
        """Count ``n`` answers of error ``code`` (named only here, on the metric label)."""
        cfg = self._config
        self.metrics.errors.labels(cfg.model, cfg.version, variant, code.name).inc(n)
        if code is ErrorCode.DEADLINE_EXCEEDED:
            self.metrics.shed.labels(cfg.model, cfg.version, variant, "deadline").inc(n)

    async def observe_lag(self, consumer: BatchConsumer, every_s: float = 1.0) -> None:
        """Consumer lag per version topic, at most once per ``every_s``; readiness on assignment."""
        if time.monotonic() - self._lag_checked < every_s:
            return
        self._lag_checked = time.monotonic()
        self.observability.note_assignment(consumer.assignment())
        lags = await consumer_lag(consumer)
        self.lag = sum(lags.values())
        for topic, lag in lags.items():
            self.metrics.consumer_lag.labels(self._config.model, self._config.version, topic).set(
                lag
            )

    def start(self, settings: Settings) -> None:
        cfg = self._config
        self.registry.register(NvmlCollector(cfg.model, cfg.version, load_nvml()))
        self.observability.start(
            settings.metrics_address(cfg.metrics_port), settings.build_labels()
        )

    def record(self, report: BatchReport, variant: str) -> None:
        labels = (self._config.model, self._config.version, variant)
        for code, n in report.error_codes.items():
            self.count_error(variant, code, n)
        for job in report.answers:
            if job.result is not None:
                when = job.result.timing
                self.metrics.queue_wait_ms.labels(*labels).observe(when.queue_wait_ms)
                self.metrics.e2e_latency_ms.labels(*labels).observe(when.total_ms)
                self.metrics.service_ms.labels(*labels).observe(
                    max(0, when.completed_at_unix_ms - when.dequeued_at_unix_ms)
                )
                if job.result.task == inference_pb2.GENERATE:
                    self.metrics.generation(labels, job.result)
        self.metrics.requests.labels(*labels).inc(report.served)
        self.metrics.batch_size.labels(*labels).observe(report.telemetry.batch_size)
        self.metrics.compute_ms.labels(*labels).observe(report.telemetry.compute_ms)
        if report.telemetry.HasField("generation"):
            generation = report.telemetry.generation
            self.metrics.kv_cache_occupancy.labels(*labels).set(generation.kv_cache_occupancy)
            self.metrics.waiting_sequences.labels(*labels).set(generation.waiting_sequences)


# --- the worker -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Running:
    """A batch handed to the engine thread."""

    task: asyncio.Future[RanBatch]
    submitted_ms: int


class Worker:
    def __init__(
        self,
        factory: KafkaFactory,
        config: WorkerConfig,
        engines: Mapping[str, InferenceEngine],
        *,
        reload: Reloader | None = None,
    ) -> None:
        """``reload`` loads ``engines`` again (same variants and artifacts) for a broken engine."""
        if config.initial_variant not in engines:
            raise ValueError(
                f"initial variant {config.initial_variant!r} is not loaded "
                f"(loaded: {sorted(engines)})"
            )
        self.factory = factory
        self.layout = factory.layout
        self.config = config
        self.tokenizer = config.tokenizer or detect_tokenizer(engines.values())
        self.active_variant = config.initial_variant
        self.precision_epoch = 0
        buckets = profile_buckets(config.profiles, config.model_info, config.max_seq_len)
        self.policy = BucketPolicy(
            buckets=buckets or config.buckets, max_batch_size=config.max_batch_size
        )
        """Buckets from the artifact's build profiles when it has them, else the config's."""
        self.limits = Limits(
            max_seq_len=min(config.max_seq_len, self.policy.max_seq_len),
            max_new_tokens=config.max_new_tokens,
        )
        self.observer = WorkerObserver(config)
        self.observability = self.observer.observability
        self.registry = self.observer.registry
        self.metrics = self.observer.metrics
        self.ready = asyncio.Event()
        self.served = 0
        self._precision = CompactedFollower(
            factory,
            self.layout.precision(),
            self._apply_precision_record,
            client_suffix="worker-precision",
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
        self._last_run_ms = 0
        """When the last admitted batch started (unix ms): admission probes after a pause."""
        continuous = config.continuous_batching and any(
            kv_cache_layout(e.io) is not None for e in engines.values()
        )
        self._fetch = CycleFetch(
            config, self.learner, fill=not continuous, lag=lambda: self.observer.lag
        )
        self._cycle_done = 0.0
        """perf_counter when the last cycle's answers were all sent (0: none yet)."""
        self._cycle_batches: list[tuple[int, float]] = []
        """This cycle's forward batches so far: (rows, ms spent on each)."""
        self._batch_ids = BatchIds(config.worker_id)
        self._background = BackgroundTasks()
        self._decoders: dict[str, tuple[InferenceEngine, ContinuousDecoder]] = {}
        self._cancels = CancelBook()
        self._engines = WorkerEngines(
            engines,
            config.faults,
            policy=self.policy,
            max_seq_len=self.limits.max_seq_len,
            failure_limit=config.engine_failure_limit,
            reload=reload,
            give_up=self._background.abort,
            active=lambda: self.active_variant,
            decode=self.tokenizer.decode if self.tokenizer is not None else None,
        )

    @property
    def engines(self) -> Mapping[str, InferenceEngine]:
        """The loaded variants, as they run (with injected faults, if any)."""
        return self._engines.engines

    # -- warm-up ---------------------------------------------------------------
    def warm_up(self) -> int:
        """Run every loaded variant (without injected faults) once per warm-up shape."""
        cfg = self.config
        return warm_up(
            self._engines.plain.values(),
            self.policy,
            self.limits.max_seq_len,
            cfg.profiles,
            cfg.model_info,
        )

    # -- precision -------------------------------------------------------------
    def apply_precision(self, command: control_pb2.PrecisionCommand) -> bool:
        if (command.model, command.version) != (self.config.model, self.config.version):
            return False
        if command.epoch <= self.precision_epoch:
            return False
        if command.variant not in self.engines:
            log.error(
                "precision command for variant %r ignored: not loaded (loaded: %s)",
                command.variant,
                sorted(self.engines),
            )
            return False
        self.precision_epoch = command.epoch
        if command.variant != self.active_variant:
            labels = (self.config.model, self.config.version)
            self.metrics.active_variant.labels(*labels, self.active_variant).set(0)
            log.info("switching %s/%s to %s (%s)", *labels, command.variant, command.reason)
            self.active_variant = command.variant
            self.metrics.active_variant.labels(*labels, self.active_variant).set(1)
        return True

    def _apply_precision_record(self, record: ConsumerRecord[bytes, bytes]) -> None:
        key = self.layout.precision_key(self.config.model, self.config.version).encode()
        if record.key != key or record.value is None:
            return
        try:
            self.apply_precision(serde.decode(control_pb2.PrecisionCommand, record.value))
        except SerdeError as exc:
            log.error("bad precision command at offset %d: %s", record.offset, exc)

    # -- one fetched cycle -------------------------------------------------------
    def consumer_options(self) -> ConsumerOptions:
        return consumer_options(self.config, self.layout)

    def hooks(self, sink: ReplySink, producer: Producer) -> LoopHooks:
        """This worker's part of the consume loop: fetch a cycle, answer it, watch the lag."""

        async def handle(records: list[Record]) -> list[Awaitable[object]]:
            return await self.handle(records, sink, producer)

        return LoopHooks(
            handle=handle,
            fetch=self._fetch.collect,
            after_turn=self.observer.observe_lag,
            dead_letter=sink.dead_letter,
        )

    async def handle(
        self, records: Records, sink: ReplySink, producer: Producer
    ) -> list[Awaitable[object]]:
        """Answer every record of one cycle; the sends to wait on before committing."""
        began = time.perf_counter()
        self._cycle_batches = []
        futures = await self._answer_cycle(records, sink, producer)
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
        self, records: Records, sink: ReplySink, producer: Producer
    ) -> list[Awaitable[object]]:
        dequeued = now_ms()
        variant = self.active_variant
        engine = self.engines[variant]
        rules = IntakeRules(
            model=self.config.model,
            max_request_bytes=self.factory.settings.max_request_bytes,
            io=engine.io,
            limits=self.limits,
            tokenizer=self.tokenizer,
            model_info=self.config.model_info,
            layout=self.layout,
        )
        context = ResultContext(
            model=self.config.model,
            version=self.config.version,
            variant=variant,
            worker_id=self.config.worker_id,
            tokenizer=self.tokenizer,
        )
        futures: list[Awaitable[object]] = []
        jobs: list[Job] = []
        decoder = self._decoder(context, engine, sink, producer)
        for index, record in enumerate(records):
            checked = await self._intake(index, record, rules, sink, variant)
            if not isinstance(checked, Job):
                futures.append(checked)
            elif decoder is not None and checked.task is TaskKind.GENERATE:
                futures.append(decoder.submit(checked))
                request = checked.request
                if self._cancels.cancelled(request.request_id, request.reply_topic, time.time()):
                    decoder.cancel(request.request_id, request.reply_topic)
            else:
                jobs.append(checked)
        choice = self._fetch.choice
        planned_batches = self.policy.plan_batches(jobs, choice.steady_batch)
        if choice.then:  # exploring: one batch of the explored size first
            planned_batches = split_first(planned_batches, choice.max_batch)
        admission = admit_cycle(
            planned_batches,
            self.learner.estimate_ms,
            default_deadline_ms=self.config.default_deadline_ms,
            now_unix_ms=now_ms(),
            last_run_unix_ms=self._last_run_ms,
        )
        self._pending_shed += len(admission.shed)
        for shed in admission.shed:
            reason = "priority" if shed.displaced else "deadline"
            self.metrics.shed.labels(self.config.model, self.config.version, variant, reason).inc()
            rejection = Rejection(ErrorCode.SHED, shed.reason)
            futures.append(await self._error_result(sink, shed.item, rejection, variant))
        if admission.shed and not any(admission.admitted):
            # nothing runs this cycle: report the sheds now, the policy engine steps on them
            shed_count, self._pending_shed = self._pending_shed, 0
            telemetry = shed_telemetry(context, shed_count, now_ms())
            futures.append(await self._send_telemetry(producer, telemetry))
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
                report = self._report(batch, running, ran, context, dequeued)
                sends = await self._deliver(report, sink, producer)
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
                    _trace_batch(batch.items, sends, hop)
                if report.telemetry.error_count == 0 and forward_only(batch.items):
                    # engine time plus the worker's own per-batch cost (results, sends)
                    spent_ms = ran.run.compute_ms + (time.perf_counter() - returned) * 1000.0
                    self.learner.observe(len(batch.items), spent_ms, batch.bucket_len)
                    self._cycle_batches.append((len(batch.items), spent_ms))
        finally:
            if ahead is not None:  # the cycle failed: it is handled again, record by record
                ahead.task.cancel()
        return futures

    # -- continuous decoding -----------------------------------------------------
    def _decoder(
        self,
        context: ResultContext,
        engine: InferenceEngine,
        sink: ReplySink,
        producer: Producer,
    ) -> ContinuousDecoder | None:
        """The running decode batch of the active variant (None: generation runs per batch)."""
        cfg = self.config
        if not cfg.continuous_batching or kv_cache_layout(engine.io) is None:
            return None
        known = self._decoders.get(context.variant)
        if known is not None and known[0] is engine:
            return known[1]

        async def deliver(finished: Finished) -> list[Awaitable[object]]:
            report = generation_report(
                finished.jobs,
                context,
                started_ms=finished.started_ms,
                device_load=self._engines.device_load,
                batch_id=self._batch_ids.of(finished.jobs[0].record),
                load=finished.load,
            )
            report.telemetry.lag = self.observer.lag
            self.observer.record(report, context.variant)
            self.served += report.served
            sends = await self._deliver(report, sink, producer)
            if tracing.enabled():
                _trace_generations(finished.jobs, sends, context)
            return sends

        async def send_chunk(job: Job, chunk: inference_pb2.InferenceResult) -> Awaitable[object]:
            topic = sink.reply_topic(job.request)
            key = job.request.request_id.encode("utf-8")
            return await producer.send(topic, serde.encode(chunk), key=key)

        def result_of(
            job: Job, result: GenerationResult, started_ms: int
        ) -> inference_pb2.InferenceResult:
            return generation_result(job, result, context, started_ms=started_ms)

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
            decode_text=self.tokenizer.decode if self.tokenizer is not None else None,
            deliver=deliver,
            send_chunk=send_chunk,
            result_of=result_of,
        )
        if known is not None:
            self._background.spawn(known[1].drain_and_close(), name="decoder-retire")
        self._decoders[context.variant] = (engine, decoder)
        return decoder

    def _apply_cancel_record(self, record: Record) -> None:
        """A cancel from the topic: stop the generation here, or remember it for a while."""
        try:
            cancel = serde.decode(inference_pb2.CancelRequest, record.value)
        except SerdeError as exc:
            log.warning("bad cancel at offset %d: %s", record.offset, exc)
            return
        if cancel.model and cancel.model != self.config.model:
            return
        hit = any(
            decoder.cancel(cancel.request_id, cancel.reply_topic)
            for _, decoder in self._decoders.values()
        )
        if not hit:
            self._cancels.note(cancel.request_id, cancel.reply_topic, time.time())

    async def _follow_cancels(self, stop: asyncio.Event, ready: asyncio.Event) -> None:
        def handle(record: Record) -> None:
            try:
                self._apply_cancel_record(record)
            except Exception:  # one record never ends the follower
                log.exception("cancel at offset %d passed over", record.offset)

        await follow(
            self.factory,
            self.layout.cancels(),
            handle,
            stop,
            start_at=FollowFrom.END,
            ready=ready,
            client_suffix="worker-cancels",
        )

    async def _intake(
        self, index: int, record: Record, rules: IntakeRules, sink: ReplySink, variant: str
    ) -> Job | Awaitable[object]:
        """The record as a job, or the send that answers it (a dead letter, an error result)."""
        try:
            request = decode(record.value)
        except SerdeError as exc:
            self.observer.count_error(variant, ErrorCode.DECODE_ERROR)
            return await sink.dead_letter(record, ErrorCode.DECODE_ERROR, str(exc))
        if distrust_shadow(request, self.config.version):
            log.warning("ignored a shadow flag on %s[%d]@%d", *_where(record))
        try:
            checked = validate(request, len(record.value or b""), index, rules, now_ms())
        except Exception as exc:  # one record never ends the loop
            log.exception("unexpected error validating %s[%d]@%d", *_where(record))
            checked = Rejection(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
        if isinstance(checked, Rejection):
            self.observer.count_error(variant, checked.code)
            return await sink.error_result(
                request,
                checked,
                record,
                version=self.config.version,
                variant=variant,
                worker_id=self.config.worker_id,
            )
        return Job(record, request, checked)

    def _start(
        self, batch: PlannedBatch[Job], context: ResultContext, engine: InferenceEngine
    ) -> _Running:
        """Hand one planned batch to the engine thread (queued behind the one running).

        An input error re-runs the batch item by item (only the bad item fails);
        an unknown exception answers ``INTERNAL`` and the loop goes on.
        """
        self._last_run_ms = now_ms()
        items = [job.work for job in batch.items]
        task = asyncio.ensure_future(self._engines.run(context.variant, items, engine))
        return _Running(task, self._last_run_ms)

    def _report(
        self,
        batch: PlannedBatch[Job],
        running: _Running,
        ran: RanBatch,
        context: ResultContext,
        dequeued: int,
    ) -> BatchReport:
        """Answer the jobs of a batch the engine ran, and count it."""
        batch_id = self._batch_ids.of(batch.items[0].record)
        done = now_ms()
        # a batch queued behind another started when that one was done
        started = min(done, max(running.submitted_ms, done - round(ran.run.compute_ms)))
        report = build_batch(
            batch.items,
            ran.run,
            ran.failure,
            context,
            BatchClock(dequeued_ms=dequeued, started_ms=started, done_ms=done),
            bucket_len=batch.bucket_len,
            device_load=ran.device_load,
            batch_id=batch_id,
        )
        report.telemetry.shed_count, self._pending_shed = self._pending_shed, 0
        report.telemetry.lag = self.observer.lag
        self.observer.record(report, context.variant)
        self.served += report.served
        return report

    # -- sends -----------------------------------------------------------------
    async def _deliver(
        self, report: BatchReport, sink: ReplySink, producer: Producer
    ) -> list[Awaitable[object]]:
        """Send the batch's answers (results, error results, shadow copies), then telemetry."""
        futures: list[Awaitable[object]] = []
        variant = report.telemetry.variant
        for job in report.answers:
            request = job.request
            payload = b"" if job.result is None else serde.encode(job.result)
            rejection = job.rejection
            key = request.request_id.encode("utf-8")
            shadow_topic = self.layout.shadow(request.model)
            if job.result is not None and rejection is None:
                too_large = await self._oversized(sink, job, payload, key)
                if too_large is not None:
                    self.observer.count_error(variant, ErrorCode.RESULT_TOO_LARGE)
                    rejection = Rejection(ErrorCode.RESULT_TOO_LARGE, f"result: {too_large}")
            if job.result is None or rejection is not None:
                rejection = rejection or Rejection(ErrorCode.INTERNAL, "no outcome")
                futures.append(await self._error_result(sink, job, rejection, variant))
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
        futures.append(await self._send_telemetry(producer, report.telemetry))
        return futures

    async def _oversized(self, sink: ReplySink, job: Job, payload: bytes, key: bytes) -> str | None:
        """Why ``job``'s result cannot go to its topics (each one's limit), or None."""
        request = job.request
        shadow_topic = self.layout.shadow(request.model)
        topics = [shadow_topic] if request.shadow else [sink.reply_topic(request)]
        if request.mirror_result and not request.shadow:
            topics.append(shadow_topic)
        for topic in topics:
            too_large = await sink.oversized(topic, payload, key)
            if too_large is not None:
                return too_large
        return None

    async def _error_result(
        self, sink: ReplySink, job: Job, rejection: Rejection, variant: str
    ) -> Awaitable[object]:
        """An error result for ``job``, stamped with this worker's version and id."""
        return await sink.error_result(
            job.request,
            rejection,
            job.record,
            version=self.config.version,
            variant=variant,
            worker_id=self.config.worker_id,
        )

    async def _send_telemetry(
        self, producer: Producer, telemetry: telemetry_pb2.BatchTelemetry
    ) -> Awaitable[object]:
        key = f"{self.config.model}/{self.config.version}".encode()
        return await producer.send(self.layout.telemetry(), serde.encode(telemetry), key=key)

    # -- lifecycle -------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        layout = self.layout
        await self.factory.ensure_topics(
            layout.shared_specs() + layout.model_specs(cfg.model, [cfg.version])
        )
        warmed = await (
            run_at_low_priority(self.warm_up)
            if cfg.standby
            else self._engines.in_thread(self.warm_up)
        )
        log.info("warmed %d variant x bucket shapes", warmed)
        self.observer.start(self.factory.settings)
        what = f"worker {cfg.worker_id} of {cfg.model}/{cfg.version}"
        if cfg.standby and not await wait_for_activation(stop, what):
            self._engines.close()
            self.observability.close()
            return
        self.metrics.active_variant.labels(cfg.model, cfg.version, self.active_variant).set(1)
        await self._precision.catch_up()
        self.observability.mark(CONTROL_CAUGHT_UP)
        producer = self.factory.producer(client_suffix="worker")
        await producer.start()
        limits = MessageLimits.of_factory(
            self.factory, ceiling=self.factory.settings.max_message_bytes
        )
        await limits.load([layout.results(cfg.model), layout.shadow(cfg.model), layout.dlq()])
        sink = ReplySink(producer, layout, f"worker:{cfg.model}/{cfg.version}", limits=limits)
        loop = ConsumeLoop(
            "worker",
            self.factory,
            [layout.version_requests(cfg.model, cfg.version)],
            self.consumer_options(),
            role="worker",
            client_suffix="worker",
            registry=self.registry,
            max_in_flight=cfg.max_in_flight,
        )
        loop.guard.on_fault(sink.forget)  # rebalances, outages: not fatal
        await loop.start()
        background = self._background
        background.spawn(self._precision.follow(stop), name="worker-precision-follower")
        cancels_ready = asyncio.Event()
        background.spawn(self._follow_cancels(stop, cancels_ready), name="worker-cancels")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancels_ready.wait(), 30.0)
        self.ready.set()
        log.info(
            "worker %s serving %s/%s with %s",
            cfg.worker_id,
            cfg.model,
            cfg.version,
            self.active_variant,
        )
        try:
            await loop.run(stop, self.hooks(sink, producer), healthy=lambda: background.healthy)
        finally:
            for _, decoder in self._decoders.values():
                await decoder.close()
            await background.close()
            await loop.stop()  # a clean stop hands its partitions over at once
            await producer.stop()
            await self._precision.stop()
            self._engines.close()
            self.observability.close()
        background.raise_if_failed()  # crash-only: a dead follower or a broken engine ends it


def _trace_batch(jobs: Sequence[Job], sends: Sequence[object], hop: tracing.WorkerHop) -> None:
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


def _trace_generations(
    jobs: Sequence[Job], sends: Sequence[object], context: ResultContext
) -> None:
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
