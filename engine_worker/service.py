"""The engine worker: a consumer group per (model, version) running engine variants.

Kafka adapter around :mod:`graylane.engine_worker.requests` (validation),
:mod:`graylane.engine_worker.batching` (bucket planning) and :mod:`graylane.engine_worker.compute`
(inference). Inference runs in a thread so aiokafka's heartbeats keep running on
the event loop. Offsets are committed only after every result and the batch
telemetry are acknowledged (at-least-once; duplicates carry the same request_id).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from graylane import serde, tensors
from graylane.clock import now_ms
from graylane.engine_worker.batching import BucketPolicy
from graylane.engine_worker.compute import BatchRun, ForwardOutcome, GenerateOutcome, run_batch
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.engine.errors import EngineError
from graylane.engine_worker.engine.protocol import InferenceEngine
from graylane.engine_worker.requests import (
    Limits,
    Reject,
    RejectCode,
    RequestFacts,
    TaskKind,
    WorkItem,
    prepare,
)
from graylane.engine_worker.tasks import PostProcess
from graylane.errors import SerdeError, TensorError, require_started
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.admin import ensure_topics
from graylane.kafka.compacted import CompactedFollower
from graylane.kafka.delivery import deliver_and_commit
from graylane.kafka.factory import ConsumerOptions, KafkaFactory
from graylane.kafka.replies import Rejection, ReplySink
from graylane.metrics import WorkerMetrics, serve_metrics
from graylane.v1 import control_pb2, inference_pb2, telemetry_pb2

log = logging.getLogger(__name__)

_POST = {
    inference_pb2.POST_PROCESS_NONE: PostProcess.NONE,
    inference_pb2.ARGMAX_LAST: PostProcess.ARGMAX_LAST,
    inference_pb2.TOPK_LAST: PostProcess.TOPK_LAST,
    inference_pb2.MEAN_POOL: PostProcess.MEAN_POOL,
}
_TASK = {inference_pb2.FORWARD: TaskKind.FORWARD, inference_pb2.GENERATE: TaskKind.GENERATE}


@dataclass
class _Pending:
    """A fetched record and what became of it so far."""

    record: ConsumerRecord[bytes, bytes]
    request: inference_pb2.InferenceRequest | None = None
    item: WorkItem | None = None


class LoadMeter:
    """Busy share of the engine over a sliding few seconds (the device load signal)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self._window_s = window_s
        self._start = time.monotonic()
        self._busy = 0.0
        self._last = 0.0

    def add(self, busy_s: float) -> float:
        now = time.monotonic()
        self._busy += busy_s
        elapsed = now - self._start
        self._last = min(1.0, self._busy / elapsed) if elapsed > 0 else 0.0
        if elapsed > self._window_s:
            self._start, self._busy = now, 0.0
        return self._last


class Worker:
    def __init__(
        self,
        factory: KafkaFactory,
        config: WorkerConfig,
        engines: Mapping[str, InferenceEngine],
    ) -> None:
        if config.initial_variant not in engines:
            raise ValueError(
                f"initial variant {config.initial_variant!r} is not loaded "
                f"(loaded: {sorted(engines)})"
            )
        self.factory = factory
        self.layout = factory.layout
        self.config = config
        self.engines = dict(engines)
        self.active_variant = config.initial_variant
        self.precision_epoch = 0
        self.policy = BucketPolicy(buckets=config.buckets, max_batch_size=config.max_batch_size)
        self.limits = Limits(
            max_seq_len=min(config.max_seq_len, self.policy.max_seq_len),
            max_new_tokens=config.max_new_tokens,
        )
        self.registry = CollectorRegistry()
        self.metrics = WorkerMetrics.create(self.registry)
        self.ready = asyncio.Event()
        self.served = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._producer: AIOKafkaProducer | None = None
        self._precision = CompactedFollower(
            factory,
            self.layout.precision(),
            self._apply_precision_record,
            client_suffix="worker-precision",
        )
        self._load = LoadMeter()
        self._rng = random.Random(config.faults.seed)

    # -- warm-up ---------------------------------------------------------------
    def warm_up(self) -> int:
        """Run every loaded variant once per bucket before joining the group."""
        runs = 0
        for engine in self.engines.values():
            if not self._is_token_model(engine):
                continue
            for bucket in self.policy.buckets:
                if bucket > self.limits.max_seq_len:
                    break
                item = WorkItem(
                    index=0,
                    task=TaskKind.FORWARD,
                    seq_len=bucket,
                    feeds=self._token_feeds(engine, bucket),
                )
                run_batch(engine, [item], self.policy, self.limits.max_seq_len)
                runs += 1
        return runs

    @staticmethod
    def _is_token_model(engine: InferenceEngine) -> bool:
        from graylane.engine_worker.tasks import token_layout

        return token_layout(engine.io) is not None

    @staticmethod
    def _token_feeds(engine: InferenceEngine, n: int) -> dict[str, np.ndarray]:
        feeds: dict[str, np.ndarray] = {}
        for spec in engine.io.inputs:
            feeds[spec.name] = np.ones((1, n), dtype=spec.dtype)
        return feeds

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

    # -- requests --------------------------------------------------------------
    def _facts(self, request: inference_pb2.InferenceRequest) -> RequestFacts | Reject:
        task = _TASK.get(request.task, TaskKind.FORWARD if request.task == 0 else None)
        if task is None:
            return Reject(RejectCode.UNSUPPORTED_TASK, f"task {request.task} is not supported")
        try:
            inputs = tensors.from_tensors(request.inputs)
        except TensorError as exc:
            code = RejectCode.BAD_DTYPE if "dtype" in str(exc) else RejectCode.BAD_SHAPE
            return Reject(code, str(exc))
        gen = request.generation
        return RequestFacts(
            task=task,
            inputs=inputs,
            token_ids=tuple(request.token_ids),
            prompt=request.prompt or None,
            post=_POST.get(request.post_process, PostProcess.NONE),
            top_k=request.top_k,
            max_new_tokens=gen.max_new_tokens,
            eos_id=int(gen.eos_token_id) if gen.has_eos else None,
            deadline_unix_ms=request.deadline_unix_ms,
        )

    def _triage(self, pending: _Pending, index: int) -> Rejection | None:
        record = pending.record
        request = serde.decode(inference_pb2.InferenceRequest, record.value)
        pending.request = request
        if not request.request_id:
            raise SerdeError("request has no request_id; cannot reply")
        if request.model != self.config.model:
            return Rejection(
                inference_pb2.UNKNOWN_MODEL,
                f"model {request.model!r} arrived at the worker of {self.config.model!r}",
            )
        if len(record.value or b"") > self.factory.settings.max_request_bytes:
            return Rejection(
                inference_pb2.PAYLOAD_TOO_LARGE,
                f"request is {len(record.value or b'')} bytes; the limit is "
                f"{self.factory.settings.max_request_bytes}",
            )
        facts = self._facts(request)
        engine = self.engines[self.active_variant]
        prepared = (
            facts
            if isinstance(facts, Reject)
            else prepare(index, facts, engine.io, self.limits, now_ms())
        )
        if isinstance(prepared, Reject):
            code = cast(
                "inference_pb2.ErrorCode", inference_pb2.ErrorCode.Value(prepared.code.value)
            )
            return Rejection(code, prepared.message)
        pending.item = prepared
        return None

    def _result(
        self,
        request: inference_pb2.InferenceRequest,
        outcome: ForwardOutcome | GenerateOutcome,
        variant: str,
        dequeued: int,
        run: BatchRun,
        batch_size: int,
    ) -> inference_pb2.InferenceResult:
        done = now_ms()
        result = inference_pb2.InferenceResult(
            request_id=request.request_id,
            model=request.model,
            version=self.config.version,
            variant=variant,
            status=inference_pb2.OK,
            shadow=request.shadow,
            worker_id=self.config.worker_id,
            routing_key=request.routing_key,
            task=request.task or inference_pb2.FORWARD,
            timing=self._timing(request, dequeued, done, run.compute_ms, batch_size),
        )
        if isinstance(outcome, ForwardOutcome):
            result.outputs.extend(tensors.to_tensors(outcome.outputs))
        else:
            tokens = outcome.result.tokens
            result.generated_token_ids.extend(tokens)
            result.text = bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", "replace")
        return result

    @staticmethod
    def _timing(
        request: inference_pb2.InferenceRequest,
        dequeued: int,
        done: int,
        compute_ms: float,
        batch_size: int,
    ) -> inference_pb2.Timing:
        created = request.created_at_unix_ms or request.routed_at_unix_ms or dequeued
        queued_since = request.routed_at_unix_ms or created
        return inference_pb2.Timing(
            created_at_unix_ms=created,
            routed_at_unix_ms=request.routed_at_unix_ms,
            dequeued_at_unix_ms=dequeued,
            completed_at_unix_ms=done,
            queue_wait_ms=float(max(0, dequeued - queued_since)),
            compute_ms=compute_ms,
            total_ms=float(max(0, done - created)),
            batch_size=batch_size,
        )

    async def _collect(self, consumer: AIOKafkaConsumer) -> list[ConsumerRecord[bytes, bytes]]:
        """Fetch up to max_batch_size*fetch_factor records, waiting at most max_wait_ms
        after the first one for a batch to fill."""
        cap = self.config.max_batch_size * self.config.fetch_factor
        first = await consumer.getmany(timeout_ms=200, max_records=cap)
        records = [r for rs in first.values() for r in rs]
        if not records:
            return records
        deadline = time.monotonic() + self.config.max_wait_ms / 1000.0
        while len(records) < self.config.max_batch_size:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            more = await consumer.getmany(timeout_ms=left_ms, max_records=cap - len(records))
            records.extend(r for rs in more.values() for r in rs)
        return records

    async def _process(
        self, records: list[ConsumerRecord[bytes, bytes]], sink: ReplySink
    ) -> list[Awaitable[object]]:
        producer = require_started(self._producer)
        dequeued = now_ms()
        futures: list[Awaitable[object]] = []
        pending = [_Pending(r) for r in records]
        variant = self.active_variant
        labels = (self.config.model, self.config.version, variant)
        for i, p in enumerate(pending):
            try:
                rejection = self._triage(p, i)
            except SerdeError as exc:
                self.metrics.errors.labels(*labels, "DECODE_ERROR").inc()
                futures.append(
                    await sink.dead_letter(p.record, inference_pb2.DECODE_ERROR, str(exc))
                )
                continue
            if rejection is not None and p.request is not None:
                self.metrics.errors.labels(
                    *labels, inference_pb2.ErrorCode.Name(rejection.code)
                ).inc()
                futures.append(
                    await sink.error_result(
                        p.request,
                        rejection,
                        p.record,
                        version=self.config.version,
                        variant=variant,
                        worker_id=self.config.worker_id,
                    )
                )
        items = [p.item for p in pending if p.item is not None]
        engine = self.engines[variant]
        loop = asyncio.get_running_loop()
        for planned in self.policy.plan_batches(items):
            batch_items = list(planned.items)
            started_ms = now_ms()
            failure: Rejection | None
            try:
                run = await loop.run_in_executor(
                    self._executor,
                    run_batch,
                    engine,
                    batch_items,
                    self.policy,
                    self.limits.max_seq_len,
                )
                await self._inject_latency(run.compute_ms)
            except EngineError as exc:
                log.exception("engine failure on a batch of %d", len(batch_items))
                run = BatchRun({}, 0.0, 0)
                failure = Rejection(inference_pb2.ENGINE_FAILURE, f"engine failed: {exc}")
            else:
                failure = None
            device_load = self._load.add(run.compute_ms / 1000.0)
            latency = LatencyHistogram()
            queue_wait = LatencyHistogram()
            errors = 0
            error_codes: dict[str, int] = {}
            shadow_count = 0
            for item in batch_items:
                p = pending[item.index]
                request = p.request
                if request is None:
                    continue
                shadow_count += int(request.shadow)
                outcome = run.outcomes.get(item.index)
                rejection = failure
                if rejection is None and self._inject_error():
                    rejection = Rejection(
                        inference_pb2.INJECTED_FAULT, "fault injected for testing"
                    )
                if rejection is not None or outcome is None:
                    rejection = rejection or Rejection(inference_pb2.INTERNAL, "no outcome")
                    errors += 1
                    name = inference_pb2.ErrorCode.Name(rejection.code)
                    error_codes[name] = error_codes.get(name, 0) + 1
                    self.metrics.errors.labels(*labels, name).inc()
                    futures.append(
                        await sink.error_result(
                            request,
                            rejection,
                            p.record,
                            version=self.config.version,
                            variant=variant,
                            worker_id=self.config.worker_id,
                        )
                    )
                    timing_total = float(
                        max(0, now_ms() - (request.created_at_unix_ms or dequeued))
                    )
                    latency.record(max(timing_total, 0.001))
                    continue
                result = self._result(request, outcome, variant, dequeued, run, len(batch_items))
                latency.record(max(result.timing.total_ms, 0.001))
                queue_wait.record(max(result.timing.queue_wait_ms, 0.001))
                self.metrics.queue_wait_ms.labels(*labels).observe(result.timing.queue_wait_ms)
                payload = serde.encode(result)
                key = request.request_id.encode("utf-8")
                if request.shadow:
                    futures.append(
                        await producer.send(self.layout.shadow(request.model), payload, key=key)
                    )
                    continue
                topic = sink.reply_topic(request)
                if not await sink.topic_exists(topic):
                    futures.append(
                        await sink.dead_letter(
                            p.record,
                            inference_pb2.BAD_REQUEST,
                            f"reply topic {topic!r} does not exist",
                        )
                    )
                    continue
                futures.append(await producer.send(topic, payload, key=key))
                if request.mirror_result:
                    futures.append(
                        await producer.send(self.layout.shadow(request.model), payload, key=key)
                    )
            served = len(batch_items) - errors
            self.served += served
            self.metrics.requests.labels(*labels).inc(served)
            self.metrics.batch_size.labels(*labels).observe(len(batch_items))
            self.metrics.compute_ms.labels(*labels).observe(run.compute_ms)
            telemetry = telemetry_pb2.BatchTelemetry(
                model=self.config.model,
                version=self.config.version,
                variant=variant,
                worker_id=self.config.worker_id,
                batch_size=len(batch_items),
                request_count=len(batch_items),
                error_count=errors,
                latency=histogram_to_pb(latency),
                queue_wait=histogram_to_pb(queue_wait),
                queue_wait_ms_mean=queue_wait.mean_ms if queue_wait.count else 0.0,
                compute_ms=run.compute_ms,
                device_load=device_load,
                started_at_unix_ms=started_ms,
                completed_at_unix_ms=now_ms(),
                shadow_count=shadow_count,
                error_codes=error_codes,
                sequence_bucket=planned.bucket_len,
                task=batch_items[0].task.value,
            )
            futures.append(
                await producer.send(
                    self.layout.telemetry(),
                    serde.encode(telemetry),
                    key=f"{self.config.model}/{self.config.version}".encode(),
                )
            )
        return futures

    async def _inject_latency(self, compute_ms: float) -> None:
        faults = self.config.faults
        extra = faults.extra_latency_ms + compute_ms * max(0.0, faults.latency_factor - 1.0)
        if faults.latency_jitter_ms > 0:
            extra += self._rng.uniform(0.0, faults.latency_jitter_ms)
        if extra > 0:
            # Blocks the engine thread like a slow engine would, not just this request.
            await asyncio.get_running_loop().run_in_executor(
                self._executor, time.sleep, extra / 1000.0
            )

    def _inject_error(self) -> bool:
        rate = self.config.faults.error_rate
        return rate > 0 and self._rng.random() < rate

    # -- lifecycle -------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        layout = self.layout
        await ensure_topics(
            self.factory, layout.shared_specs() + layout.model_specs(cfg.model, [cfg.version])
        )
        loop = asyncio.get_running_loop()
        warmed = await loop.run_in_executor(self._executor, self.warm_up)
        log.info("warmed %d variant x bucket shapes", warmed)
        serve_metrics(self.registry, cfg.metrics_port)
        self.metrics.active_variant.labels(cfg.model, cfg.version, self.active_variant).set(1)
        await self._precision.catch_up()
        self._producer = self.factory.producer(client_suffix="worker")
        await self._producer.start()
        sink = ReplySink(self._producer, layout, f"worker:{cfg.model}/{cfg.version}")
        group = (
            cfg.group_id or f"{self.factory.settings.topic_prefix}-worker-{cfg.model}-{cfg.version}"
        )
        consumer = self.factory.consumer(
            layout.version_requests(cfg.model, cfg.version),
            options=ConsumerOptions(
                group_id=group,
                max_poll_records=cfg.max_batch_size * cfg.fetch_factor,
                fetch_max_wait_ms=max(1, cfg.max_wait_ms),
            ),
            client_suffix="worker",
        )
        await consumer.start()
        watcher = asyncio.create_task(self._precision.follow(stop))
        self.ready.set()
        log.info(
            "worker %s serving %s/%s with %s",
            cfg.worker_id,
            cfg.model,
            cfg.version,
            self.active_variant,
        )
        try:
            while not stop.is_set():
                records = await self._collect(consumer)
                if not records:
                    continue
                await deliver_and_commit(
                    consumer, records, functools.partial(self._process, records, sink)
                )
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await consumer.stop()
            await self._producer.stop()
            await self._precision.stop()
            self._executor.shutdown(wait=False)
