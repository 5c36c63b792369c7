"""The engine worker: a consumer group per (model, version) running engine variants.

One fetched cycle goes decode → validate (:mod:`~graylane.engine_worker.intake`)
→ plan (:mod:`~graylane.engine_worker.batching`) → run
(:mod:`~graylane.engine_worker.compute`, in a thread so aiokafka's heartbeats keep
running on the event loop) → build results (:mod:`~graylane.engine_worker.results`)
→ deliver (:mod:`~graylane.engine_worker.delivery_step`). Offsets are committed only
after every result and the batch telemetry are acknowledged (at-least-once;
duplicates carry the same request_id). Fault injection is an engine wrapper
(:mod:`~graylane.engine_worker.faults`), not a step of its own.

The pure parts live beside it (intake, batching, batch learner, admission, compute,
results, batch ids, load meter), the metrics in :mod:`~graylane.engine_worker.observe`
and the sends in :mod:`~graylane.engine_worker.delivery_step`. What stays here is the
:class:`Worker`: its consumer, producer and commit point, the fetch cycle (collect,
admit, run), precision commands, engine recovery and the run loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Mapping
from concurrent.futures import ThreadPoolExecutor

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from graylane import serde
from graylane.clock import now_ms
from graylane.engine.errors import EngineError
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.admission import admit_cycle, forward_only
from graylane.engine_worker.batch_ids import BatchIds
from graylane.engine_worker.batch_learner import BatchLearner, LearnerConfig
from graylane.engine_worker.batching import BucketPolicy, PlannedBatch, split_first
from graylane.engine_worker.compute import (
    BatchRun,
    run_isolated,
    warm_up,
)
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.delivery_step import DeliveryStep, Records
from graylane.engine_worker.engine_health import EngineHealth, WorkerGaveUp
from graylane.engine_worker.engine_recovery import EngineRecovery, Reloader
from graylane.engine_worker.faults import InjectedFault, with_faults
from graylane.engine_worker.fetching import CycleFetch, consumer_options
from graylane.engine_worker.intake import IntakeRules, decode, distrust_shadow, validate
from graylane.engine_worker.load_meter import LoadMeter
from graylane.engine_worker.observe import WorkerObserver
from graylane.engine_worker.requests import Limits, WorkItem
from graylane.engine_worker.results import (
    BatchClock,
    BatchReport,
    ResultContext,
    build_batch,
    engine_rejection,
)
from graylane.engine_worker.shapes import profile_buckets
from graylane.engine_worker.standby import run_at_low_priority, wait_for_activation
from graylane.engine_worker.tokenizer import detect_tokenizer
from graylane.errors import SerdeError
from graylane.kafka.loop import BatchGuard, deliver_and_commit, leave_on_stop
from graylane.kafka.reading import CompactedFollower
from graylane.kafka.replies import (
    Rejection,
    ReplySink,
    reply_topic_rejection,
)
from graylane.kafka.seam import ConsumerOptions, KafkaFactory, Producer
from graylane.metrics import (
    CONTROL_CAUGHT_UP,
)
from graylane.supervision import BackgroundTasks
from graylane.v1 import control_pb2, inference_pb2, telemetry_pb2

log = logging.getLogger(__name__)


def _where(record: ConsumerRecord[bytes, bytes]) -> tuple[str, int, int]:
    return record.topic, record.partition, record.offset


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
        self._plain_engines = dict(engines)
        """Without fault injection: warm-up runs these."""
        self.engines = with_faults(engines, config.faults)
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
        self._delivery = DeliveryStep(
            config=config, layout=self.layout, settings=factory.settings, observer=self.observer
        )
        self.ready = asyncio.Event()
        self.served = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._precision = CompactedFollower(
            factory,
            self.layout.precision(),
            self._apply_precision_record,
            client_suffix="worker-precision",
        )
        self._load = LoadMeter()
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
        self._fetch = CycleFetch(config, self.learner)
        self._batch_ids = BatchIds(config.worker_id)
        self._background = BackgroundTasks()
        self._recovery = EngineRecovery(
            EngineHealth(config.engine_failure_limit), reload, self._background.abort
        )

    # -- warm-up ---------------------------------------------------------------
    def warm_up(self) -> int:
        """Run every loaded variant (without injected faults) once per warm-up shape."""
        cfg = self.config
        return warm_up(
            self._plain_engines.values(),
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

    async def serve_once(
        self,
        consumer: AIOKafkaConsumer,
        sink: ReplySink,
        producer: Producer,
        guard: BatchGuard | None = None,
    ) -> int:
        """Fetch a cycle, answer it, commit once every send is acknowledged; records seen."""
        records = await self._fetch.collect(consumer)
        if records:
            await deliver_and_commit(
                consumer,
                records,
                functools.partial(self.handle, records, sink, producer),
                guard=guard,
            )
        return len(records)

    async def handle(
        self, records: Records, sink: ReplySink, producer: Producer
    ) -> list[Awaitable[object]]:
        """Answer every record of one cycle; the sends to wait on before committing."""
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
        )
        futures: list[Awaitable[object]] = []
        requests: dict[int, inference_pb2.InferenceRequest] = {}
        items: list[WorkItem] = []
        for index, record in enumerate(records):
            try:
                request = decode(record.value)
            except SerdeError as exc:
                self.observer.count_error(variant, "DECODE_ERROR")
                futures.append(await sink.dead_letter(record, inference_pb2.DECODE_ERROR, str(exc)))
                continue
            requests[index] = request
            if distrust_shadow(request, self.config.version):
                log.warning("ignored a shadow flag on %s[%d]@%d", *_where(record))
            try:
                checked = reply_topic_rejection(self.layout, request) or validate(
                    request, len(record.value or b""), index, rules, now_ms()
                )
            except Exception as exc:  # one record never ends the loop
                log.exception("unexpected error validating %s[%d]@%d", *_where(record))
                checked = Rejection(inference_pb2.INTERNAL, f"internal error: {type(exc).__name__}")
            if isinstance(checked, Rejection):
                self.observer.count_error(variant, inference_pb2.ErrorCode.Name(checked.code))
                futures.append(
                    await self._delivery.error_result(sink, request, checked, record, variant)
                )
            else:
                items.append(checked)
        context = ResultContext(
            model=self.config.model,
            version=self.config.version,
            variant=variant,
            worker_id=self.config.worker_id,
            tokenizer=self.tokenizer,
        )
        choice = self._fetch.choice
        planned_batches = self.policy.plan_batches(items, choice.steady_batch)
        if choice.then:  # exploring: one batch of the explored size first
            planned_batches = split_first(planned_batches, choice.max_batch)
        admission = admit_cycle(
            planned_batches,
            requests,
            self.learner.estimate_ms,
            default_deadline_ms=self.config.default_deadline_ms,
            now_unix_ms=now_ms(),
            last_run_unix_ms=self._last_run_ms,
        )
        self._pending_shed += len(admission.shed)
        futures.extend(await self._delivery.sheds(admission.shed, records, requests, sink, variant))
        if admission.shed and not any(admission.admitted):
            # nothing runs this cycle: report the sheds now, the policy engine steps on them
            shed_count, self._pending_shed = self._pending_shed, 0
            futures.append(await self._delivery.shed_telemetry(producer, variant, shed_count))
        for planned, kept in zip(planned_batches, admission.admitted, strict=True):
            if not kept:
                continue
            self._last_run_ms = now_ms()
            planned = PlannedBatch(planned.bucket_len, kept)
            batch_id = self._batch_ids.of(records[planned.items[0].index])
            started = time.perf_counter()
            report = await self._run(engine, planned, requests, context, dequeued, batch_id)
            futures.extend(await self._delivery.deliver(report, records, sink, producer))
            if report.telemetry.error_count == 0 and forward_only(kept):
                # engine time plus the worker's own per-batch cost (results, sends)
                spent_ms = (time.perf_counter() - started) * 1000.0
                self.learner.observe(len(kept), spent_ms, planned.bucket_len)
        return futures

    async def _run(
        self,
        engine: InferenceEngine,
        planned: PlannedBatch[WorkItem],
        requests: Mapping[int, inference_pb2.InferenceRequest],
        context: ResultContext,
        dequeued: int,
        batch_id: telemetry_pb2.BatchId | None = None,
    ) -> BatchReport:
        """Run one planned batch off the event loop and build its answers.

        An input error re-runs the batch item by item (only the bad item fails);
        an unknown exception answers ``INTERNAL`` and the loop goes on.
        """
        items = list(planned.items)
        engine = self.engines.get(context.variant, engine)  # reloaded since the cycle began
        started = now_ms()
        failure: Rejection | None = None
        try:
            run = await asyncio.get_running_loop().run_in_executor(
                self._executor, run_isolated, engine, items, self.policy, self.limits.max_seq_len
            )
            if run.outcomes:
                self._recovery.served()
        except EngineError as exc:
            if not isinstance(exc, InjectedFault):
                log.exception("engine failure on a batch of %d", len(items))
                await self._engine_failed(exc)
            run, failure = BatchRun({}, 0.0, 0), engine_rejection(exc)
        except Exception as exc:
            log.exception("unexpected error running a batch of %d", len(items))
            run = BatchRun({}, 0.0, 0)
            failure = Rejection(inference_pb2.INTERNAL, f"internal error: {type(exc).__name__}")
        report = build_batch(
            items,
            requests,
            run,
            failure,
            context,
            BatchClock(dequeued_ms=dequeued, started_ms=started, done_ms=now_ms()),
            bucket_len=planned.bucket_len,
            device_load=self._load.add(run.compute_ms / 1000.0),
            batch_id=batch_id,
        )
        report.telemetry.shed_count, self._pending_shed = self._pending_shed, 0
        report.telemetry.lag = self.observer.lag
        self.observer.record(report, context.variant)
        self.served += report.served
        return report

    async def _engine_failed(self, exc: EngineError) -> None:
        """Count it; reload the engines or give up when :class:`EngineHealth` says so."""
        fresh = await self._recovery.failed(f"{type(exc).__name__}: {exc}", self._executor)
        if fresh is not None and self.active_variant not in fresh:
            self._background.abort(WorkerGaveUp(f"reload lost variant {self.active_variant!r}"))
        elif fresh is not None:
            old, self._plain_engines = self._plain_engines, fresh
            self.engines = with_faults(fresh, self.config.faults)
            for engine in old.values():
                engine.close()

    # -- lifecycle -------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        layout = self.layout
        await self.factory.ensure_topics(
            layout.shared_specs() + layout.model_specs(cfg.model, [cfg.version])
        )
        loop = asyncio.get_running_loop()
        warmed = await (
            run_at_low_priority(self.warm_up)
            if cfg.standby
            else loop.run_in_executor(self._executor, self.warm_up)
        )
        log.info("warmed %d variant x bucket shapes", warmed)
        self.observer.start(self.factory.settings)
        what = f"worker {cfg.worker_id} of {cfg.model}/{cfg.version}"
        if cfg.standby and not await wait_for_activation(stop, what):
            self._executor.shutdown(wait=False)
            self.observability.close()
            return
        self.metrics.active_variant.labels(cfg.model, cfg.version, self.active_variant).set(1)
        await self._precision.catch_up()
        self.observability.mark(CONTROL_CAUGHT_UP)
        producer = self.factory.producer(client_suffix="worker")
        await producer.start()
        sink = ReplySink(producer, layout, f"worker:{cfg.model}/{cfg.version}")
        guard = BatchGuard("worker", registry=self.registry)  # rebalances, outages: not fatal
        guard.on_fault(sink.forget)
        consumer = guard.consumer(
            self.factory,
            [layout.version_requests(cfg.model, cfg.version)],
            self.consumer_options(),
            role="worker",
            client_suffix="worker",
        )
        await consumer.start()
        background = self._background
        background.spawn(self._precision.follow(stop), name="worker-precision-follower")
        self.ready.set()
        log.info(
            "worker %s serving %s/%s with %s",
            cfg.worker_id,
            cfg.model,
            cfg.version,
            self.active_variant,
        )
        try:
            while not stop.is_set() and background.healthy:
                async with guard.cycle():
                    await self.serve_once(consumer, sink, producer, guard)
                    await self.observer.observe_lag(consumer)
        finally:
            await background.close()
            leave_on_stop(consumer)  # a clean stop hands its partitions over at once
            await consumer.stop()
            guard.close()
            await producer.stop()
            await self._precision.stop()
            self._executor.shutdown(wait=False)
            self.observability.close()
        background.raise_if_failed()  # crash-only: a dead follower or a broken engine ends it
