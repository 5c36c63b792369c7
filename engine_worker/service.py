"""The engine worker: a consumer group per (model, version) serving it through a backend.

The worker runs the library's consume loop (:class:`~graylane.kafka.consume_loop.ConsumeLoop`:
its consumer, the guard, the backoff and the commit after delivery) with its own
:meth:`Worker.hooks`. One fetched cycle goes: fetch (the backend's, which may hold back
while it cannot take more) → decode each record and check it in one pass against what
the backend runs (:meth:`~graylane.engine_worker.backend.WorkerBackend.check`: a
:class:`~graylane.engine_worker.requests.Job`, or an error result / dead letter at
once) → the backend answers the jobs → every answer goes out through the worker's
:class:`~graylane.engine_worker.outbox.WorkerOutbox` (results, shadow copies, stream chunks,
telemetry). Offsets are
committed only after every answer of a record is acknowledged (at-least-once;
duplicates carry the same request_id).

What runs the requests is the backend (:mod:`~graylane.engine_worker.backend`):
engines in this process (:class:`~graylane.engine_worker.native.NativeBackend`), or
an engine server over HTTP
(:class:`~graylane.engine_worker.engine_server.EngineServerBackend`, when the config
names ``endpoints``). Everything else is the worker's, the same for both: precision
commands (the QoS ladder), cancels, metrics and readiness, warm standby
(:mod:`~graylane.engine_worker.standby`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence

from aiokafka.structs import ConsumerRecord

from graylane import serde
from graylane.clock import now_ms
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.backend import ResultContext, WorkerBackend
from graylane.engine_worker.compute import Reloader
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.engine_server import EngineServerBackend
from graylane.engine_worker.native import FETCH_WAIT_MS, NativeBackend
from graylane.engine_worker.observer import WorkerObserver
from graylane.engine_worker.outbox import WorkerOutbox
from graylane.engine_worker.requests import EngineRules, Job, TaskKind, decode, distrust_shadow
from graylane.engine_worker.standby import wait_for_activation
from graylane.engine_worker.state import ActiveVariant, CancelBook, CancelKey
from graylane.errors import ErrorCode, Rejection, SerdeError
from graylane.kafka.admin import MessageLimits
from graylane.kafka.consume_loop import ConsumeLoop, LoopHooks
from graylane.kafka.reading import CompactedFollower, FollowFrom, follow
from graylane.kafka.replies import ReplySink
from graylane.kafka.seam import (
    ConsumerOptions,
    KafkaFactory,
    Producer,
    ProducerOptions,
    Record,
)
from graylane.metrics.process import CONTROL_CAUGHT_UP
from graylane.supervision import BackgroundTasks
from graylane.topics import TopicLayout
from graylane.v1 import control_pb2, inference_pb2

__all__ = ["Records", "Worker", "consumer_options"]

log = logging.getLogger(__name__)

Records = Sequence[Record]


def _where(record: Record) -> tuple[str, int, int]:
    return record.topic, record.partition, record.offset


def consumer_options(config: WorkerConfig, layout: TopicLayout) -> ConsumerOptions:
    """The worker's consumer group and fetch sizes, from its config."""
    return ConsumerOptions(
        group_id=config.group_id or layout.worker_group(config.model, config.version),
        max_poll_records=config.max_batch_size * config.fetch_factor,
        fetch_max_wait_ms=max(FETCH_WAIT_MS, config.max_wait_ms),
    )


class Worker:
    """One worker process of a model version (see the module's docstring)."""

    def __init__(
        self,
        factory: KafkaFactory,
        config: WorkerConfig,
        engines: Mapping[str, InferenceEngine] | None = None,
        *,
        reload: Reloader | None = None,
    ) -> None:
        """Serves ``engines`` in this process, or, when ``config.endpoints`` names engine
        servers, through them (then ``engines`` is empty). ``reload`` loads ``engines``
        again (same variants and artifacts) for a broken engine."""
        self.factory = factory
        self.layout = factory.layout
        self.config = config
        self.precision = ActiveVariant(config.initial_variant)
        self.observer = WorkerObserver(config)
        self.observability = self.observer.observability
        self.registry = self.observer.registry
        self.metrics = self.observer.metrics
        self.ready = asyncio.Event()
        self._background = BackgroundTasks()
        self._cancels = CancelBook()
        self._delivery: WorkerOutbox | None = None
        self.backend: WorkerBackend
        if config.endpoints:
            if engines:
                raise ValueError("a worker serves either engines or engine endpoints, not both")
            self.backend = EngineServerBackend(
                config.endpoints,
                EngineRules(
                    model=config.model,
                    max_request_bytes=factory.settings.max_request_bytes,
                    max_new_tokens=config.max_new_tokens,
                    layout=self.layout,
                ),
                self.observability,
                active=lambda: self.active_variant,
                stream=config.stream,
                settings=config.engine_server,
                worker_id=config.worker_id,
            )
        else:
            self.backend = NativeBackend(
                config,
                engines or {},
                self.observer,
                self._background,
                active=lambda: self.active_variant,
                layout=self.layout,
                max_request_bytes=factory.settings.max_request_bytes,
                reload=reload,
            )
        if config.initial_variant not in self.backend.variants:
            raise ValueError(
                f"initial variant {config.initial_variant!r} is not loaded "
                f"(loaded: {sorted(self.backend.variants)})"
            )
        self.tokenizer = self.backend.tokenizer
        self._precision = CompactedFollower(
            factory,
            self.layout.precision(),
            self._apply_precision_record,
            client_suffix="worker-precision",
        )

    @property
    def served(self) -> int:
        """Requests answered with a result so far."""
        return self._delivery.served if self._delivery is not None else 0

    # -- precision -------------------------------------------------------------
    @property
    def active_variant(self) -> str:
        """The variant the worker serves now (the QoS ladder's choice)."""
        return self.precision.variant

    @property
    def precision_epoch(self) -> int:
        return self.precision.epoch

    def apply_precision(self, command: control_pb2.PrecisionCommand) -> bool:
        if (command.model, command.version) != (self.config.model, self.config.version):
            return False
        if not self.precision.newer(command.epoch):
            return False
        if command.variant not in self.backend.variants:
            log.error(
                "precision command for variant %r ignored: not loaded (loaded: %s)",
                command.variant,
                sorted(self.backend.variants),
            )
            return False
        previous = self.precision.variant
        self.precision.take(command.epoch, command.variant)
        if command.variant != previous:
            labels = (self.config.model, self.config.version)
            self.metrics.active_variant.labels(*labels, previous).set(0)
            log.info("switching %s/%s to %s (%s)", *labels, command.variant, command.reason)
            self.metrics.active_variant.labels(*labels, command.variant).set(1)
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
        """This worker's part of the consume loop: fetch a cycle, answer it, watch the lag;
        its answers go out through ``producer`` (refusals and dead letters via ``sink``)."""
        delivery = WorkerOutbox(self.config, self.layout, sink, producer, self.observer)
        self._delivery = delivery

        async def handle(records: list[Record]) -> list[Awaitable[object]]:
            return await self.handle(records, delivery)

        return LoopHooks(
            handle=handle,
            fetch=self.backend.fetch,
            after_turn=self.observer.observe_lag,
            dead_letter=sink.dead_letter,
        )

    async def handle(self, records: Records, delivery: WorkerOutbox) -> list[Awaitable[object]]:
        """Answer every record of one cycle; the sends to wait on before committing."""
        variant = self.active_variant
        context = ResultContext(
            model=self.config.model,
            version=self.config.version,
            variant=variant,
            worker_id=self.config.worker_id,
            tokenizer=self.tokenizer,
        )
        futures: list[Awaitable[object]] = []
        jobs: list[Job] = []
        for index, record in enumerate(records):
            checked = await self._intake(index, record, variant, delivery)
            if isinstance(checked, Job):
                jobs.append(checked)
            else:
                futures.append(checked)
        if jobs:
            futures.extend(await self.backend.answer(jobs, context, delivery))
        at = time.time()
        for job in jobs:  # a cancel that came before its request
            if job.task is TaskKind.GENERATE and self._cancels.cancelled(job.cancel_key, at):
                self.backend.cancel(job.cancel_key)
        return futures

    async def _intake(
        self, index: int, record: Record, variant: str, delivery: WorkerOutbox
    ) -> Job | Awaitable[object]:
        """The record as a job, or the send that answers it (a dead letter, an error result)."""
        sink = delivery.sink
        try:
            request = decode(record.value)
        except SerdeError as exc:
            self.observer.count_error(variant, ErrorCode.DECODE_ERROR)
            return await sink.dead_letter(record, ErrorCode.DECODE_ERROR, str(exc))
        if distrust_shadow(request, self.config.version):
            log.warning("ignored a shadow flag on %s[%d]@%d", *_where(record))
        try:
            checked = self.backend.check(
                request, len(record.value or b""), index, variant, now_ms()
            )
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

    # -- cancels ---------------------------------------------------------------
    def _apply_cancel_record(self, record: Record) -> None:
        """A cancel from the topic: stop the generation here, or remember it for a while."""
        try:
            cancel = serde.decode(inference_pb2.CancelRequest, record.value)
        except SerdeError as exc:
            log.warning("bad cancel at offset %d: %s", record.offset, exc)
            return
        if cancel.model and cancel.model != self.config.model:
            return
        key = CancelKey(cancel.request_id, cancel.reply_topic, cancel.cancel_token)
        if not self.backend.cancel(key):
            self._cancels.note(key, time.time())

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

    # -- lifecycle -------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        layout = self.layout
        await self.factory.ensure_topics(
            layout.shared_specs() + layout.model_specs(cfg.model, [cfg.version])
        )
        warmed = await self.backend.warm_up(low_priority=cfg.standby)
        log.info("warmed %d variant x bucket shapes", warmed)
        self.observer.start(self.factory.settings)
        what = f"worker {cfg.worker_id} of {cfg.model}/{cfg.version}"
        if cfg.standby and not await wait_for_activation(stop, what):
            await self.backend.close()
            self.observability.close()
            return
        self.metrics.active_variant.labels(cfg.model, cfg.version, self.active_variant).set(1)
        await self._precision.catch_up()
        self.observability.mark(CONTROL_CAUGHT_UP)
        # An engine-server worker's sends are a stream's chunks, each a token or a few a
        # user waits for: out at once (no linger); the engine bounds how many there are.
        options = ProducerOptions(linger_ms=0) if cfg.endpoints else None
        producer = self.factory.producer(options, client_suffix="worker")
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
            max_in_flight=self.backend.max_in_flight,
        )
        loop.guard.on_fault(sink.forget)  # rebalances, outages: not fatal
        await loop.start()
        await self.backend.start()
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
            await self.backend.close()
            await background.close()
            await loop.stop()  # a clean stop hands its partitions over at once
            await producer.stop()
            await self._precision.stop()
            self.observability.close()
        background.raise_if_failed()  # crash-only: a dead follower or a broken engine ends it
