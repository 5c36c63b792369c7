"""A worker that serves its version through an engine server (llama.cpp, vLLM,
TensorRT-LLM, SGLang): the engine-server backend.

The worker consumes its version topic as always; each ``GENERATE`` becomes one
streamed call to the engine's OpenAI API (:mod:`~graylane.engine_worker.openai_calls`):
a conversation to ``/v1/chat/completions`` as messages, so the engine applies the chat
template it was deployed with, a text or token prompt to ``/v1/completions``.

**Many calls in flight.** Each variant is an :class:`~graylane.engine.server.EngineEndpoint`
served by :class:`EndpointCalls`: up to ``slots`` calls at once (the engine's parallel
sequences), the rest waiting here, in arrival order. The engine batches the calls it
has; the worker never does. A waiting request whose time-to-first-token budget or
deadline passes is answered ``SHED`` (it could not start in time). The worker fetches
more records only while fewer than :attr:`EngineServerSettings.max_waiting` wait, so a
backlog stays in Kafka, where the version's lag shows it and other replicas can take it.

**Streams and timing.** The engine's events are relayed to the reply topic in
Graylane's stream protocol (:class:`~graylane.engine_worker.logic.streaming.StreamPolicy`:
the first text at once, then a chunk every few pieces or milliseconds), with the log
probabilities of their tokens. The worker measures each call itself: time to first
token (from the request's creation, as the native decoder does), the gaps between
pieces, time per output token over the engine's own token count (its usage), and
publishes the same per-generation telemetry as the native path, with the load
signals the engine publishes (:mod:`~graylane.engine_worker.engine_load`).

**Faults.** Every call ends with an answer: the engine's refusal of the caller's input
(4xx: ``BAD_REQUEST``, ``SEQUENCE_TOO_LONG``), overload (429: ``SHED``), an engine
that is down or not ready (``ENGINE_UNAVAILABLE``), or any other failure, a cut
stream or bytes that are no event (``ENGINE_FAILURE``). A call is tried again only
when nothing of it was sent (the connection was refused), within
:attr:`EngineServerSettings.retry_budget_s`. An endpoint that cannot be reached is
*down*: the worker's readiness turns false (``engine_up``), it fetches nothing while
its active variant's endpoint is down (requests wait in Kafka, and a candidate whose
engine died is judged unresponsive), and :class:`EndpointHealth` probes ``/health``
until the engine answers again.

**Cancels.** A cancel (the cancels topic, or a caller that hung up at the gateway)
closes the call's HTTP stream, which frees the engine's slot, and answers the request
``CANCELLED`` with what it generated so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx

from graylane.clock import now_ms
from graylane.engine.server import EngineEndpoint
from graylane.engine_worker.backend import (
    DecodeLoad,
    Ended,
    EndedTogether,
    Outbox,
    ResultContext,
    settle_when_sent,
)
from graylane.engine_worker.engine_load import EngineLoad, load_paths, read_load
from graylane.engine_worker.logic.streaming import ChunkPiece, StreamPolicy, gap_p99
from graylane.engine_worker.openai_calls import (
    DONE,
    ChoiceText,
    EngineAnswer,
    EngineEvent,
    EngineFault,
    build_call,
    finish_reason,
    http_rejection,
    read_event,
)
from graylane.engine_worker.requests import (
    EngineRules,
    Job,
    Tokenizer,
    WorkItem,
    validate_engine_call,
)
from graylane.engine_worker.state import CancelKey
from graylane.errors import ErrorCode, Rejection
from graylane.kafka.seam import BatchConsumer, Record
from graylane.metrics.process import ENGINE_UP, ServiceObservability
from graylane.v1 import inference_pb2

__all__ = [
    "EndpointCalls",
    "EndpointHealth",
    "EngineServerBackend",
    "EngineServerSettings",
]

log = logging.getLogger(__name__)

MAX_EVENT_BYTES = 1 << 20
"""The longest line of an engine's stream; a longer one is no event (garbage)."""
MAX_ERROR_BODY_BYTES = 64 * 1024
"""How much of an engine's error answer is read."""


@dataclass(frozen=True, kw_only=True)
class EngineServerSettings:
    """How a worker calls its engine servers."""

    connect_timeout_s: float = 2.0
    stall_timeout_s: float = 60.0
    """No byte of a call for this long: the engine stalled, the call failed."""
    retry_budget_s: float = 2.0
    """A call refused before anything was sent is tried again within this."""
    probe_every_s: float = 1.0
    """How often ``/health`` and the engine's load figures are read."""
    max_waiting: int = 0
    """Requests held here waiting for a slot, per endpoint (0: four times its slots)."""
    flush_ms: float = 5.0
    """Generations that end within this share one telemetry record (and their answers
    wait for it at most this long)."""

    def waiting_cap(self, slots: int) -> int:
        return self.max_waiting or 4 * slots


# -- health --------------------------------------------------------------------------------


class EndpointHealth:
    """Whether an endpoint answers, from its probes and its calls."""

    def __init__(self, endpoint: EngineEndpoint, on_change: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.up = False
        self.changed_at = time.monotonic()
        self.reason = "not probed yet"
        self._up_event = asyncio.Event()
        self._suspect = asyncio.Event()
        self._on_change = on_change

    def mark(self, up: bool, reason: str = "") -> None:
        if up == self.up:
            return
        self.up, self.reason, self.changed_at = up, reason, time.monotonic()
        if up:
            self._up_event.set()
            log.info("engine %s of variant %s is up", self.endpoint.url, self.endpoint.variant)
        else:
            self._up_event.clear()
            log.warning(
                "engine %s of variant %s is down: %s",
                self.endpoint.url,
                self.endpoint.variant,
                reason,
            )
        self._on_change()

    def suspect(self) -> None:
        """A call failed in a way that says the engine may be gone: probe now."""
        self._suspect.set()

    async def wait_up(self, timeout_s: float) -> bool:
        if self.up:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._up_event.wait(), timeout_s)
        return self.up

    async def next_probe(self, every_s: float) -> None:
        """Sleep until the next probe is due (sooner when a call raised suspicion)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._suspect.wait(), every_s if self.up else every_s / 2)
        self._suspect.clear()


# -- one call ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Call:
    job: Job
    submitted_ms: int
    ttft_deadline_ms: int
    """Unix ms by which its first piece must be out (0: none)."""
    cursor: _TextCursor | None
    done: asyncio.Future[None]
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    publishing: bool = False
    """A chunk is being queued: a cancel waits for it (chunks must stay in sequence)."""
    started_ms: int = 0
    first_ms: int = 0
    last_ms: int = 0
    pieces: int = 0
    gaps_ms: list[float] = field(default_factory=list)
    choices: dict[int, ChoiceText] = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    saw_done: bool = False
    sends: list[Awaitable[object]] = field(default_factory=list)

    @property
    def first(self) -> ChoiceText:
        return self.choices.setdefault(0, ChoiceText(0))

    def note(self, event: EngineEvent, at_ms: int) -> None:
        """Add an event's pieces and stamp when they came."""
        for delta in event.choices:
            self.choices.setdefault(delta.index, ChoiceText(delta.index)).add(delta)
        if event.prompt_tokens is not None:
            self.prompt_tokens = event.prompt_tokens
        if event.completion_tokens is not None:
            self.completion_tokens = event.completion_tokens
        new = event.tokens_seen
        if new <= 0:
            return
        if self.first_ms:
            self.gaps_ms.extend([float(max(0, at_ms - self.last_ms)) / new] * new)
        else:
            self.first_ms = at_ms
        self.pieces += new
        self.last_ms = at_ms

    @property
    def finished(self) -> bool:
        return bool(self.choices) and all(c.finish_reason for c in self.choices.values())


@dataclass(slots=True)
class _TextCursor:
    """How far a streamed call has been published (the engine sends text, not ids)."""

    policy: StreamPolicy
    sequence: int = 0
    pieces_sent: int = 0
    text_sent: int = 0
    logprobs_sent: int = 0
    last_ms: float = 0.0

    def due(self, pieces: int, at_ms: float) -> bool:
        new = pieces - self.pieces_sent
        if new <= 0:
            return False
        if self.sequence == 0:
            return True  # the first piece goes out at once: it is the time to first token
        return new >= self.policy.every_tokens or at_ms - self.last_ms >= self.policy.every_ms

    def take(
        self, call: _Call, at_ms: float
    ) -> tuple[ChunkPiece, list[inference_pb2.TokenLogprob]]:
        """The next chunk of a running call: its new text, and the new logprobs."""
        choice = call.first
        piece = ChunkPiece(self.sequence, (), choice.text[self.text_sent :], final=False)
        logprobs = choice.logprobs[self.logprobs_sent :]
        self.sequence += 1
        self.pieces_sent = call.pieces
        self.text_sent = len(choice.text)
        self.logprobs_sent = len(choice.logprobs)
        self.last_ms = at_ms
        return piece, logprobs

    def finish(
        self, first: ChoiceText
    ) -> tuple[ChunkPiece, tuple[inference_pb2.TokenLogprob, ...]]:
        """The final chunk: the rest of the first choice's text and logprobs."""
        piece = ChunkPiece(self.sequence, (), first.text[self.text_sent :], final=True)
        return piece, tuple(first.logprobs[self.logprobs_sent :])


class _Cancelled(Exception):
    """A cancel arrived while a chunk was being queued: the call stops right after."""


class _Refused(Exception):
    """A call ended with a refusal (carried to the call's answer)."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


# -- one endpoint ---------------------------------------------------------------------------


class EndpointCalls:
    """The calls of one variant to its engine server (its running generations)."""

    def __init__(
        self,
        endpoint: EngineEndpoint,
        client: httpx.AsyncClient,
        health: EndpointHealth,
        context: ResultContext,
        outbox: Outbox,
        *,
        settings: EngineServerSettings,
        stream: StreamPolicy,
        served_model: Callable[[], str],
        engine_load: Callable[[], EngineLoad],
    ) -> None:
        self.endpoint = endpoint
        self.context = context
        self.variant = endpoint.variant
        self._client = client
        self._health = health
        self._outbox = outbox
        self._settings = settings
        self._stream = stream
        self._served_model = served_model
        self._engine_load = engine_load
        self._waiting: deque[_Call] = deque()
        self._running: dict[str, _Call] = {}
        self._by_request: dict[CancelKey, _Call] = {}
        self._ended: list[tuple[_Call, EngineAnswer | Rejection]] = []
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._pump_task: asyncio.Task[None] | None = None
        self._flush_task: asyncio.Task[None] | None = None
        self._last_flush = 0.0
        self._busy_since = 0.0
        self._busy_s = 0.0
        self._busy_window_start = time.monotonic()
        self.calls = 0
        self.connect_failures = 0
        """Attempts refused before anything was sent (each is tried again within budget)."""

    # -- running generations --------------------------------------------------------------
    def submit(self, job: Job) -> Awaitable[object]:
        request = job.request
        created = request.created_at_unix_ms or request.routed_at_unix_ms or now_ms()
        ttft = request.generation.ttft_deadline_ms
        deadline = created + ttft if ttft > 0 else 0
        if request.deadline_unix_ms > 0:
            deadline = (
                min(deadline, request.deadline_unix_ms) if deadline else request.deadline_unix_ms
            )
        cursor = None
        if request.generation.stream and not request.shadow:
            cursor = _TextCursor(
                self._stream.for_request(
                    request.generation.stream_every_tokens, request.generation.stream_every_ms
                )
            )
        call = _Call(
            job,
            now_ms(),
            deadline,
            cursor,
            asyncio.get_running_loop().create_future(),
        )
        self._waiting.append(call)
        self._by_request[job.cancel_key] = call
        self._note_room()
        self._wake.set()
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = asyncio.create_task(self._pump(), name=f"engine-{self.variant}")
        return call.done

    def cancel(self, key: CancelKey) -> bool:
        call = self._by_request.get(key)
        if call is None:  # not here, or not asked for by that reply topic and token
            return False
        if call.cancelled:
            return True
        call.cancelled = True
        if call.task is not None:  # running: closing its stream frees the engine's slot
            if not call.publishing:  # else it stops once its chunk is queued (in order)
                call.task.cancel()
        else:
            with contextlib.suppress(ValueError):
                self._waiting.remove(call)
            self._note_room()
            self._end(call, self._answer_of(call, cancelled=True))
        return True

    def load(self) -> DecodeLoad:
        engine = self._engine_load()
        running = len(self._running)
        slots = self.endpoint.slots
        kv = engine.kv_cache_occupancy
        return DecodeLoad(
            kv_cache_occupancy=kv if kv is not None else min(1.0, running / slots),
            waiting=len(self._waiting) + (engine.waiting or 0),
            running=max(running, engine.running or 0),
        )

    @property
    def live(self) -> int:
        return len(self._waiting) + len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_room(self) -> bool:
        return len(self._waiting) < self._settings.waiting_cap(self.endpoint.slots)

    async def wait_for_room(self, timeout_s: float) -> bool:
        if self.has_room:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._room.wait(), timeout_s)
        return self.has_room

    async def drain_and_close(self, poll_s: float = 0.05) -> None:
        while self.live or self._ended:
            await asyncio.sleep(poll_s)
        await self.close()

    async def close(self) -> None:
        for call in list(self._running.values()):
            if call.task is not None:
                call.task.cancel()
        tasks = [c.task for c in self._running.values() if c.task is not None]
        for task in (self._pump_task, self._flush_task, *tasks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._pump_task = self._flush_task = None
        for call in [*self._waiting, *self._running.values()]:
            if not call.done.done():
                call.done.cancel()  # unanswered: the loop reads it again after a restart
        self._waiting.clear()
        self._running.clear()

    # -- the slot pump -----------------------------------------------------------------
    async def _pump(self) -> None:
        """Start waiting calls while slots are free; shed those out of time."""
        while True:
            self._shed_late()
            while self._waiting and len(self._running) < self.endpoint.slots:
                call = self._waiting.popleft()
                self._note_room()
                self._start(call)
            self._wake.clear()
            if not self._waiting and not self._running:
                await self._wake.wait()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._next_deadline_s())

    def _next_deadline_s(self) -> float | None:
        deadlines = [c.ttft_deadline_ms for c in self._waiting if c.ttft_deadline_ms]
        if not deadlines:
            return None
        return max(0.001, (min(deadlines) - now_ms()) / 1000.0 + 0.001)

    def _shed_late(self) -> None:
        now = now_ms()
        late = [c for c in self._waiting if c.ttft_deadline_ms and now > c.ttft_deadline_ms]
        for call in late:
            self._waiting.remove(call)
            why = (
                f"no engine slot within its time-to-first-token budget "
                f"({len(self._running)} calls running, {len(self._waiting)} waiting)"
            )
            self._end(call, Rejection(ErrorCode.SHED, why))
        if late:
            self._note_room()

    def _note_room(self) -> None:
        if self.has_room:
            self._room.set()
        else:
            self._room.clear()

    def _start(self, call: _Call) -> None:
        call.started_ms = now_ms()
        if not self._running:
            self._busy_since = time.monotonic()
        self._running[call.job.request.request_id] = call
        self.calls += 1
        call.task = asyncio.create_task(self._run(call), name=f"engine-call-{self.variant}")

    async def _run(self, call: _Call) -> None:
        try:
            outcome: EngineAnswer | Rejection = await self._call(call)
        except asyncio.CancelledError:
            if not call.cancelled:
                raise  # the worker stops: the call stays unanswered, read again later
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            outcome = self._answer_of(call, cancelled=True)
        except _Cancelled:
            outcome = self._answer_of(call, cancelled=True)
        except Exception as exc:  # one call never stops the others
            log.exception("engine call of %s failed unexpectedly", self.variant)
            outcome = Rejection(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
        self._running.pop(call.job.request.request_id, None)
        if not self._running:
            self._busy_s += time.monotonic() - self._busy_since
        self._wake.set()
        self._end(call, outcome)

    async def _call(self, call: _Call) -> EngineAnswer | Rejection:
        job = call.job
        engine_call = build_call(
            job.request,
            job.work,
            served_model=self._served_model(),
            backend=self.endpoint.backend,
        )
        url = self.endpoint.url + engine_call.route.value
        retry_until = time.monotonic() + self._settings.retry_budget_s
        backoff = 0.05
        while True:
            try:
                return await self._stream_call(call, url, engine_call.body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
                self.connect_failures += 1
                self._health.mark(False, f"connection failed: {type(exc).__name__}")
                if time.monotonic() + backoff > retry_until or call.cancelled:
                    return Rejection(
                        ErrorCode.ENGINE_UNAVAILABLE, "the engine server could not be reached"
                    )
                await asyncio.sleep(backoff)
                backoff = min(0.5, backoff * 2)
            except _Refused as refused:
                return refused.rejection
            except httpx.TimeoutException:
                self._health.suspect()
                return Rejection(
                    ErrorCode.ENGINE_FAILURE,
                    f"the engine server sent nothing for {self._settings.stall_timeout_s:g} s",
                )
            except httpx.HTTPError as exc:  # reset, cut, protocol error: after bytes were sent
                self._health.suspect()
                if not call.pieces:
                    return Rejection(
                        ErrorCode.ENGINE_UNAVAILABLE,
                        f"the engine server closed the call before answering "
                        f"({type(exc).__name__})",
                    )
                return Rejection(
                    ErrorCode.ENGINE_FAILURE,
                    f"the engine server cut the stream after {call.pieces} tokens",
                )

    async def _stream_call(self, call: _Call, url: str, body: object) -> EngineAnswer:
        async with self._client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = await _read_bounded(response, MAX_ERROR_BODY_BYTES)
                if response.status_code == 503:
                    self._health.suspect()
                raise _Refused(http_rejection(response.status_code, text))
            self._health.mark(True)
            async for line in _lines(response.aiter_bytes(), MAX_EVENT_BYTES):
                if line is None:
                    raise _Refused(
                        Rejection(
                            ErrorCode.ENGINE_FAILURE, "the engine server sent an oversized event"
                        )
                    )
                if not line.startswith("data:"):
                    continue  # comments (keep-alive pings), event names, ids
                data = line[5:].strip()
                if data == DONE:
                    call.saw_done = True
                    break
                event = read_event(data)
                if isinstance(event, EngineFault):
                    raise _Refused(event.rejection)
                at = now_ms()
                call.note(event, at)
                await self._publish(call, at)
                if call.cancelled:
                    raise _Cancelled
        if not call.saw_done and not call.finished:
            self._health.suspect()
            raise _Refused(
                Rejection(
                    ErrorCode.ENGINE_FAILURE,
                    f"the engine server ended the stream before its end ({call.pieces} tokens)",
                )
            )
        return self._answer_of(call, cancelled=False)

    def _answer_of(self, call: _Call, *, cancelled: bool) -> EngineAnswer:
        stops = bool(call.job.work.sampling.stop)
        choices: list[tuple[ChoiceText, inference_pb2.FinishReason]] = []
        for index in sorted(call.choices) or [0]:
            choice = call.choices.get(index) or ChoiceText(index)
            reason = (
                inference_pb2.CANCELLED
                if cancelled
                else finish_reason(choice.finish_reason, stopped_by_string=stops)
            )
            choices.append((choice, reason))
        completion = call.completion_tokens
        if completion is None or cancelled:
            completion = call.pieces
        return EngineAnswer(
            choices=tuple(choices),
            prompt_tokens=call.prompt_tokens or 0,
            completion_tokens=completion,
            started_ms=call.started_ms or call.submitted_ms,
            first_token_ms=call.first_ms,
            last_token_ms=call.last_ms,
            inter_token_p99_ms=gap_p99(call.gaps_ms),
        )

    async def _publish(self, call: _Call, at_ms: int) -> None:
        cursor = call.cursor
        if cursor is None or not cursor.due(call.pieces, float(at_ms)):
            return
        piece, logprobs = cursor.take(call, float(at_ms))
        call.publishing = True
        try:
            call.sends.append(await self._outbox.chunk(call.job, piece, self.context, logprobs))
        finally:
            call.publishing = False

    # -- answers -------------------------------------------------------------------------
    def _end(self, call: _Call, outcome: EngineAnswer | Rejection) -> None:
        key = call.job.cancel_key
        if self._by_request.get(key) is call:
            del self._by_request[key]
        self._ended.append((call, outcome))
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.create_task(
                self._flush(), name=f"engine-answers-{self.variant}"
            )

    async def _flush(self) -> None:
        """Deliver what ended; generations that end close together share a telemetry record."""
        while self._ended:
            wait = self._last_flush + self._settings.flush_ms / 1000.0 - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._last_flush = time.monotonic()
            ended, self._ended = self._ended, []
            await self._deliver(ended)

    async def _deliver(self, ended: list[tuple[_Call, EngineAnswer | Rejection]]) -> None:
        answers: list[Ended] = []
        for call, outcome in ended:
            if isinstance(outcome, Rejection) or call.cursor is None:
                answers.append(Ended(call.job, outcome))
                continue
            tail, logprobs = call.cursor.finish(outcome.choices[0][0])
            answers.append(Ended(call.job, outcome, tail, logprobs))
        together = EndedTogether(
            ended=tuple(answers),
            context=self.context,
            started_ms=min(c.started_ms or c.submitted_ms for c, _ in ended),
            device_load=self._device_load(),
            load=self.load(),
        )
        try:
            sends = await self._outbox.generations(together)
        except Exception as exc:  # the loop's next cycle reads them again
            for call, _ in ended:
                if not call.done.done():
                    call.done.set_exception(exc)
            return
        for call, _ in ended:
            settle_when_sent(call.done, [*call.sends, *sends])

    def _device_load(self) -> float:
        """The share of the last seconds with at least one call running."""
        now = time.monotonic()
        window = max(1e-3, now - self._busy_window_start)
        busy = self._busy_s + (now - self._busy_since if self._running else 0.0)
        if window > 5.0:  # a fresh window every few seconds
            self._busy_window_start, self._busy_s = now, 0.0
            if self._running:
                self._busy_since = now
        return min(1.0, busy / window)


async def _read_bounded(response: httpx.Response, limit: int) -> str:
    parts: list[bytes] = []
    size = 0
    async for part in response.aiter_bytes():
        parts.append(part[: limit - size])
        size += len(part)
        if size >= limit:
            break
    return b"".join(parts).decode("utf-8", errors="replace")


async def _lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[str | None]:
    """The lines of a byte stream, decoded; None (then the end) for a line over ``limit``."""
    pending = b""
    async for part in chunks:
        pending += part
        while True:
            cut = pending.find(b"\n")
            if cut < 0:
                break
            line, pending = pending[:cut], pending[cut + 1 :]
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if len(pending) > limit:
            yield None
            return
    if pending:
        yield pending.decode("utf-8", errors="replace")


# -- the backend -----------------------------------------------------------------------------


class EngineServerBackend:
    """A worker's backend that serves its variants through engine servers."""

    def __init__(
        self,
        endpoints: Sequence[EngineEndpoint],
        rules: EngineRules,
        observability: ServiceObservability,
        *,
        active: Callable[[], str],
        stream: StreamPolicy,
        settings: EngineServerSettings | None = None,
        worker_id: str,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("an engine-server backend needs at least one endpoint")
        names = [e.variant for e in endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"engine endpoints repeat a variant: {names}")
        self.endpoints = {e.variant: e for e in endpoints}
        self.rules = rules
        self.settings = settings or EngineServerSettings()
        self._observability = observability
        self._active = active
        self._stream = stream
        self._worker_id = worker_id
        slots = sum(e.slots for e in endpoints)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                self.settings.stall_timeout_s, connect=self.settings.connect_timeout_s
            ),
            limits=httpx.Limits(
                max_connections=slots + 2 * len(endpoints),
                max_keepalive_connections=slots + 2 * len(endpoints),
            ),
            transport=transport,
        )
        self.health = {
            v: EndpointHealth(e, self._health_changed) for v, e in self.endpoints.items()
        }
        self._loads: dict[str, EngineLoad] = {v: EngineLoad() for v in self.endpoints}
        self._served: dict[str, str] = {v: e.served_model for v, e in self.endpoints.items()}
        self._calls: dict[str, EndpointCalls] = {}
        self._probes: list[asyncio.Task[None]] = []

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.endpoints)

    @property
    def tokenizer(self) -> Tokenizer | None:
        return None  # engines answer text

    @property
    def max_in_flight(self) -> int:
        """Fetched cycles that may await their answers at once: enough for every slot
        and every waiting request to be a cycle of its own."""
        caps = (self.settings.waiting_cap(e.slots) + e.slots for e in self.endpoints.values())
        return max(8, max(caps))

    def check(
        self,
        request: inference_pb2.InferenceRequest,
        size_bytes: int,
        index: int,
        variant: str,
        now_ms: int,
    ) -> WorkItem | Rejection:
        return validate_engine_call(request, size_bytes, index, self.rules, now_ms)

    async def warm_up(self, *, low_priority: bool) -> int:
        return 0  # the engine is warm or not; readiness says which

    async def start(self) -> None:
        for variant in self.endpoints:
            self._probes.append(
                asyncio.create_task(self._probe(variant), name=f"engine-probe-{variant}")
            )

    # -- probes ----------------------------------------------------------------------------
    def _health_changed(self) -> None:
        active = self.health.get(self._active())
        self._observability.mark(ENGINE_UP, active is not None and active.up)

    def engine_up(self) -> bool:
        health = self.health.get(self._active())
        return health is not None and health.up

    async def _probe(self, variant: str) -> None:
        health = self.health[variant]
        endpoint = self.endpoints[variant]
        while True:
            try:
                response = await self._client.get(endpoint.url + "/health", timeout=2.0)
                if response.status_code == 200:
                    if not self._served[variant]:
                        self._served[variant] = await self._first_model(endpoint)
                    health.mark(True)
                    self._loads[variant] = await self._read_load(endpoint)
                else:
                    health.mark(False, f"/health answered {response.status_code}")
            except httpx.HTTPError as exc:
                health.mark(False, f"/health: {type(exc).__name__}")
            except Exception:  # a probe never ends the worker
                log.exception("probe of engine %s failed", endpoint.url)
            self._health_changed()
            await health.next_probe(self.settings.probe_every_s)

    async def _first_model(self, endpoint: EngineEndpoint) -> str:
        """The model an endpoint serves when none was named: the first it lists."""
        try:
            response = await self._client.get(endpoint.url + "/v1/models", timeout=2.0)
            data = response.json().get("data") if response.status_code == 200 else None
            first = data[0].get("id") if isinstance(data, list) and data else None
            return first if isinstance(first, str) else ""
        except (httpx.HTTPError, ValueError, AttributeError):
            return ""

    async def _read_load(self, endpoint: EngineEndpoint) -> EngineLoad:
        answers: dict[str, str] = {}
        for path in load_paths(endpoint.backend):
            try:
                response = await self._client.get(endpoint.url + path, timeout=2.0)
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                answers[path] = response.text[: 1 << 20]
        return read_load(endpoint.backend, answers)

    # -- serving -------------------------------------------------------------------------
    async def fetch(self, consumer: BatchConsumer) -> list[Record]:
        """A cycle's records: none while the active engine is down, or while enough wait."""
        variant = self._active()
        health = self.health.get(variant)
        if health is None or not await health.wait_up(0.5):
            return []
        calls = self._calls.get(variant)
        room = self.settings.waiting_cap(self.endpoints[variant].slots)
        if calls is not None:
            if not await calls.wait_for_room(0.2):
                return []
            room -= calls.waiting
        batch = await consumer.getmany(timeout_ms=200, max_records=max(1, room))
        return [r for rs in batch.values() for r in rs]

    def _calls_of(self, context: ResultContext, outbox: Outbox) -> EndpointCalls:
        known = self._calls.get(context.variant)
        if known is not None:
            return known
        variant = context.variant
        calls = EndpointCalls(
            self.endpoints[variant],
            self._client,
            self.health[variant],
            context,
            outbox,
            settings=self.settings,
            stream=self._stream,
            served_model=lambda: self._served[variant],
            engine_load=lambda: self._loads[variant],
        )
        self._calls[variant] = calls
        return calls

    async def answer(
        self, jobs: Sequence[Job], context: ResultContext, outbox: Outbox
    ) -> list[Awaitable[object]]:
        calls = self._calls_of(context, outbox)
        return [calls.submit(job) for job in jobs]

    def cancel(self, key: CancelKey) -> bool:
        return any(c.cancel(key) for c in self._calls.values())

    def load(self, variant: str) -> DecodeLoad:
        calls = self._calls.get(variant)
        return calls.load() if calls is not None else DecodeLoad()

    async def close(self) -> None:
        for task in self._probes:
            task.cancel()
        for task in self._probes:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for calls in self._calls.values():
            await calls.close()
        await self._client.aclose()
