"""Continuous batching in the serving path: one running decode batch per variant.

A worker whose model has a KV cache does not run ``GENERATE`` requests per fetched
cycle. Each one is handed to the :class:`ContinuousDecoder` of the variant that is
active when it arrives, which steps a :class:`~graylane.engine_worker.kv_decode.KvDecodeLoop`
on the engine thread for as long as it has sequences: a request fetched while others
decode joins the running batch at the next step (the loop's scheduler bounds the rows,
the prompt tokens prefilled per step and the cache positions reserved), a finished row
leaves at once, and its answer is sent right away, not when its batch-mates finish.

Between two steps, on the event loop (the only writer of the decode loop), the decoder
applies what arrived meanwhile: new sequences, cancels (:meth:`ContinuousDecoder.cancel`:
the sequence leaves the batch with its tokens so far, ``CANCELLED``) and sheds (a
sequence still waiting for a row when its time-to-first-token budget or its deadline
passes is answered ``SHED``: it could not start in time).

A streamed request (``GenerationParams.stream``) gets ordered chunks on its reply topic
as it decodes (:class:`~graylane.engine_worker.logic.streaming.StreamCursor`: a chunk
once ``every_tokens`` new tokens or ``every_ms`` passed, text held back while it could
still be cut by a stop string or ends inside a UTF-8 character) and a final chunk with
the rest, the finish reason, the usage and the timings. The final answer of every
generation goes through the worker's usual delivery (results, shadow pairs,
telemetry); the awaitable :meth:`submit` returns resolves once it and every chunk
before it are acknowledged, so the consume loop commits the request's offset only then
(at-least-once: a restart decodes it again, and a stream restarts at sequence 0).

The decoder builds no protobuf: it hands each generation that ended (a
:class:`~graylane.engine_worker.backend.Decoded` result with its token times, or a
refusal) and each stream chunk (a :class:`~graylane.engine_worker.logic.streaming.ChunkPiece`)
to the worker's :class:`~graylane.engine_worker.backend.Outbox`, which maps them onto the
wire. The streaming bookkeeping is pure (:mod:`~graylane.engine_worker.logic.streaming`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

from graylane.clock import now_ms
from graylane.engine.errors import EngineError, InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.backend import (
    Decoded,
    DecodeLoad,
    Ended,
    EndedTogether,
    Outbox,
    ResultContext,
    TokenTimes,
    settle_when_sent,
)
from graylane.engine_worker.compute import WorkerEngines, engine_rejection
from graylane.engine_worker.kv_decode import GenerationResult, KvDecodeLoop
from graylane.engine_worker.logic.streaming import StreamCursor, StreamPolicy, gap_p99
from graylane.engine_worker.requests import Job, input_rejection
from graylane.engine_worker.state import CancelKey
from graylane.errors import ErrorCode, Rejection

__all__ = ["ContinuousDecoder", "DecoderLimits"]

log = logging.getLogger(__name__)

# --- the running decode batch -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DecoderLimits:
    """What one running decode batch may hold."""

    max_sequences: int
    """Rows decoding together."""
    max_seq_len: int
    max_prefill_tokens: int | None = None
    """Prompt tokens prefilled in one step (one prompt always joins)."""
    max_kv_tokens: int | None = None
    """Cache positions reserved by the running rows together (prompt + max new tokens)."""


@dataclass(eq=False)
class _Live:
    job: Job
    seq_id: int
    cursor: StreamCursor | None
    submitted_ms: int
    ttft_deadline_ms: int
    """Unix ms by which its first token must be out (0: none)."""
    first_token_ms: int = 0
    last_token_ms: int = 0
    started_ms: int = 0
    tokens_seen: int = 0
    gaps_ms: list[float] = field(default_factory=list)
    """Time between consecutive tokens (tokens stamped together share their step's gap)."""
    sends: list[Awaitable[object]] = field(default_factory=list)
    done: asyncio.Future[None] | None = None


class ContinuousDecoder:
    """The running decode batch of one variant, stepped on the engine thread."""

    def __init__(
        self,
        engines: WorkerEngines,
        context: ResultContext,
        engine: InferenceEngine,
        limits: DecoderLimits,
        *,
        stream: StreamPolicy,
        outbox: Outbox,
        pad_id: int = 0,
    ) -> None:
        """Results and stream text are decoded by ``context.tokenizer`` (None: token ids)."""
        self.context = context
        self.variant = context.variant
        self.limits = limits
        self._engines = engines
        self._engine = engine
        self._stream = stream
        tokenizer = context.tokenizer
        self._decode_text = tokenizer.decode if tokenizer is not None else None
        self._outbox = outbox
        self._pad_id = pad_id
        self._loop = self._new_loop()
        self._arrived: list[_Live] = []
        self._live: dict[int, _Live] = {}
        self._by_request: dict[CancelKey, _Live] = {}
        self._cancels: list[CancelKey] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self.rows_stepped = 0
        self.peak_rows = 0

    def _new_loop(self) -> KvDecodeLoop:
        limits = self.limits
        return KvDecodeLoop(
            self._engine,
            max_batch_size=limits.max_sequences,
            max_seq_len=limits.max_seq_len,
            pad_id=self._pad_id,
            max_prefill_tokens=limits.max_prefill_tokens,
            max_kv_tokens=limits.max_kv_tokens,
            decode=self._decode_text,
        )

    @property
    def live(self) -> int:
        """Sequences waiting or decoding (arrived ones included)."""
        return len(self._live) + len(self._arrived)

    # -- the event loop's side -----------------------------------------------------------
    def submit(self, job: Job) -> Awaitable[object]:
        """Queue ``job``; resolves once its answer (and every chunk) is acknowledged."""
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
            stops = tuple(request.generation.stop)
            cursor = StreamCursor(
                self._stream.for_request(
                    request.generation.stream_every_tokens, request.generation.stream_every_ms
                ),
                stops,
            )
        live = _Live(job, -1, cursor, now_ms(), deadline)
        live.done = asyncio.get_running_loop().create_future()
        self._arrived.append(live)
        self._by_request[job.cancel_key] = live
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"decode-{self.variant}")
        return live.done

    def cancel(self, key: CancelKey) -> bool:
        """Stop the generation ``key`` names if it lives here (request id, reply topic and
        cancel token all its own); it ends before the next step. A request id reused
        with another reply topic or token is another generation."""
        if key not in self._by_request:
            return False
        self._cancels.append(key)
        self._wake.set()
        return True

    async def drain_and_close(self, poll_s: float = 0.05) -> None:
        """Let the sequences here finish (new ones go elsewhere), then stop."""
        while self.live:
            await asyncio.sleep(poll_s)
        await self.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- the driver ------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            if not self._arrived and not self._live and not self._cancels:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                ended = self._between_steps()
                if self._live and not self._loop.idle:
                    ended += await self._step()
                if ended:
                    await self._answer(ended)
            except Exception as exc:  # one bad generation never stops the others for good
                log.exception("decode loop of %s failed; answering its sequences", self.variant)
                await self._fail_everything(exc)

    async def _fail_everything(self, exc: Exception) -> None:
        rejection = Rejection(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
        everyone = list(self._live.values()) + self._arrived
        self._live.clear()
        self._arrived = []
        self._loop = self._new_loop()
        ended: list[tuple[_Live, GenerationResult | Rejection]] = []
        for live in everyone:
            live.job.result = None
            ended.append((live, rejection))
        try:
            await self._answer(ended)
        except Exception as again:
            for live in everyone:
                self._settle(live, again)

    def _between_steps(self) -> list[tuple[_Live, GenerationResult | Rejection]]:
        """Apply arrivals, cancels and sheds (event loop side, no step running)."""
        ended: list[tuple[_Live, GenerationResult | Rejection]] = []
        arrived, self._arrived = self._arrived, []
        for live in arrived:
            work = live.job.work
            try:
                live.seq_id = self._loop.submit(
                    work.prompt_tokens, work.max_new_tokens, work.eos_id, sampling=work.sampling
                )
            except InvalidInputError as exc:
                ended.append((live, input_rejection(exc)))
                continue
            self._live[live.seq_id] = live
        cancels, self._cancels = self._cancels, []
        for key in cancels:
            named = self._by_request.get(key)
            if named is None or named.seq_id not in self._live:
                continue
            result = self._loop.cancel(named.seq_id)
            if result is not None:
                del self._live[named.seq_id]
                ended.append((named, result))
        now = now_ms()
        waiting = set(self._loop.scheduler.waiting)
        for seq_id in list(waiting):
            live = self._live[seq_id]
            if live.ttft_deadline_ms and now > live.ttft_deadline_ms:
                self._loop.cancel(seq_id)
                del self._live[seq_id]
                why = (
                    f"no decode row within its time-to-first-token budget "
                    f"({self.live} sequences ahead or running)"
                )
                ended.append((live, Rejection(ErrorCode.SHED, why)))
        return ended

    async def _step(self) -> list[tuple[_Live, GenerationResult | Rejection]]:
        loop = self._loop
        started = now_ms()
        rows = set(loop.scheduler.running)
        t0 = time.perf_counter()
        ended: list[tuple[_Live, GenerationResult | Rejection]] = []
        finished: list[tuple[int, GenerationResult]] = []  # so far in this step
        try:
            if loop.scheduler.waiting:  # joiners: prefill them first
                finished = await self._engines.in_thread(loop.prefill_step)
                if self._stream_due():
                    rows |= self._rows(finished)
                    ended = self._collect(finished, started)
                    finished = []
                    await self._publish(now_ms())
                else:  # the joiners' first tokens exist now, not after the decode step
                    self._stamp_prefilled(finished, started)
                finished = finished + await self._engines.in_thread(loop.decode_step)
            else:  # one engine-thread hop per step when nobody joins
                finished = await self._engines.in_thread(loop.step)
        except EngineError as exc:
            log.exception("engine failure in a decode step of %d rows", len(self._live))
            await self._engines.engine_failed(exc)
            return self._fail_step(ended, finished, started, engine_rejection(exc))
        except Exception as exc:
            log.exception("unexpected error in a decode step")
            rejection = Rejection(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
            return self._fail_step(ended, finished, started, rejection)
        self._engines.health.served()
        self._engines.note_busy(time.perf_counter() - t0)
        rows |= self._rows(finished)
        ended += self._collect(finished, started)
        self.steps += 1
        self.rows_stepped += len(rows)
        self.peak_rows = max(self.peak_rows, len(rows))
        await self._publish(now_ms())
        return ended

    def _fail_step(
        self,
        ended: list[tuple[_Live, GenerationResult | Rejection]],
        finished: list[tuple[int, GenerationResult]],
        started: int,
        rejection: Rejection,
    ) -> list[tuple[_Live, GenerationResult | Rejection]]:
        """A step whose engine call failed: the rows it finished before the failure (a
        prefill's) keep their results, every other row is answered ``rejection``, and
        the decode loop starts anew."""
        ended = ended + self._collect(finished, started) if finished else ended
        ended += [(live, rejection) for live in self._live.values()]
        self._live.clear()
        self._loop = self._new_loop()
        return ended

    def _rows(self, finished: list[tuple[int, GenerationResult]]) -> set[int]:
        """The rows a step ran: those still running and those that finished in it."""
        return set(self._loop.scheduler.running) | {seq_id for seq_id, _ in finished}

    def _stream_due(self) -> bool:
        """Whether a row that just joined streams: its first token goes out before the
        decode step (time to first token), not after it."""
        return any(
            self._live[seq_id].cursor is not None and not self._live[seq_id].first_token_ms
            for seq_id in self._loop.scheduler.running
        )

    def _collect(
        self, finished: list[tuple[int, GenerationResult]], started: int
    ) -> list[tuple[_Live, GenerationResult | Rejection]]:
        """Stamp token times on every row; the rows that finished, with their results."""
        loop = self._loop
        done = now_ms()
        ended: list[tuple[_Live, GenerationResult | Rejection]] = []
        for seq_id, result in finished:
            live = self._live.pop(seq_id)
            self._stamp(live, len(result.tokens), started, done)
            ended.append((live, result))
        for seq_id in loop.scheduler.running:
            self._stamp(self._live[seq_id], len(loop.tokens_of(seq_id)), started, done)
        return ended

    def _stamp_prefilled(self, finished: list[tuple[int, GenerationResult]], started: int) -> None:
        """Stamp the tokens a prefill produced (TTFT), before the same step decodes."""
        loop, done = self._loop, now_ms()
        for seq_id, result in finished:
            self._stamp(self._live[seq_id], len(result.tokens), started, done)
        for seq_id in loop.scheduler.running:
            self._stamp(self._live[seq_id], len(loop.tokens_of(seq_id)), started, done)

    async def _publish(self, at_ms: int) -> None:
        """A chunk for every streamed row that has one due."""
        loop = self._loop
        for seq_id in loop.scheduler.running:
            live = self._live[seq_id]
            cursor = live.cursor
            if cursor is None:
                continue
            tokens = loop.tokens_of(seq_id)
            if cursor.due(len(tokens), float(at_ms)):
                text = self._decode_text(tokens) if self._decode_text else ""
                piece = cursor.take(tokens, text, float(at_ms))
                live.sends.append(await self._outbox.chunk(live.job, piece, self.context))

    @staticmethod
    def _stamp(live: _Live, tokens: int, started: int, done: int) -> None:
        if not live.started_ms:
            live.started_ms = started
        new = tokens - live.tokens_seen
        if new <= 0:
            return
        if live.first_token_ms:
            gap = float(max(0, done - live.last_token_ms)) / new
            live.gaps_ms.extend([gap] * new)
        else:
            live.first_token_ms = done
            if new > 1:  # the first token and more in one hop: the rest share it
                live.gaps_ms.extend([float(max(0, done - started)) / new] * (new - 1))
        live.tokens_seen = tokens
        live.last_token_ms = done

    def load(self) -> DecodeLoad:
        """KV-cache occupancy and waiting sequences of the running batch now."""
        scheduler = self._loop.scheduler
        limits = self.limits
        budget = limits.max_kv_tokens or limits.max_sequences * limits.max_seq_len
        occupancy = scheduler.reserved_kv_tokens / budget if budget > 0 else 0.0
        return DecodeLoad(
            kv_cache_occupancy=min(1.0, occupancy),
            waiting=len(scheduler.waiting) + len(self._arrived),
            running=len(scheduler.running),
        )

    async def _answer(self, ended: list[tuple[_Live, GenerationResult | Rejection]]) -> None:
        """Hand the generations that ended to the outbox, together (one telemetry record)."""
        answers: list[Ended] = []
        for live, end in ended:
            if isinstance(end, Rejection):
                answers.append(Ended(live.job, end))
                continue
            tail = None
            if live.cursor is not None:
                tokens = list(end.tokens)
                text = end.text
                if text is None:
                    text = self._decode_text(tokens) if self._decode_text is not None else ""
                tail = live.cursor.finish(tokens, text, float(now_ms()))
            answers.append(Ended(live.job, Decoded(end, self._times(live)), tail))
        together = EndedTogether(
            ended=tuple(answers),
            context=self.context,
            started_ms=min(live.started_ms or live.submitted_ms for live, _ in ended),
            device_load=self._engines.device_load,
            load=self.load(),
        )
        try:
            sends = await self._outbox.generations(together)
        except Exception as exc:  # the loop's next cycle reads them again
            for live, _ in ended:
                self._settle(live, exc)
            return
        for live, _ in ended:
            self._forget(live)
            settle_when_sent(live.done, [*live.sends, *sends])

    @staticmethod
    def _times(live: _Live) -> TokenTimes:
        return TokenTimes(
            submitted_ms=live.submitted_ms,
            started_ms=live.started_ms,
            first_token_ms=live.first_token_ms,
            last_token_ms=live.last_token_ms,
            inter_token_p99_ms=gap_p99(live.gaps_ms),
        )

    def _forget(self, live: _Live) -> None:
        key = live.job.cancel_key
        if self._by_request.get(key) is live:
            del self._by_request[key]

    def _settle(self, live: _Live, exc: BaseException) -> None:
        self._forget(live)
        if live.done is not None and not live.done.done():
            live.done.set_exception(exc)
