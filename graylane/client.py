"""The producer-side SDK: submit requests, read results, or do both in one call.

    from graylane import GraylaneClient, Settings, Task

    async with GraylaneClient(Settings.from_env()) as client:
        result = await client.infer("gpt", prompt="hello", task=Task.GENERATE,
                                    max_new_tokens=16, timeout=10)

Generation is greedy unless the request samples (``temperature`` > 0, with optional
``top_p``, ``sampling_top_k`` and a ``seed`` for reproducible draws); ``stop`` strings
and ``stop_token_ids`` end it early (``Result.finish_reason`` is then ``"STOP"``).

A request goes to its model's ingress topic on the seam's producer
(:mod:`graylane.kafka.seam`); the router forwards it to a version. Results come
back on a per-client reply topic, read by a
:class:`~graylane.kafka.reading.TopicFollower`, and are matched by request_id.
Delivery is at-least-once, so a result can arrive twice; the client hands out
the first and drops the copy. A result no caller waits for (a late one, one of a
request another producer sent naming this reply topic) goes to :meth:`results`, at most
``max_unclaimed`` of them unread; with ``keep_unclaimed=False`` (a client that never
reads :meth:`results`, like the gateway) it is dropped at once. Dropped results are
counted (:attr:`GraylaneClient.unclaimed_dropped`, and ``on_unclaimed``), never queued.

A generation can be streamed: ``async for chunk in client.stream("gpt", prompt=...)``
yields :class:`Chunk` objects in order as the worker publishes them (the last one has
``final`` set, its finish reason and the whole :class:`Result`); leaving the loop
early cancels the generation (:meth:`GraylaneClient.cancel`).

A version served by an engine server (vLLM, TensorRT-LLM, SGLang, llama.cpp) takes a
conversation as ``messages`` (the engine applies its own chat template) and the options
only engines apply (``engine_options``: ``n``, ``logprobs``, ``response_format``,
``tools``, penalties); its results may carry :attr:`Result.logprobs`,
:attr:`Result.tool_calls` and :attr:`Result.extra_choices`. A version served by
Graylane's own decoder refuses those options (``BAD_REQUEST``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType

import numpy as np

from graylane import serde, tracing
from graylane.clock import now_ms
from graylane.errors import ErrorCode, GraylaneError, SerdeError, require_started
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import (
    ClientFactory,
    ConsumerOptions,
    KafkaFactory,
    Producer,
    Record,
    known_topics,
)
from graylane.serde import PostProcess, post_process_to_pb
from graylane.settings import Settings
from graylane.v1 import inference_pb2

__all__ = [
    "Choice",
    "Chunk",
    "ClientError",
    "GraylaneClient",
    "InferenceTimeout",
    "RequestRejected",
    "Result",
    "Task",
    "Timing",
    "TokenLogprob",
    "ToolCall",
    "UnknownModel",
    "Usage",
]

log = logging.getLogger(__name__)

_MAX_CANCEL_TOKENS = 16_384
"""Generations whose cancel token a client keeps: far above any in flight, bounded."""


class Task(Enum):
    FORWARD = inference_pb2.FORWARD
    GENERATE = inference_pb2.GENERATE


class ClientError(GraylaneError):
    """Base of the SDK's errors."""


class InferenceTimeout(ClientError):
    """No result arrived within the timeout."""

    code = ErrorCode.DEADLINE_EXCEEDED
    retriable = True


class RequestRejected(ClientError):
    """The system answered with an error result."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"{result.error_code}: {result.error_message}")
        self.result = result
        self.code = result.code or ErrorCode.ERROR_CODE_UNSPECIFIED


class UnknownModel(ClientError):
    """The model (or pinned version) is not served."""

    code = ErrorCode.UNKNOWN_MODEL

    def __init__(self, message: str, result: Result | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class Timing:
    queue_wait_ms: float
    compute_ms: float
    total_ms: float
    batch_size: int
    ttft_ms: float = 0.0
    """GENERATE: time to first token, from the request's creation."""
    tpot_ms: float = 0.0
    """GENERATE: mean time per output token after the first."""
    created_at_unix_ms: int = 0
    completed_at_unix_ms: int = 0
    """When the worker answered (its clock)."""
    routed_at_unix_ms: int = 0
    """When the router forwarded it to its version."""
    dequeued_at_unix_ms: int = 0
    """When the worker started it (a generation: its decode row or engine call)."""
    prefill_ms: float = 0.0
    """GENERATE: from its start to its first token."""


@dataclass(frozen=True)
class Usage:
    """Tokens a generation read and wrote."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class TokenLogprob:
    """The log probability of one generated token, and of its likeliest alternatives."""

    token: str
    logprob: float
    utf8: bytes = b""
    """The token's UTF-8 bytes (empty when the engine did not say)."""
    top: tuple[tuple[str, float, bytes], ...] = ()
    """The alternatives: (token, log probability, UTF-8 bytes)."""

    @classmethod
    def from_pb(cls, pb: inference_pb2.TokenLogprob) -> TokenLogprob:
        return cls(
            pb.token,
            pb.logprob,
            pb.bytes,
            tuple((t.token, t.logprob, t.bytes) for t in pb.top_logprobs),
        )


@dataclass(frozen=True)
class ToolCall:
    """A tool the model called: its id, the function's name and its JSON arguments."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Choice:
    """A further choice of a generation asked for with ``n`` > 1."""

    index: int
    text: str
    finish_reason: str
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()


def _logprobs(pbs: Sequence[inference_pb2.TokenLogprob]) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob.from_pb(pb) for pb in pbs)


def _tool_calls(pbs: Sequence[inference_pb2.ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(pb.id, pb.name, pb.arguments) for pb in pbs)


@dataclass(frozen=True)
class Result:
    """An inference result, decoded from the wire."""

    request_id: str
    model: str
    version: str
    variant: str
    ok: bool
    error_code: str
    """The :class:`~graylane.errors.ErrorCode` name (``UNKNOWN`` for a number this SDK
    does not know); empty when ``ok``."""
    error_message: str
    outputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    tokens: tuple[int, ...] = ()
    text: str = ""
    timing: Timing = Timing(0.0, 0.0, 0.0, 0)
    client_latency_ms: float | None = None
    worker_id: str = ""
    """The worker that answered (run or shed it)."""
    finish_reason: str = ""
    """GENERATE: why it ended, the ``graylane.v1.FinishReason`` name (``LENGTH``, ``STOP``,
    ``EOS``, ``MAX_SEQUENCE``, ...); empty for other results."""
    usage: Usage | None = None
    """GENERATE: prompt and generated token counts; ``None`` for other results."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """GENERATE with ``logprobs`` (engine servers): its tokens' log probabilities."""
    tool_calls: tuple[ToolCall, ...] = ()
    """GENERATE with ``tools`` (engine servers): the calls the model made."""
    extra_choices: tuple[Choice, ...] = ()
    """GENERATE with ``n`` > 1 (engine servers): choices 1..n-1."""

    @classmethod
    def from_pb(cls, pb: inference_pb2.InferenceResult, sent_ms: int | None) -> Result:
        ok = pb.status == inference_pb2.OK
        return cls(
            request_id=pb.request_id,
            model=pb.model,
            version=pb.version,
            variant=pb.variant,
            ok=ok,
            error_code="" if ok else _error_code_name(pb.error_code),
            error_message=pb.error_message,
            outputs=serde.from_tensors(pb.outputs),
            tokens=tuple(pb.generated_token_ids),
            text=pb.text,
            timing=Timing(
                pb.timing.queue_wait_ms,
                pb.timing.compute_ms,
                pb.timing.total_ms,
                pb.timing.batch_size,
                pb.timing.ttft_ms,
                pb.timing.tpot_ms,
                pb.timing.created_at_unix_ms,
                pb.timing.completed_at_unix_ms,
                pb.timing.routed_at_unix_ms,
                pb.timing.dequeued_at_unix_ms,
                pb.timing.prefill_ms,
            ),
            client_latency_ms=float(now_ms() - sent_ms) if sent_ms else None,
            worker_id=pb.worker_id,
            finish_reason=_finish_reason_name(pb.finish_reason),
            usage=Usage(pb.usage.prompt_tokens, pb.usage.completion_tokens)
            if pb.HasField("usage")
            else None,
            logprobs=_logprobs(pb.logprobs),
            tool_calls=_tool_calls(pb.tool_calls),
            extra_choices=tuple(
                Choice(
                    c.index,
                    c.text,
                    _finish_reason_name(c.finish_reason),
                    _logprobs(c.logprobs),
                    _tool_calls(c.tool_calls),
                )
                for c in pb.extra_choices
            ),
        )

    @property
    def code(self) -> ErrorCode | None:
        """The error as an :class:`~graylane.errors.ErrorCode`; None when ``ok`` or unknown."""
        return ErrorCode.__members__.get(self.error_code)


@dataclass(frozen=True)
class Chunk:
    """One piece of a streamed generation: the tokens and text new since the previous one."""

    request_id: str
    sequence: int
    tokens: tuple[int, ...]
    text: str
    final: bool
    finish_reason: str = ""
    """On the final chunk: ``LENGTH``, ``STOP``, ``EOS``, ``CANCELLED``, ``FAILED`` or
    ``MAX_SEQUENCE`` (as :attr:`Result.finish_reason`)."""
    result: Result | None = None
    """On the final chunk: the request's result (its timing, usage, version); its
    tokens and text are the final chunk's own."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """The log probabilities of this chunk's tokens (``logprobs`` asked, engine servers)."""


class _Stream:
    """Chunks of one streamed request, in sequence order, duplicates dropped."""

    def __init__(self, sent_ms: int) -> None:
        self.sent_ms = sent_ms
        self.next = 0
        self.queue: asyncio.Queue[Chunk | Result] = asyncio.Queue()

    def take(self, pb: inference_pb2.InferenceResult) -> None:
        if not pb.HasField("chunk"):  # an error answered before anything ran
            self.queue.put_nowait(Result.from_pb(pb, self.sent_ms))
            return
        if pb.chunk.sequence != self.next:
            return  # a re-sent chunk (at-least-once), or a restarted stream's repeat
        self.next += 1
        final = pb.chunk.final
        self.queue.put_nowait(
            Chunk(
                request_id=pb.request_id,
                sequence=pb.chunk.sequence,
                tokens=tuple(pb.generated_token_ids),
                text=pb.text,
                final=final,
                finish_reason=_finish_reason_name(pb.finish_reason) if final else "",
                result=Result.from_pb(pb, self.sent_ms) if final else None,
                logprobs=_logprobs(pb.logprobs),
            )
        )


class GraylaneClient:
    """Submits inference requests over Kafka and collects their results.

    ``factory`` builds its Kafka clients; given :class:`~graylane.settings.Settings`,
    the client builds the real ones (:class:`~graylane.kafka.seam.KafkaFactory`).
    """

    def __init__(
        self,
        factory: ClientFactory | Settings,
        *,
        client_id: str | None = None,
        listen: bool = True,
        max_seen: int = 100_000,
        keep_unclaimed: bool = True,
        max_unclaimed: int = 10_000,
        on_unclaimed: Callable[[], None] | None = None,
    ) -> None:
        self.factory: ClientFactory = (
            KafkaFactory(factory) if isinstance(factory, Settings) else factory
        )
        self.layout = self.factory.layout
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        self.reply_topic = self.layout.reply(self.client_id)
        self._listen = listen
        self._producer: Producer | None = None
        self._reader: TopicFollower | None = None
        self._waiters: dict[str, asyncio.Future[Result]] = {}
        self._streams: dict[str, _Stream] = {}
        self._sent_at: OrderedDict[str, int] = OrderedDict()  # bounded by max_seen
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._max_seen = max_seen
        self._keep_unclaimed = keep_unclaimed
        self._queue: asyncio.Queue[Result] = asyncio.Queue(maxsize=max(1, max_unclaimed))
        self._on_unclaimed = on_unclaimed
        self.unclaimed_dropped = 0
        """Results no caller waited for, dropped (none is held beyond ``max_unclaimed``)."""
        self._known_models: set[str] | None = None
        self._cancel_tokens: OrderedDict[str, str] = OrderedDict()
        """Request id -> the cancel token of a generation sent (bounded, newest kept)."""

    async def __aenter__(self) -> GraylaneClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        if self._listen:
            await self.factory.ensure_topics([self.layout.reply_spec(self.client_id)])
            reader = TopicFollower(
                self.factory,
                self.reply_topic,
                self._on_result,
                start_at=FollowFrom.END,  # positioned before start() returns: nothing is missed
                partitions=[0],
                options=ConsumerOptions(group_id=None, fetch_max_wait_ms=20),
                client_suffix=self.client_id,
                poll_ms=500,
            )
            await reader.start()
            self._reader = reader
        self._producer = self.factory.producer(client_suffix=self.client_id)
        await self._producer.start()

    async def close(self) -> None:
        try:
            if self._reader is not None:
                await self._reader.stop()
        finally:
            if self._producer is not None:
                await self._producer.stop()

    def _on_result(self, record: Record) -> None:
        """Hand a result to its waiter, or to :meth:`results`; drop duplicates."""
        try:
            pb = serde.decode(inference_pb2.InferenceResult, record.value)
        except SerdeError as exc:
            log.error("undecodable result on %s: %s", self.reply_topic, exc)
            return
        if pb.request_id in self._seen:
            return  # an at-least-once duplicate
        stream = self._streams.get(pb.request_id)
        if stream is not None:
            try:
                stream.take(pb)
            except Exception as exc:  # one bad record must not end the reader
                log.error("unreadable chunk %r: %s", pb.request_id[:128], exc)
            return
        try:
            result = Result.from_pb(pb, self._sent_at.get(pb.request_id))
        except Exception as exc:  # one bad record must not end the reader
            log.error("unreadable result %r on %s: %s", pb.request_id[:128], self.reply_topic, exc)
            return
        self._forget(pb.request_id)
        waiter = self._waiters.pop(pb.request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(result)
        elif self._keep_unclaimed and not self._queue.full():
            self._queue.put_nowait(result)
        else:
            self._drop_unclaimed()

    def _drop_unclaimed(self) -> None:
        self.unclaimed_dropped += 1
        if self._on_unclaimed is not None:
            self._on_unclaimed()

    def _forget(self, request_id: str) -> None:
        """Mark ``request_id`` answered: any later result for it is dropped."""
        self._sent_at.pop(request_id, None)
        self._seen[request_id] = None
        if len(self._seen) > self._max_seen:
            self._seen.popitem(last=False)

    def build_request(
        self,
        model: str,
        *,
        inputs: Mapping[str, np.ndarray] | None = None,
        prompt: str = "",
        token_ids: list[int] | None = None,
        task: Task = Task.FORWARD,
        post_process: PostProcess = PostProcess.NONE,
        top_k: int = 0,
        max_new_tokens: int = 0,
        eos_token_id: int | None = None,
        temperature: float = 0.0,
        top_p: float = 0.0,
        sampling_top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        routing_key: str = "",
        tags: Mapping[str, str] | None = None,
        deadline_s: float | None = None,
        pinned_version: str = "",
        request_id: str | None = None,
        reply_topic: str | None = None,
        stream: bool = False,
        stream_every_tokens: int = 0,
        stream_every_ms: int = 0,
        ttft_deadline_ms: int = 0,
        messages: Sequence[inference_pb2.ChatMessage] = (),
        turn_end: Sequence[str] = (),
        engine_options: inference_pb2.EngineOptions | None = None,
    ) -> inference_pb2.InferenceRequest:
        """A request for ``model``; :meth:`infer` and :meth:`submit` take the same arguments.

        ``top_k`` is the ``TOPK_LAST`` post-process of a FORWARD; a GENERATE samples
        with ``temperature`` (0 = greedy), ``top_p`` (0 = off), ``sampling_top_k``
        (0 = off) and ``seed`` (``None``: a different draw each time), and stops at
        ``stop`` strings (the text is cut before them) or ``stop_token_ids``. The
        worker checks them and answers ``BAD_REQUEST`` for values it refuses.

        ``messages`` is a conversation for a version served by an engine server (which
        applies its own chat template; give ``prompt`` too, rendered, for versions served
        by Graylane's decoder, and ``turn_end``: the stop strings that close the
        assistant's turn in that rendering). ``engine_options`` are the OpenAI options
        only engine servers apply.
        """
        if isinstance(stop, str):
            raise TypeError("stop takes a sequence of strings, not one string")
        created = now_ms()
        return inference_pb2.InferenceRequest(
            request_id=request_id or uuid.uuid4().hex,
            model=model,
            routing_key=routing_key,
            tags=dict(tags or {}),
            inputs=serde.to_tensors(inputs or {}),
            prompt=prompt,
            token_ids=list(token_ids or []),
            task=task.value,
            generation=inference_pb2.GenerationParams(
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_token_id or 0,
                has_eos=eos_token_id is not None,
                stream=stream,
                stream_every_tokens=stream_every_tokens,
                stream_every_ms=stream_every_ms,
                ttft_deadline_ms=ttft_deadline_ms,
                temperature=temperature,
                top_p=top_p,
                sampling_top_k=sampling_top_k,
                seed=seed or 0,
                has_seed=seed is not None,
                stop=list(stop),
                stop_token_ids=list(stop_token_ids),
                turn_end=list(turn_end),
            ),
            messages=list(messages),
            engine_options=engine_options,
            post_process=post_process_to_pb(post_process),
            top_k=top_k,
            deadline_unix_ms=int(created + deadline_s * 1000) if deadline_s else 0,
            reply_topic=reply_topic
            if reply_topic is not None
            else (self.reply_topic if self._listen else ""),
            created_at_unix_ms=created,
            pinned_version=pinned_version,
            # only this client's cancels, which carry it, stop the generation
            cancel_token=secrets.token_urlsafe(16) if task is Task.GENERATE else "",
        )

    async def send(self, request: inference_pb2.InferenceRequest, *, version: str = "") -> str:
        """Publish a prepared request to its model's ingress topic; with ``version``,
        straight to that version's topic, past the router (an evaluator's or an
        operator's way to reach one version: producers normally write the ingress only,
        and Kafka's ACLs may say so)."""
        producer = require_started(self._producer)
        topic = (
            self.layout.version_requests(request.model, version)
            if version
            else self.layout.ingress(request.model)
        )
        await self._check_topic(topic, request.model)
        self._sent_at[request.request_id] = request.created_at_unix_ms or now_ms()
        if len(self._sent_at) > self._max_seen:
            self._sent_at.popitem(last=False)
        if request.cancel_token:
            self._cancel_tokens[request.request_id] = request.cancel_token
            if len(self._cancel_tokens) > _MAX_CANCEL_TOKENS:
                self._cancel_tokens.popitem(last=False)
        traced = {"graylane.model": request.model, "graylane.request_id": request.request_id}
        with tracing.producing("graylane.client send", traced) as headers:
            await producer.send_and_wait(  # the broker's ack, or its error, reaches the caller
                topic,
                serde.encode(request),
                key=(request.routing_key or request.request_id).encode("utf-8"),
                headers=headers or None,
            )
        return request.request_id

    async def _check_topic(self, topic: str, model: str) -> None:
        """Refuse a model (or version) without its topic at once (a send would hang)."""
        if self._known_models is not None and topic in self._known_models:
            return
        self._known_models = await known_topics(require_started(self._producer))
        if topic not in self._known_models:
            raise UnknownModel(f"model {model!r} is not served: topic {topic} does not exist")

    async def topics(self) -> set[str]:
        """Every topic the cluster knows now (a metadata request on this client's producer)."""
        return await known_topics(require_started(self._producer))

    async def submit(self, model: str, **kwargs: object) -> str:
        """Publish a request (see :meth:`build_request` for the arguments); returns its id."""
        return await self.send(self.build_request(model, **kwargs))  # type: ignore[arg-type]

    async def flush(self) -> None:
        await require_started(self._producer).flush()

    async def results(self) -> AsyncIterator[Result]:
        """Results of submitted requests, in arrival order (each request once)."""
        while True:
            yield await self._queue.get()

    async def stream(
        self, model: str, *, timeout: float = 30.0, **kwargs: object
    ) -> AsyncIterator[Chunk]:
        """Submit a streamed generation and yield its chunks in order, the final one last.

        ``timeout`` bounds the wait for each chunk. Leaving the loop before the final
        chunk (``break``, an exception, a cancelled task) cancels the generation.
        Raises :class:`RequestRejected` (or :class:`UnknownModel`) on an error answer.
        """
        kwargs.setdefault("task", Task.GENERATE)
        request = self.build_request(model, stream=True, **kwargs)  # type: ignore[arg-type]
        stream = _Stream(request.created_at_unix_ms)
        self._streams[request.request_id] = stream
        finished = False
        try:
            await self.send(request)
            while True:
                try:
                    item = await asyncio.wait_for(stream.queue.get(), timeout)
                except TimeoutError:
                    raise InferenceTimeout(
                        f"no chunk of {request.request_id} ({model!r}) within {timeout}s"
                    ) from None
                if isinstance(item, Result):
                    finished = True
                    _raise_for(item)
                    continue
                finished = item.final
                yield item
                if item.final:
                    if item.result is not None:
                        _raise_for(item.result)
                    return
        finally:
            self._streams.pop(request.request_id, None)
            self._forget(request.request_id)
            if not finished:
                with contextlib.suppress(Exception):
                    await self.cancel(request.request_id, model=model)

    async def cancel(self, request_id: str, *, model: str = "") -> None:
        """Ask the workers to stop generating ``request_id`` (sent on this client's behalf:
        a worker honours it only for a request that named this client's reply topic and
        carries the cancel token this client gave it)."""
        cancel = inference_pb2.CancelRequest(
            request_id=request_id,
            reply_topic=self.reply_topic if self._listen else "",
            model=model,
            created_at_unix_ms=now_ms(),
            cancel_token=self._cancel_tokens.pop(request_id, ""),
        )
        await require_started(self._producer).send_and_wait(
            self.layout.cancels(), serde.encode(cancel), key=request_id.encode("utf-8")
        )

    @property
    def waiting(self) -> int:
        """Requests sent whose answer (a result or a stream) this client still awaits."""
        return len(self._waiters) + len(self._streams)

    async def infer(
        self, model: str, *, timeout: float = 30.0, version: str = "", **kwargs: object
    ) -> Result:
        """Submit and wait for the result; raises on timeout or an error result.
        ``version``: straight to that version's topic (see :meth:`send`)."""
        request = self.build_request(model, **kwargs)  # type: ignore[arg-type]
        waiter: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = waiter
        try:
            await self.send(request, version=version)
            result = await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise InferenceTimeout(
                f"no result for request {request.request_id} of {model!r} within {timeout}s"
            ) from None
        finally:
            self._waiters.pop(request.request_id, None)
            if waiter.cancelled() or not waiter.done():
                self._forget(request.request_id)  # a late result is dropped, not queued
        _raise_for(result)
        return result


def _raise_for(result: Result) -> None:
    """Raise the client error of an error result."""
    if not result.ok:
        if result.code in (ErrorCode.UNKNOWN_MODEL, ErrorCode.UNKNOWN_VERSION):
            raise UnknownModel(f"{result.error_code}: {result.error_message}", result)
        raise RequestRejected(result)


def _finish_reason_name(value: int) -> str:
    """The name of a ``graylane.v1.FinishReason`` (empty when unset, ``UNKNOWN`` if new)."""
    if value == inference_pb2.FINISH_REASON_UNSPECIFIED:
        return ""
    try:
        return inference_pb2.FinishReason.Name(value)
    except ValueError:
        return "UNKNOWN"


def _error_code_name(value: int) -> str:
    """The name of ``value``'s code; ``UNKNOWN`` for a number this SDK does not know."""
    code = ErrorCode.of(value)
    return "UNKNOWN" if code is None else code.name
