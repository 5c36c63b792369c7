"""The API gateway: OpenAI-compatible and Open Inference Protocol v2 over HTTP, in front of
the Kafka path.

A stateless FastAPI app served by uvicorn. Each call becomes an ``InferenceRequest``
on its model's ingress topic, sent by one :class:`~graylane.client.GraylaneClient`
per replica, and is answered from the replica's own reply topic
(``<p>.reply.gateway-<replica>-<128 random bits>``: no producer can guess it, and only
the gateway role may read the ``gateway-`` reply topics), matched by
request id. Any number of replicas can run; a replica that dies loses no
acknowledged request (it is in Kafka and is served), only its callers' connections.

- ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream: true``: server-sent
  events in OpenAI's chunk format, ending with ``data: [DONE]``), ``GET /v1/models``;
  the ``user`` field or an ``x-graylane-routing-key`` header is the sticky routing key,
  ``x-graylane-tag-<name>: <value>`` headers are request tags (tag rules). A caller that
  goes away cancels its generation.
- ``POST /v1/feedback``: a rating (thumbs or a score) of an answer this tenant was given,
  on ``<p>.outcomes`` for the policy engine's A/B test
  (:mod:`~graylane.services.gateway.feedback`).
- ``GET /v2``, ``/v2/health/live|ready``, ``/v2/models/{name}[/versions/{v}]`` (metadata),
  ``.../ready``, ``POST .../infer`` (JSON tensors or the binary-data extension) as a
  ``FORWARD``; a version in the path is a pin, which the router honours only where the
  routing table allows pins (the answer's ``model_version`` is the version that served).
- Admission (:mod:`~graylane.services.gateway.logic.admission`): bearer keys per tenant, a
  token bucket per key (429; both checked by a front door from the headers alone, before
  the app routes or reads anything of the call, so a storm of refused calls costs each a
  quarter of what the app would spend), then a place in the in-flight gate, per priority and per
  tenant (503), taken before the body is read; body bytes held while reading are
  budgeted per tenant and per replica (503), bodies are decoded within a depth and a
  size bound (:mod:`~graylane.services.gateway.logic.json_body`) and only the checked
  call is kept. A priority header (one the key allows; the request's ``priority`` tag;
  sheddable calls are refused first when the replica is full), tag headers (the ones
  the key allows) and the key's tenant as the reserved ``tenant`` tag. Every 429/503
  carries ``Retry-After``. Chat templates render off the event loop, with a time limit.
- Failures inside the system are answered with a generic message; what went wrong is
  logged with the call's request id, never sent to the caller.
- Answers name the version and variant that served them (``x-graylane-version``,
  ``x-graylane-variant``; OpenAI's ``system_fingerprint`` is ``graylane:<version>``).
- ``/metrics``, ``/healthz``, ``/readyz`` on the API port (ready = the producer and the
  reply-topic reader are up), and on the service's metrics port like every service;
  ``GET /health`` and ``GET /version``, the probes clients of vLLM-compatible servers
  send before they start (``/health`` needs no key, like theirs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from graylane import tracing
from graylane.asgi_server import listening_socket, serve_asgi
from graylane.client import (
    Chunk,
    GraylaneClient,
    InferenceTimeout,
    RequestRejected,
    Result,
    Task,
    UnknownModel,
)
from graylane.errors import ErrorCode, is_retriable
from graylane.kafka.replies import FieldCaps
from graylane.kafka.seam import ClientFactory
from graylane.metrics.dataplane import GatewayMetrics
from graylane.metrics.process import Readiness, ServiceObservability
from graylane.priority import PRIORITY_TAG, Priority
from graylane.request_tags import RESERVED_TAGS, TENANT_TAG
from graylane.serde import DEFAULT_MAX_ELEMENTS
from graylane.services.gateway import oip
from graylane.services.gateway.catalog import ModelDirectory, SignatureBook
from graylane.services.gateway.chat import CHATML, ChatFormat
from graylane.services.gateway.failures import ApiError, from_error_code
from graylane.services.gateway.feedback import DEFAULT_REMEMBERED_ANSWERS, FeedbackDesk
from graylane.services.gateway.front_door import (
    ADMITTED_AS,
    ROUTES,
    EndpointLabel,
    FrontDoor,
    Handler,
)
from graylane.services.gateway.logic.admission import (
    GateVerdict,
    GatewayLimits,
    KeyRing,
    Tenant,
    parse_priority,
    parse_timeout,
)
from graylane.services.gateway.logic.json_body import read_json
from graylane.services.gateway.state import Admission
from graylane.services.gateway.wire import (
    SSE_DONE,
    ChatDraft,
    Endpoint,
    GenerationCall,
    model_card,
    models_body,
    parse_completion,
    read_chat,
    render_chat,
    response_body,
    sse_event,
    stream_chunk,
    usage_chunk,
)

__all__ = [
    "PRODUCER_UP",
    "REPLIES_UP",
    "ROUTING_KEY_HEADER",
    "TAG_HEADER_PREFIX",
    "Gateway",
    "GatewayConfig",
    "replica_client_id",
]

log = logging.getLogger(__name__)

ROUTING_KEY_HEADER = "x-graylane-routing-key"
TAG_HEADER_PREFIX = "x-graylane-tag-"
PRIORITY_HEADER = "x-graylane-priority"
TIMEOUT_HEADER = "x-graylane-timeout-ms"
VERSION_HEADER = "x-graylane-version"
VARIANT_HEADER = "x-graylane-variant"
REQUEST_ID_HEADER = "x-request-id"

PRODUCER_UP = "producer_up"
REPLIES_UP = "replies_up"


def replica_client_id(replica: str, secret: str | None = None) -> str:
    """The SDK client id (and so the reply topic) of gateway replica ``replica``:
    ``gateway-<replica>-<secret>`` in the characters a client id may use. ``secret``
    (default: 128 random bits, new at each start) makes the name unguessable, so no
    producer can name the gateway's reply topic as its own."""
    cleaned = "".join(c if c.isalnum() else "-" for c in replica.lower())
    parts = [p for p in cleaned.split("-") if p]
    tail = secrets.token_hex(16) if secret is None else secret
    return "-".join(["gateway", *parts])[: 99 - len(tail)].rstrip("-") + "-" + tail


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    """0 picks a free port (:attr:`Gateway.port` has it once started)."""
    replica: str = "0"
    """Names this replica's reply topic; unique per running replica (the pod name)."""
    limits: GatewayLimits = field(default_factory=GatewayLimits)
    template: ChatFormat = CHATML
    """The chat template of models without their own."""
    templates: Mapping[str, ChatFormat] = field(default_factory=dict)
    """Models' own chat templates, by model name (``load_chat_template``)."""
    signatures: Mapping[tuple[str, str], Path] = field(default_factory=dict)
    """ONNX files whose signatures answer model metadata, by (model, version or "")."""
    registry_signatures: bool = False
    """Else read signatures from the registry's manifests."""
    models_ttl_s: float = 30.0
    remembered_answers: int = DEFAULT_REMEMBERED_ANSWERS
    """Answers this replica remembers for ``POST /v1/feedback`` (the oldest forgotten)."""
    metrics_port: int | None = None
    """Overrides ``GRAYLANE_METRICS_PORT`` (0 = a free port, below 0 = off)."""

    def template_for(self, model: str) -> ChatFormat:
        """The chat template of ``model`` (the default if it has none of its own)."""
        return self.templates.get(model, self.template)


class _Slot:
    """A call's place in the in-flight gate, given back exactly once."""

    def __init__(self, gateway: Gateway, tenant: str) -> None:
        self._gateway: Gateway | None = gateway
        self.tenant = tenant

    def release(self) -> None:
        if self._gateway is not None:
            gateway, self._gateway = self._gateway, None
            gateway._leave(self.tenant)


@dataclass
class _Admitted:
    """A call past the edge: who, how urgent, how long it may take, how it routes."""

    tenant: Tenant
    priority: Priority
    timeout_s: float
    deadline_s: float | None
    routing_key: str
    tags: dict[str, str]


class Gateway:
    """One gateway replica: its SDK client, admission state, metrics and HTTP app."""

    def __init__(self, factory: ClientFactory, config: GatewayConfig, keys: KeyRing | None) -> None:
        self.factory = factory
        self.config = config
        self.limits = config.limits
        self.observability = ServiceObservability(
            "gateway", readiness=Readiness((PRODUCER_UP, REPLIES_UP))
        )
        self.metrics = GatewayMetrics.create(self.observability.registry)
        self.client = GraylaneClient(
            factory,
            client_id=replica_client_id(config.replica),
            keep_unclaimed=False,  # nothing here reads them: counted and dropped
            on_unclaimed=self.metrics.unclaimed_replies.inc,
        )
        self._templates = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chat-template")
        self.admission = Admission(config.limits, keys)
        self.directory = ModelDirectory(factory.layout, self._topics, ttl_s=config.models_ttl_s)
        self.signatures = SignatureBook(
            config.signatures,
            factory.settings.db_url if config.registry_signatures else None,
        )
        self.feedback = FeedbackDesk(
            factory,
            self.metrics,
            authorize=self._authorize,
            read_json=self._json,
            unread=self._unread,
            client_id=self.client.client_id,
            capacity=config.remembered_answers,
        )
        self.app = FrontDoor(_build_app(self), self)
        self.ready = asyncio.Event()
        self.port = 0
        self._cancels: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The base URL callers use (once started)."""
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    async def _topics(self) -> set[str]:
        return await self.client.topics()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Start the SDK client (reply reader, producer) and the observability port."""
        settings = self.factory.settings
        self.observability.start(
            settings.metrics_address(self.config.metrics_port), settings.build_labels()
        )
        await self.client.start()
        self.observability.mark(PRODUCER_UP)
        self.observability.mark(REPLIES_UP)

    async def close(self) -> None:
        for task in list(self._cancels):
            with contextlib.suppress(Exception):
                await task
        self._templates.shutdown(wait=False, cancel_futures=True)
        try:
            await self.feedback.close()
            await self.client.close()
        finally:
            self.observability.mark(PRODUCER_UP, False)
            self.observability.mark(REPLIES_UP, False)
            self.observability.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then drain and close."""
        await self.start()
        try:
            await self._serve(stop)
        finally:
            await self.close()

    async def _serve(self, stop: asyncio.Event) -> None:
        sock = listening_socket(self.config.host, self.config.port)
        self.port = int(sock.getsockname()[1])

        def started() -> None:
            self.ready.set()
            log.info(
                "gateway %s on http://%s:%d (reply topic %s)",
                self.config.replica,
                self.config.host,
                self.port,
                self.client.reply_topic,
            )

        await serve_asgi(
            self.app, sock, stop, name="gateway-http", on_started=started, graceful_shutdown_s=5
        )

    # -- the edge ----------------------------------------------------------------------
    def _authorize(self, request: Request) -> Tenant:
        """The call's tenant: the one the front door admitted it as
        (:class:`~graylane.services.gateway.front_door.FrontDoor`), or, for a call that did
        not come through it, identified and throttled here."""
        admitted = request.scope.get("state", {}).get(ADMITTED_AS)
        if isinstance(admitted, Tenant):
            return admitted
        return self.admit_key(request.headers.get("authorization"))

    def admit_key(self, authorization: str | None) -> Tenant:
        """The tenant of a bearer key that may call now: 401 for an unknown key, 429 past
        the key's token bucket (a token is taken)."""
        found = self.admission.identify(authorization)
        if found is None:
            self.metrics.refused.labels("auth").inc()
            raise ApiError.unauthenticated()
        key_id, tenant = found
        wait = self.admission.throttle(key_id, tenant)
        if wait > 0:
            self.metrics.refused.labels("rate_limit").inc()
            raise ApiError.rate_limited(tenant.name, wait)
        return tenant

    async def _body(self, request: Request, tenant: Tenant) -> bytes:
        """The body, read within the size cap and the replica's budget of held bytes
        (the caller gives the bytes back, :meth:`_give_back`, once it has parsed them)."""
        cap = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            self.metrics.refused.labels("size").inc()
            raise ApiError.too_large(f"the body is {declared} bytes; the limit is {cap}")
        parts: list[bytes] = []
        size = 0
        try:
            async for part in request.stream():
                if size + len(part) > cap:
                    self.metrics.refused.labels("size").inc()
                    raise ApiError.too_large(f"the body is over the limit of {cap} bytes")
                held = self.admission.bodies.take(tenant.name, len(part))
                if held is not GateVerdict.ADMIT:
                    self.metrics.refused.labels("buffered").inc()
                    await _discard_rest(request.stream(), cap - size - len(part))
                    if held is GateVerdict.TENANT_CAP:  # the tenant's own doing: 429
                        raise ApiError.too_many_in_flight(
                            tenant.name,
                            self.admission.gate.running_of(tenant.name),
                            self.limits.retry_after_s,
                        )
                    raise ApiError.overloaded(
                        "the gateway holds as many request bodies as it may; retry shortly",
                        self.limits.retry_after_s,
                    )
                size += len(part)
                parts.append(part)
        except BaseException:
            self._give_back(tenant, size)
            raise
        return b"".join(parts)

    async def _unread(self, request: Request) -> None:
        """Drop what is left of the body of a call refused before it was read (up to the
        size cap, for at most ``drain_s``), so the caller, maybe still sending, reads the
        answer instead of a reset connection. Nothing of it is kept."""
        # Through the request's stream: one whose body was read already ends at once.
        await self.drop_body(request.headers, request.stream())

    async def drop_body(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> None:
        """What :meth:`_unread` does, from a call's headers and the rest of its ``body``."""
        declared = headers.get("content-length")
        cap = self.limits.max_body_bytes
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            return  # refused for its size: the caller who sent it whole reads a reset
        if headers.get("expect", "").lower() == "100-continue":
            return  # the caller waits for our word before it sends the body: none to drop
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.limits.drain_s):
                await _discard_rest(body, cap)

    def _give_back(self, tenant: Tenant, size: int) -> None:
        self.admission.bodies.give_back(tenant.name, size)

    async def _json(self, request: Request, tenant: Tenant) -> object:
        raw = await self._body(request, tenant)
        try:
            return read_json(
                raw,
                max_depth=self.limits.max_json_depth,
                max_containers=self.limits.max_json_containers,
            )
        finally:
            self._give_back(tenant, len(raw))

    def _priority(self, request: Request, tenant: Tenant) -> Priority:
        """The priority the caller asks for, if its key allows it (403 otherwise)."""
        try:
            priority = parse_priority(request.headers.get(PRIORITY_HEADER))
        except ValueError as exc:
            raise ApiError.invalid(str(exc)) from None
        if priority not in tenant.priorities:
            self.metrics.refused.labels("forbidden").inc()
            allowed = ", ".join(sorted(p.value for p in tenant.priorities))
            raise ApiError.forbidden(
                f"this API key may not ask for priority {priority.value} (it may: {allowed})"
            )
        return priority

    def _admit(
        self, request: Request, tenant: Tenant, priority: Priority, body_timeout: float | None
    ) -> _Admitted:
        headers = request.headers
        caps = FieldCaps()
        try:
            timeout_s, explicit = parse_timeout(
                headers.get(TIMEOUT_HEADER),
                body_timeout,
                default_s=self.limits.default_timeout_s,
                max_s=self.limits.max_timeout_s,
            )
        except ValueError as exc:
            raise ApiError.invalid(str(exc)) from None
        tags: dict[str, str] = {}
        for name, value in headers.items():
            if name.startswith(TAG_HEADER_PREFIX) and len(name) > len(TAG_HEADER_PREFIX):
                tag = name[len(TAG_HEADER_PREFIX) :]
                if tag in RESERVED_TAGS or not tenant.may_tag(tag):
                    self.metrics.refused.labels("forbidden").inc()
                    raise ApiError.forbidden(
                        f"this API key may not set the tag {tag[:64]!r}"
                        + (" (the gateway sets it)" if tag in RESERVED_TAGS else "")
                    )
                tags[tag] = value
        tags[PRIORITY_TAG] = priority.value
        tags[TENANT_TAG] = tenant.name
        if len(tags) > caps.tags or any(
            len(k) > caps.tag or len(v) > caps.tag for k, v in tags.items()
        ):
            raise ApiError.invalid(
                f"at most {caps.tags - len(RESERVED_TAGS)} tag headers of at most {caps.tag} "
                "characters each"
            )
        return _Admitted(
            tenant=tenant,
            priority=priority,
            timeout_s=timeout_s,
            deadline_s=timeout_s if explicit else None,
            routing_key="",
            tags=tags,
        )

    def _routing_key(self, request: Request, user: str) -> str:
        key = request.headers.get(ROUTING_KEY_HEADER) or user
        if len(key) > FieldCaps().routing_key:
            raise ApiError.invalid(
                f"the routing key is longer than {FieldCaps().routing_key} characters", "user"
            )
        return key

    def _enter(self, tenant: Tenant, priority: Priority) -> _Slot:
        """Take a place among this replica's running calls: 503 when the replica is full
        (sheddable calls first), 429 for a tenant past its cap or its fair share (taken
        before the body is read, so the gate bounds the bodies held as well)."""
        gate = self.admission.gate
        verdict = gate.enter(priority, tenant.name)
        if verdict is GateVerdict.REPLICA_FULL:
            self.metrics.refused.labels("overload").inc()
            raise ApiError.overloaded(
                f"the gateway is at capacity for {priority.value} calls "
                f"({gate.cap(priority)} running); retry shortly",
                self.limits.retry_after_s,
            )
        if verdict is not GateVerdict.ADMIT:  # the tenant's own doing: 429, not 503
            self.metrics.refused.labels("tenant_share").inc()
            raise ApiError.too_many_in_flight(
                tenant.name, gate.running_of(tenant.name), self.limits.retry_after_s
            )
        self.metrics.in_flight.set(gate.running)
        return _Slot(self, tenant.name)

    def _leave(self, tenant: str) -> None:
        self.admission.gate.leave(tenant)
        self.metrics.in_flight.set(self.admission.gate.running)

    @contextlib.contextmanager
    def _slot(self, tenant: Tenant, priority: Priority) -> Iterator[None]:
        slot = self._enter(tenant, priority)
        try:
            yield
        finally:
            slot.release()

    async def _read_call(
        self, request: Request, endpoint: Endpoint, tenant: Tenant
    ) -> GenerationCall:
        """The checked call of an OpenAI body; the body itself is not kept."""
        body = await self._json(request, tenant)
        if endpoint is Endpoint.COMPLETIONS:
            return parse_completion(body, self.limits)
        draft = read_chat(body, self.limits)
        del body  # only the checked call lives on while the template renders and it runs
        return await self._render(draft)

    async def _render(self, draft: ChatDraft) -> GenerationCall:
        """Render the conversation off the event loop, within the template time limit."""
        template = self.config.template_for(draft.call.model)
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._templates, render_chat, draft, self.limits, template)
        try:
            return await asyncio.wait_for(job, self.limits.template_timeout_s)
        except TimeoutError:
            raise ApiError.invalid(
                f"the model's chat template took longer than {self.limits.template_timeout_s:g} "
                "s on this conversation",
                "messages",
            ) from None

    def _failure(self, exc: BaseException) -> ApiError:
        """The HTTP answer to an SDK error."""
        if isinstance(exc, ApiError):
            return exc
        if isinstance(exc, UnknownModel):
            if exc.result is not None:
                return from_error_code(exc.result.code, exc.result.error_message, retry_after_s=1)
            return ApiError.model_not_found(str(exc))
        if isinstance(exc, RequestRejected):
            return from_error_code(
                exc.result.code, exc.result.error_message, retry_after_s=self.limits.retry_after_s
            )
        if isinstance(exc, InferenceTimeout):
            return ApiError.timed_out(str(exc))
        if is_retriable(exc):
            err = ApiError.overloaded(
                "the request could not be queued; retry shortly", self.limits.retry_after_s
            )
            err.detail = f"{type(exc).__name__}: {exc}"
            return err
        if isinstance(exc, RecursionError):  # a structure too deep for one of our readers
            return ApiError.invalid("the request nests too deeply")
        log.error("unexpected gateway failure", exc_info=exc)
        return ApiError(ErrorCode.INTERNAL, "internal error")

    def answered(
        self, endpoint: EndpointLabel, started: float, response: Response, *, latency: bool = True
    ) -> Response:
        self.metrics.requests.labels(endpoint, str(response.status_code)).inc()
        if latency:
            self.metrics.latency_ms.labels(endpoint).observe((time.perf_counter() - started) * 1e3)
        return response

    def _error(
        self, endpoint: EndpointLabel, started: float, err: ApiError, *, openai: bool
    ) -> Response:
        if err.detail:
            log.warning("%s answered %d (%s): %s", endpoint, err.status, err.code, err.detail)
        body = err.openai_body() if openai else err.inference_protocol_body()
        return self.answered(
            endpoint, started, JSONResponse(body, status_code=err.status, headers=err.headers())
        )

    def _cancel_later(self, request_id: str, model: str) -> None:
        """Send a cancel without holding up the answer (kept until sent)."""
        task = asyncio.create_task(self.client.cancel(request_id, model=model))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    # -- OpenAI ------------------------------------------------------------------------
    async def generate(self, request: Request, endpoint: Endpoint) -> Response:
        label = EndpointLabel.CHAT if endpoint is Endpoint.CHAT else EndpointLabel.COMPLETIONS
        started = time.perf_counter()
        try:
            tenant = self._authorize(request)
            priority = self._priority(request, tenant)
            slot = self._enter(tenant, priority)
        except Exception as exc:
            await self._unread(request)
            return self._error(label, started, self._failure(exc), openai=True)
        try:
            call = await self._read_call(request, endpoint, tenant)
            admitted = self._admit(request, tenant, priority, call.timeout_s)
            admitted.routing_key = self._routing_key(request, call.user)
            await self._served_versions(call.model, "")
        except Exception as exc:
            slot.release()
            return self._error(label, started, self._failure(exc), openai=True)
        if call.stream:  # the stream gives the slot back when it ends
            return await self._generate_streamed(request, call, admitted, label, started, slot)
        try:
            result, request_id = await self._generate_whole(request, call, admitted, label)
        except ApiError as err:
            return self._error(label, started, err, openai=True)
        except Exception as exc:
            return self._error(label, started, self._failure(exc), openai=True)
        finally:
            slot.release()
        if result is None:  # the caller went away; nobody reads this
            return self.answered(label, started, Response(status_code=499))
        self.feedback.answered(request_id, admitted.tenant, call.model, result.version)
        body = response_body(call, request_id=request_id, created=int(time.time()), result=result)
        headers = {
            VERSION_HEADER: result.version,
            VARIANT_HEADER: result.variant,
            REQUEST_ID_HEADER: request_id,
        }
        return self.answered(label, started, JSONResponse(body, headers=headers))

    def _sdk_arguments(self, call: GenerationCall, admitted: _Admitted) -> dict[str, Any]:
        return {
            **call.sdk_arguments(),
            "routing_key": admitted.routing_key,
            "tags": admitted.tags,
            "deadline_s": admitted.deadline_s,
        }

    async def _generate_whole(
        self, request: Request, call: GenerationCall, admitted: _Admitted, label: EndpointLabel
    ) -> tuple[Result | None, str]:
        """The whole generation, or None when the caller disconnected first (cancelled)."""
        request_id = uuid.uuid4().hex
        work = asyncio.create_task(
            self.client.infer(
                call.model,
                task=Task.GENERATE,
                timeout=admitted.timeout_s,
                request_id=request_id,
                **self._sdk_arguments(call, admitted),
            )
        )
        gone = asyncio.create_task(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            self.metrics.cancelled.labels(label).inc()
            self._cancel_later(request_id, call.model)
            return None, request_id
        try:
            return work.result(), request_id
        except InferenceTimeout:
            self._cancel_later(request_id, call.model)
            raise

    async def _generate_streamed(
        self,
        request: Request,
        call: GenerationCall,
        admitted: _Admitted,
        label: EndpointLabel,
        started: float,
        slot: _Slot,
    ) -> Response:
        request_id = uuid.uuid4().hex
        relay = _Relay(
            self.client.stream(
                call.model,
                timeout=admitted.timeout_s,
                request_id=request_id,
                **self._sdk_arguments(call, admitted),
            ),
            on_end=slot.release,
        )
        first = await relay.next()
        if isinstance(first, BaseException):
            return self._error(label, started, self._failure(first), openai=True)
        created = int(time.time())
        metrics = self.metrics

        async def events() -> AsyncIterator[bytes]:
            item: Chunk | BaseException | None = first
            opened = False
            texted = False
            version = ""
            text_offset = 0
            metrics.streams_open.inc()
            try:
                if call.endpoint is Endpoint.CHAT:
                    yield sse_event(
                        stream_chunk(
                            call,
                            request_id=request_id,
                            created=created,
                            text="",
                            finish=None,
                            first=True,
                        )
                    )
                    opened = True
                while item is not None:
                    if isinstance(item, BaseException):
                        err = self._failure(item)
                        yield sse_event(err.openai_body())
                        metrics.requests.labels(label, str(err.status)).inc()
                        return
                    if item.text or item.logprobs:
                        if not texted:
                            texted = True
                            metrics.ttft_ms.labels(label).observe(
                                (time.perf_counter() - started) * 1e3
                            )
                        yield sse_event(
                            stream_chunk(
                                call,
                                request_id=request_id,
                                created=created,
                                text=item.text,
                                finish=None,
                                first=not opened,
                                version=version,
                                logprobs=item.logprobs,
                                text_offset=text_offset,
                            )
                        )
                        text_offset += len(item.text)
                        opened = True
                    if item.final:
                        result = item.result
                        version = result.version if result is not None else ""
                        self.feedback.answered(request_id, admitted.tenant, call.model, version)
                        yield sse_event(
                            stream_chunk(
                                call,
                                request_id=request_id,
                                created=created,
                                text="",
                                finish=item.finish_reason or "STOP",
                                first=False,
                                version=version,
                                tool_calls=result.tool_calls if result is not None else (),
                            )
                        )
                        if call.include_usage:
                            yield sse_event(
                                usage_chunk(
                                    call,
                                    request_id=request_id,
                                    created=created,
                                    usage=result.usage if result is not None else None,
                                    version=version,
                                )
                            )
                        yield SSE_DONE
                        metrics.requests.labels(label, "200").inc()
                        metrics.latency_ms.labels(label).observe(
                            (time.perf_counter() - started) * 1e3
                        )
                        return
                    item = await relay.next()
            finally:
                metrics.streams_open.dec()
                if not relay.finished:
                    metrics.cancelled.labels(label).inc()
                # No await here: the server may have cancelled this generator (the caller
                # went away) and would cancel the wait as well.
                relay.abandon()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={REQUEST_ID_HEADER: request_id, "Cache-Control": "no-cache"},
            background=BackgroundTask(relay.close),
        )

    async def list_models(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            self._authorize(request)
            models = await self.directory.models()
        except Exception as exc:
            return self._error(EndpointLabel.MODELS, started, self._failure(exc), openai=True)
        return self.answered(EndpointLabel.MODELS, started, JSONResponse(models_body(list(models))))

    async def get_model(self, request: Request, model: str) -> Response:
        started = time.perf_counter()
        try:
            self._authorize(request)
            if await self.directory.versions(model) is None:
                raise ApiError.model_not_found(f"The model '{model}' does not exist")
        except Exception as exc:
            return self._error(EndpointLabel.MODELS, started, self._failure(exc), openai=True)
        return self.answered(EndpointLabel.MODELS, started, JSONResponse(model_card(model)))

    # -- Open Inference Protocol v2 -------------------------------------------------------
    async def _served_versions(self, model: str, version: str) -> tuple[str, ...]:
        versions = await self.directory.versions(model)
        if versions is None:
            raise ApiError.model_not_found(f"The model '{model}' does not exist")
        if version and version not in versions:
            raise ApiError.model_not_found(f"version {version!r} of model {model!r} is not served")
        return versions

    async def model_metadata(self, request: Request, model: str, version: str = "") -> Response:
        started = time.perf_counter()
        try:
            self._authorize(request)
            versions = await self._served_versions(model, version)
            signature = await asyncio.to_thread(self.signatures.signature, model, version)
        except Exception as exc:
            return self._error(EndpointLabel.V2_METADATA, started, self._failure(exc), openai=False)
        body = oip.model_metadata(model, [version] if version else list(versions), signature)
        return self.answered(EndpointLabel.V2_METADATA, started, JSONResponse(body))

    async def model_ready(self, request: Request, model: str, version: str = "") -> Response:
        started = time.perf_counter()
        try:
            self._authorize(request)
            await self._served_versions(model, version)
        except Exception as exc:
            return self._error(EndpointLabel.V2_READY, started, self._failure(exc), openai=False)
        return self.answered(EndpointLabel.V2_READY, started, Response(status_code=200))

    async def infer(self, request: Request, model: str, version: str = "") -> Response:
        started = time.perf_counter()
        try:
            tenant = self._authorize(request)
            priority = self._priority(request, tenant)
            with self._slot(tenant, priority):
                call = await self._read_tensors(request, tenant)
                admitted = self._admit(request, tenant, priority, call.timeout_s)
                admitted.routing_key = request.headers.get(ROUTING_KEY_HEADER, "")
                await self._served_versions(model, "")
                result = await self.client.infer(
                    model,
                    inputs=dict(call.inputs),
                    task=Task.FORWARD,
                    timeout=admitted.timeout_s,
                    pinned_version=version,
                    routing_key=admitted.routing_key,
                    tags=admitted.tags,
                    deadline_s=admitted.deadline_s,
                )
            body, json_length = oip.infer_response(
                model=model, version=result.version, call=call, outputs=result.outputs
            )
        except Exception as exc:
            await self._unread(request)
            return self._error(EndpointLabel.V2_INFER, started, self._failure(exc), openai=False)
        headers = {VERSION_HEADER: result.version, VARIANT_HEADER: result.variant}
        media = "application/json"
        if json_length is not None:
            headers[oip.HEADER_LENGTH] = str(json_length)
            media = "application/octet-stream"
        return self.answered(
            EndpointLabel.V2_INFER, started, Response(body, media_type=media, headers=headers)
        )

    async def _read_tensors(self, request: Request, tenant: Tenant) -> oip.TensorCall:
        """The checked tensors of an ``infer`` body; the body itself is not kept."""
        raw = await self._body(request, tenant)
        try:
            header, binary = oip.split_body(
                raw,
                request.headers.get(oip.HEADER_LENGTH),
                max_depth=self.limits.max_json_depth,
                max_containers=self.limits.max_json_containers,
            )
            return oip.parse_infer(header, binary, max_elements=DEFAULT_MAX_ELEMENTS)
        finally:
            self._give_back(tenant, len(raw))

    # -- probes -----------------------------------------------------------------------
    def alive(self) -> bool:
        return not self.observability.heartbeats.stalled()

    def is_ready(self) -> bool:
        return self.observability.readiness() and self.ready.is_set()


class _Relay:
    """Chunks of one streamed generation, pumped by a task of its own.

    The pump is an ordinary task, outside the HTTP server's cancel scope: abandoning the
    relay (the caller went away) cancels it exactly once, and the SDK's stream then sends
    the generation's cancel message.
    """

    def __init__(self, chunks: AsyncIterator[Chunk], on_end: Callable[[], None]) -> None:
        self._queue: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue()
        self._on_end: Callable[[], None] | None = on_end
        self.finished = False
        self._task = asyncio.create_task(self._pump(chunks))

    def _end(self) -> None:
        if self._on_end is not None:
            on_end, self._on_end = self._on_end, None
            on_end()

    async def _pump(self, chunks: AsyncIterator[Chunk]) -> None:
        try:
            async for chunk in chunks:
                self._queue.put_nowait(chunk)
                if chunk.final:
                    self.finished = True
            self._queue.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.finished = True
            self._queue.put_nowait(exc)
        finally:
            self._end()

    async def next(self) -> Chunk | BaseException | None:
        return await self._queue.get()

    def abandon(self) -> None:
        """Stop pumping (the SDK then cancels the generation, unless it ended)."""
        if not self._task.done():
            self._task.cancel()

    async def close(self) -> None:
        """Abandon the stream and wait until the pump has stopped (its cancel sent)."""
        self.abandon()
        with contextlib.suppress(BaseException):
            # Shielded: a second cancel would interrupt the SDK sending the cancel message.
            await asyncio.shield(self._task)
        self._end()


async def _discard_rest(body: AsyncIterator[bytes], room: int) -> None:
    """Read and drop the rest of a refused body, up to ``room`` bytes, so the caller (still
    sending) reads the answer rather than a reset connection."""
    async for part in body:
        room -= len(part)
        if room < 0:
            return


async def _disconnected(request: Request) -> None:
    """Returns when the caller's connection closes (the body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _build_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="Graylane gateway", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        await gateway._unread(request)  # an unknown path's body: dropped, then answered
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.BAD_REQUEST
        err = ApiError(code, str(exc.detail), status=exc.status_code)
        if request.url.path.startswith("/v2"):
            return JSONResponse(err.inference_protocol_body(), status_code=exc.status_code)
        return JSONResponse(err.openai_body(), status_code=exc.status_code)

    # Each inference call continues the caller's ``traceparent`` (or starts a trace).
    async def completions(request: Request) -> Response:
        with tracing.serving("graylane.gateway completions", request.headers):
            return await gateway.generate(request, Endpoint.COMPLETIONS)

    async def chat(request: Request) -> Response:
        with tracing.serving("graylane.gateway chat", request.headers):
            return await gateway.generate(request, Endpoint.CHAT)

    async def models(request: Request) -> Response:
        return await gateway.list_models(request)

    async def model(request: Request, model: str) -> Response:
        return await gateway.get_model(request, model)

    async def metadata(request: Request, name: str, version: str = "") -> Response:
        return await gateway.model_metadata(request, name, version)

    async def ready(request: Request, name: str, version: str = "") -> Response:
        return await gateway.model_ready(request, name, version)

    async def infer(request: Request, name: str, version: str = "") -> Response:
        with tracing.serving("graylane.gateway infer", request.headers):
            return await gateway.infer(request, name, version)

    async def server_metadata() -> Response:
        return JSONResponse(oip.server_metadata(gateway.factory.settings.image_version))

    async def live() -> Response:
        return Response(status_code=200 if gateway.alive() else 503)

    async def ready_server() -> Response:
        return Response(status_code=200 if gateway.is_ready() else 503)

    async def health() -> Response:
        """The probe clients of vLLM-compatible servers send before they start."""
        return Response(status_code=200 if gateway.is_ready() else 503)

    async def version() -> Response:
        settings = gateway.factory.settings
        return JSONResponse({"version": settings.image_version, "server": "graylane"})

    async def healthz() -> Response:
        ok = gateway.alive()
        return Response(b"ok\n" if ok else b"stalled\n", status_code=200 if ok else 503)

    async def readyz() -> Response:
        if gateway.is_ready():
            return Response(b"ready\n")
        missing = ", ".join(gateway.observability.readiness.missing()) or "http server"
        return Response(f"not ready: {missing}\n".encode(), status_code=503)

    async def metrics() -> Response:
        return Response(
            generate_latest(gateway.observability.registry), media_type=CONTENT_TYPE_LATEST
        )

    handlers: dict[Handler, Callable[..., Awaitable[Response]]] = {
        Handler.COMPLETIONS: completions,
        Handler.CHAT: chat,
        Handler.MODELS: models,
        Handler.MODEL: model,
        Handler.FEEDBACK: gateway.feedback.take,
        Handler.SERVER_METADATA: server_metadata,
        Handler.LIVE: live,
        Handler.READY_SERVER: ready_server,
        Handler.METADATA: metadata,
        Handler.READY: ready,
        Handler.INFER: infer,
        Handler.HEALTH: health,
        Handler.VERSION: version,
        Handler.HEALTHZ: healthz,
        Handler.READYZ: readyz,
        Handler.METRICS: metrics,
    }
    for entry in ROUTES:  # the front door reads the same table
        app.add_api_route(
            entry.path, handlers[entry.handler], methods=[entry.method], include_in_schema=False
        )
    return app
