"""The worker's delivery step: one batch's answers and telemetry onto Kafka.

A thin adapter over the producer and :class:`~graylane.kafka.replies.ReplySink`:
results go to the reply topic (or the shadow topic), failures become error
results or dead letters, and each batch ends with its telemetry record. Every
send returns the future the fetch cycle waits on before it commits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord

from graylane import serde
from graylane.clock import now_ms
from graylane.engine_worker.admission import Shed
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.observe import WorkerObserver
from graylane.engine_worker.requests import WorkItem
from graylane.engine_worker.results import BatchReport
from graylane.kafka.replies import Rejection, ReplySink, max_payload_bytes
from graylane.kafka.seam import Producer
from graylane.settings import Settings
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2, telemetry_pb2

Records = Sequence[ConsumerRecord[bytes, bytes]]


@dataclass(frozen=True, kw_only=True)
class DeliveryStep:
    """Sends what one worker answers: results, error results, shadow copies, telemetry."""

    config: WorkerConfig
    layout: TopicLayout
    settings: Settings
    observer: WorkerObserver

    async def deliver(
        self, report: BatchReport, records: Records, sink: ReplySink, producer: Producer
    ) -> list[Awaitable[object]]:
        """Send the batch's answers (results, error results, shadow copies), then telemetry."""
        futures: list[Awaitable[object]] = []
        limit = max_payload_bytes(self.settings)
        for answer in report.answers:
            request, record = answer.request, records[answer.index]
            payload = b"" if answer.result is None else serde.encode(answer.result)
            rejection = answer.rejection
            if len(payload) > limit:
                self.observer.count_error(report.telemetry.variant, "RESULT_TOO_LARGE")
                rejection = Rejection(
                    inference_pb2.RESULT_TOO_LARGE,
                    f"result is {len(payload)} bytes; the broker accepts {limit}",
                )
            if answer.result is None or rejection is not None:
                rejection = rejection or Rejection(inference_pb2.INTERNAL, "no outcome")
                futures.append(
                    await self.error_result(
                        sink, request, rejection, record, report.telemetry.variant
                    )
                )
                continue
            key = request.request_id.encode("utf-8")
            shadow_topic = self.layout.shadow(request.model)
            if request.shadow:
                futures.append(await producer.send(shadow_topic, payload, key=key))
                continue
            topic = sink.reply_topic(request)
            if not await sink.topic_exists(topic):
                reason = f"reply topic {topic!r} does not exist"
                futures.append(await sink.dead_letter(record, inference_pb2.BAD_REQUEST, reason))
                continue
            futures.append(await producer.send(topic, payload, key=key))
            if request.mirror_result:
                futures.append(await producer.send(shadow_topic, payload, key=key))
        futures.append(await self._send_telemetry(producer, report.telemetry))
        return futures

    async def error_result(
        self,
        sink: ReplySink,
        request: inference_pb2.InferenceRequest,
        rejection: Rejection,
        record: ConsumerRecord[bytes, bytes],
        variant: str,
    ) -> Awaitable[object]:
        """An error result for ``request``, stamped with this worker's version and id."""
        return await sink.error_result(
            request,
            rejection,
            record,
            version=self.config.version,
            variant=variant,
            worker_id=self.config.worker_id,
        )

    async def sheds(
        self,
        shed: Sequence[Shed[WorkItem]],
        records: Records,
        requests: Mapping[int, inference_pb2.InferenceRequest],
        sink: ReplySink,
        variant: str,
    ) -> list[Awaitable[object]]:
        """A ``SHED`` error result for each request admission refused, counted."""
        futures: list[Awaitable[object]] = []
        for one in shed:
            self.observer.metrics.shed.labels(
                self.config.model, self.config.version, variant, "deadline"
            ).inc()
            rejection = Rejection(inference_pb2.SHED, one.reason)
            record = records[one.item.index]
            request = requests[one.item.index]
            futures.append(await self.error_result(sink, request, rejection, record, variant))
        return futures

    async def shed_telemetry(
        self, producer: Producer, variant: str, shed_count: int
    ) -> Awaitable[object]:
        """A telemetry record of sheds alone (no request ran): the load is still seen."""
        telemetry = telemetry_pb2.BatchTelemetry(
            model=self.config.model,
            version=self.config.version,
            variant=variant,
            worker_id=self.config.worker_id,
            completed_at_unix_ms=now_ms(),
            shed_count=shed_count,
        )
        return await self._send_telemetry(producer, telemetry)

    async def _send_telemetry(
        self, producer: Producer, telemetry: telemetry_pb2.BatchTelemetry
    ) -> Awaitable[object]:
        key = f"{self.config.model}/{self.config.version}".encode()
        return await producer.send(self.layout.telemetry(), serde.encode(telemetry), key=key)
