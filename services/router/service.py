"""The router: ingress topic -> per-version topics, by the latest routing table.

Room: ``service.py`` of the router: its lifecycle and the hooks of the library's
:class:`~graylane.kafka.consume_loop.ConsumeLoop`; ingress offsets are committed only
after every forward (and every error reply) of a batch is acknowledged, so a crash
re-routes rather than loses requests. What it owns is in
:mod:`~graylane.services.router.state` (the newest table per model), what it refuses in
:mod:`~graylane.services.router.logic`, its protobuf in
:mod:`~graylane.services.router.wire`; the routing decision is the library's pure
:func:`graylane.routing.route`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from graylane import tracing
from graylane.clock import now_ms
from graylane.errors import ErrorCode, Rejection, SerdeError, clip, require_started
from graylane.kafka.admin import MessageLimits
from graylane.kafka.consume_loop import ConsumeLoop, LoopHooks
from graylane.kafka.delivery import settle
from graylane.kafka.reading import CompactedFollower
from graylane.kafka.replies import FieldCaps, ReplySink
from graylane.kafka.seam import (
    BatchConsumer,
    ClientFactory,
    ConsumerOptions,
    Producer,
    Record,
    known_topics,
)
from graylane.metrics.dataplane import RouterMetrics
from graylane.metrics.process import CONTROL_CAUGHT_UP, ServiceObservability
from graylane.routing.table import (
    RouteDecision,
    RouteTable,
    UnknownPinnedVersion,
    route,
    route_without_table,
    table_problem,
)
from graylane.services.router import wire
from graylane.services.router.logic.intake import refusal
from graylane.services.router.state import TableStore
from graylane.supervision import BackgroundTasks
from graylane.v1 import inference_pb2

log = logging.getLogger(__name__)

UNKNOWN_MODEL_LABEL = "unknown"
"""The ``model`` label of a request for a model this router does not serve."""


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    """Models this router serves, each with its configured stable version."""

    stable_versions: dict[str, str]
    group_id: str = ""
    max_poll_records: int = 500
    metrics_port: int | None = None
    """Overrides ``GRAYLANE_METRICS_PORT`` (0 = a free port, below 0 = off)."""
    max_in_flight: int = 8
    """Fetched batches whose forwards may be unacknowledged at once (committed in order):
    the next batch is routed while the broker acknowledges the previous one."""


class Router:
    def __init__(self, factory: ClientFactory, config: RouterConfig) -> None:
        self.factory = factory
        self.layout = factory.layout
        self.config = config
        self.tables = TableStore()
        self.observability = ServiceObservability("router")
        self.registry = self.observability.registry
        self.metrics = RouterMetrics.create(self.registry)
        self.ready = asyncio.Event()
        self._producer: Producer | None = None
        self._pending: dict[str, tuple[RouteTable, Record]] = {}
        """Newest table per model not yet checked against the cluster's topics."""
        self._refused: list[tuple[Record, ErrorCode, str]] = []
        """Refused table records, dead-lettered (with the reason) at the next settle."""
        self._tables = CompactedFollower(
            factory, self.layout.routing(), self._apply_table_record, client_suffix="router-tables"
        )
        self._limits = MessageLimits.of_factory(factory, ceiling=factory.settings.max_message_bytes)
        """How large a forward, an error reply or a dead letter each topic accepts."""

    # -- routing tables --------------------------------------------------------
    def _apply_table_record(self, record: Record) -> None:
        if record.value is None:
            return
        try:
            table = wire.table_of(record.value)
        except Exception as exc:  # any table this build cannot read is refused, never fatal
            log.error("ignoring a bad routing table at offset %d: %s", record.offset, exc)
            self.metrics.errors.labels("", ErrorCode.BAD_ROUTING_TABLE.name).inc()
            self._refused.append((record, ErrorCode.BAD_ROUTING_TABLE, f"undecodable: {exc}"))
            return
        if table.model not in self.config.stable_versions:
            return
        problem = table_problem(table)
        if problem is not None:
            self._refuse_table(table, record, problem)
            return
        pending = self._pending.get(table.model)
        if pending is None or table.epoch > pending[0].epoch:
            self._pending[table.model] = (table, record)

    async def settle_tables(self) -> None:
        """Apply pending tables whose version topics all exist; refuse the others.

        A refused table leaves the model on its previous table (or its stable
        version), so one bad table never stalls routing, for it or any model.
        """
        if self._producer is None:
            return
        if self._pending:
            known = await known_topics(self._producer)
            pending, self._pending = self._pending, {}
            for table, record in pending.values():
                topics = {self.layout.version_requests(table.model, v) for v in table.versions()}
                missing = sorted(topics - known)
                if missing:
                    self._refuse_table(table, record, f"topic(s) {', '.join(missing)} do not exist")
                elif self.tables.offer(table):
                    self.metrics.table_applied(table.model, table.epoch, _weights(table))
                    log.info("routing table %s epoch %d applied", table.model, table.epoch)
        await self._dead_letter_refused()

    async def _dead_letter_refused(self) -> None:
        """The audit trail of refused tables: their bytes and reason in ``<p>.dlq``."""
        if not self._refused or self._producer is None:
            return
        refused, self._refused = self._refused, []
        sink = ReplySink(self._producer, self.layout, "router", limits=self._limits)
        try:
            await settle([await sink.dead_letter(r, code, why) for r, code, why in refused])
        except Exception:  # the metric and the log have it; never stall routing for this
            log.exception("could not dead-letter %d refused routing table(s)", len(refused))

    def _refuse_table(self, table: RouteTable, record: Record, why: str) -> None:
        self.metrics.errors.labels(clip(table.model, 64), "BAD_ROUTING_TABLE").inc()
        self._refused.append(
            (
                record,
                ErrorCode.BAD_ROUTING_TABLE,
                f"routing table {clip(table.model, 64)} epoch {table.epoch} refused, "
                f"keeping the previous one: {why}",
            )
        )
        log.error(
            "routing table %s epoch %d refused, keeping the previous one: %s",
            clip(table.model, 64),
            table.epoch,
            why,
        )

    async def _settle_tables_safely(self) -> None:
        try:
            await self.settle_tables()
        except Exception:  # metadata trouble: tables stay pending for the next turn
            log.exception("could not check routing tables against the cluster's topics")

    # -- requests --------------------------------------------------------------
    def decide(self, request: inference_pb2.InferenceRequest) -> RouteDecision:
        facts = wire.routing_request(request)
        table = self.tables.tables.get(request.model)
        if table is None:
            return route_without_table(
                request.model, self.config.stable_versions[request.model], facts
            )
        return route(table, facts)

    async def _handle(self, record: Record, sink: ReplySink) -> list[Awaitable[object]]:
        producer = require_started(self._producer)
        topic_model = self._topic_model(record)
        try:
            request = wire.decode_request(record.value)
        except SerdeError as exc:
            self.metrics.errors.labels(topic_model, ErrorCode.DECODE_ERROR.name).inc()
            return [await sink.dead_letter(record, ErrorCode.DECODE_ERROR, str(exc))]
        if not request.request_id or len(request.request_id) > FieldCaps().request_id:
            self.metrics.errors.labels(topic_model, ErrorCode.BAD_REQUEST.name).inc()
            why = "no request_id" if not request.request_id else "an oversized request_id"
            return [
                await sink.dead_letter(
                    record, ErrorCode.BAD_REQUEST, f"request has {why}; cannot reply"
                )
            ]
        wire.reset_router_fields(request, record)
        if not request.model:
            request.model = topic_model
        rejection = self._reject(request, record, topic_model)
        if rejection is not None:
            self.metrics.errors.labels(self._model_label(request.model), rejection.code.name).inc()
            if rejection.code == ErrorCode.DEADLINE_EXCEEDED:
                self.metrics.shed.labels(self._model_label(request.model), "deadline").inc()
            if request.model not in self.config.stable_versions:
                request.model = topic_model  # reply on the topic's model results topic
            return [await sink.error_result(request, rejection, record)]
        try:
            decision = self.decide(request)
        except UnknownPinnedVersion as exc:
            self.metrics.errors.labels(request.model, ErrorCode.UNKNOWN_VERSION.name).inc()
            return [
                await sink.error_result(
                    request, Rejection(ErrorCode.UNKNOWN_VERSION, str(exc)), record
                )
            ]
        key = (request.routing_key or request.request_id).encode("utf-8")
        forwards = wire.forwards(request, decision, record, self.layout)
        for topic, value in forwards:  # routing fields enlarge a request: it may not fit
            too_large = await sink.oversized(topic, value, key)
            if too_large is not None:
                self.metrics.errors.labels(request.model, ErrorCode.PAYLOAD_TOO_LARGE.name).inc()
                why = f"request cannot be forwarded: {too_large}"
                return [
                    await sink.error_result(
                        request, Rejection(ErrorCode.PAYLOAD_TOO_LARGE, why), record
                    )
                ]
        tracing.annotate(
            {
                "graylane.model": request.model,
                "graylane.version": decision.version,
                "graylane.route_reason": decision.reason.value,
                "graylane.shadow_version": decision.shadow_version or "",
            }
        )
        headers = tracing.forward_headers(record.headers)  # the shadow copy's worker links
        futures: list[Awaitable[object]] = [
            await producer.send(topic, value, key=key, headers=headers) for topic, value in forwards
        ]
        if decision.shadow_version:
            self.metrics.shadow_copies.labels(request.model, decision.shadow_version).inc()
        self.metrics.routed.labels(request.model, decision.version, decision.reason.value).inc()
        return futures

    async def _note_assignment(self, ingress: BatchConsumer) -> None:
        self.observability.note_assignment(ingress.assignment())

    async def _route_all(self, records: list[Record], sink: ReplySink) -> list[Awaitable[object]]:
        futures: list[Awaitable[object]] = []
        for record in records:
            try:
                with tracing.consumed("graylane.router route", record.headers):
                    futures.extend(await self._handle(record, sink))
            except Exception as exc:  # one record never ends the loop
                log.exception(
                    "unexpected error routing %s[%d]@%d",
                    record.topic,
                    record.partition,
                    record.offset,
                )
                self.metrics.errors.labels(
                    self._model_label(self._topic_model(record)), ErrorCode.INTERNAL.name
                ).inc()
                reason = f"internal error: {type(exc).__name__}"
                futures.append(await sink.dead_letter(record, ErrorCode.INTERNAL, reason))
        return futures

    def _topic_model(self, record: Record) -> str:
        """The model whose ingress topic ``record`` came from."""
        topic: str = record.topic
        return topic[len(self.layout.ingress("x")) - 1 :]

    def _model_label(self, model: str) -> str:
        """``model`` if this router serves it, else ``"unknown"``: a metric label never
        takes a value a client chose."""
        return model if model in self.config.stable_versions else UNKNOWN_MODEL_LABEL

    def _reject(
        self,
        request: inference_pb2.InferenceRequest,
        record: Record,
        topic_model: str,
    ) -> Rejection | None:
        return refusal(
            wire.ingress_facts(request, record, self.layout, topic_model),
            limit_bytes=self.factory.settings.max_request_bytes,
            served=self.config.stable_versions,
            now_ms=now_ms(),
        )

    # -- lifecycle -------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        layout = self.layout
        specs = layout.shared_specs()
        for model, stable in self.config.stable_versions.items():
            specs += layout.model_specs(model, [stable])
        await self.factory.ensure_topics(specs)
        settings = self.factory.settings
        self.observability.start(
            settings.metrics_address(self.config.metrics_port), settings.build_labels()
        )
        await self._tables.catch_up()
        for model, stable in self.config.stable_versions.items():
            if model not in self.tables.tables:  # no table yet: all traffic to the stable version
                self.metrics.no_table(model, stable)
        self.observability.mark(CONTROL_CAUGHT_UP)
        self._producer = self.factory.producer(client_suffix="router")
        await self._producer.start()
        await self._limits.load(s.name for s in specs)
        sink = ReplySink(self._producer, layout, "router", limits=self._limits)
        group = self.config.group_id or f"{self.factory.settings.topic_prefix}-router"
        loop = ConsumeLoop(  # rebalances, outages: not fatal
            "router",
            self.factory,
            [layout.ingress(m) for m in self.config.stable_versions],
            ConsumerOptions(
                group_id=group, max_poll_records=self.config.max_poll_records, fetch_max_wait_ms=20
            ),
            role="router",
            client_suffix="router",
            registry=self.registry,
            max_in_flight=self.config.max_in_flight,
        )
        loop.guard.on_fault(sink.forget)
        await loop.start()
        await self.settle_tables()
        background = BackgroundTasks()
        background.spawn(self._tables.follow(stop), name="router-table-follower")
        self.ready.set()
        log.info("router serving %s", sorted(self.config.stable_versions))
        hooks = LoopHooks(
            before_fetch=self._settle_tables_safely,
            handle=functools.partial(self._route_all, sink=sink),
            after_turn=self._note_assignment,
            dead_letter=sink.dead_letter,
        )
        try:
            await loop.run(stop, hooks, healthy=lambda: background.healthy)
        finally:
            await background.close()
            await loop.stop()
            await self._producer.stop()
            await self._tables.stop()
            self.observability.close()
        background.raise_if_failed()  # crash-only: a dead table follower ends the router


def _weights(table: RouteTable) -> dict[str, float]:
    """Share of traffic (0..1) per version in an applied table."""
    return {r.version: r.weight_percent / 100.0 for r in table.routes}
