"""The chaos bench's traffic: a paced load through the client SDK, every send and every
result on record, and followers of the reply and rollout topics that survive outages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from graylane import serde
from graylane.client import GraylaneClient, PostProcess
from graylane.errors import SerdeError
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import KafkaFactory, Record
from graylane.v1 import inference_pb2, rollout_pb2

log = logging.getLogger(__name__)

MAX_PENDING_SENDS = 50_000


@dataclass
class Sent:
    """One request of the steady load."""

    phase: str
    sent_at: float
    acked_at: float | None = None
    failure: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    at: float
    ok: bool
    code: str


@dataclass
class Ledger:
    """Every request sent and every result read back (duplicates included)."""

    sent: dict[str, Sent] = field(default_factory=dict)
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    undecodable: int = 0
    waiters: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    def on_result(self, record: Record) -> None:
        try:
            pb = serde.decode(inference_pb2.InferenceResult, record.value)
        except SerdeError:
            self.undecodable += 1
            return
        ok = pb.status == inference_pb2.OK
        code = "" if ok else _code_name(pb.error_code)
        self.answers.setdefault(pb.request_id, []).append(Answer(time.monotonic(), ok, code))
        waiter = self.waiters.pop(pb.request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def first_answer(self, request_id: str) -> Answer | None:
        got = self.answers.get(request_id)
        return got[0] if got else None

    def unanswered(self, phase: str, sent_before: float) -> int:
        return sum(
            1
            for rid, s in self.sent.items()
            if s.phase == phase
            and s.acked_at is not None
            and s.sent_at < sent_before
            and rid not in self.answers
        )


def _code_name(code: int) -> str:
    try:
        return inference_pb2.ErrorCode.Name(code)
    except ValueError:
        return str(code)


class Follower:
    """Every record of a topic from its beginning, each (partition, offset) handled once;
    a follower that fails (a broker outage) is started again."""

    def __init__(
        self, factory: KafkaFactory, topic: str, handle: Callable[[Record], None], name: str
    ) -> None:
        self._factory, self._topic, self._handle, self._name = factory, topic, handle, name
        self._seen: set[tuple[int, int]] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.restarts = 0
        self.started = asyncio.Event()

    def _on(self, record: Record) -> None:
        mark = (record.partition, record.offset)
        if mark in self._seen:
            return
        self._seen.add(mark)
        self._handle(record)

    async def _run(self) -> None:
        while not self._stop.is_set():
            follower = TopicFollower(
                self._factory,
                self._topic,
                self._on,
                start_at=FollowFrom.BEGINNING,
                client_suffix=f"chaos-{self._name}-{uuid.uuid4().hex[:4]}",
                poll_ms=200,
            )
            try:
                await follower.start()
                self.started.set()
                await follower.run_until(self._stop)
            except Exception as exc:  # an outage: read again from the beginning, skip what was seen
                log.warning("follower of %s failed (%s); starting again", self._topic, exc)
            finally:
                with contextlib.suppress(Exception):
                    await follower.stop()
            if not self._stop.is_set():
                self.restarts += 1
                await asyncio.sleep(1.0)

    async def start(self, timeout_s: float = 60.0) -> None:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.started.wait(), timeout_s)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 30)


@dataclass(frozen=True, slots=True)
class SeenState:
    seen_at: float
    state: rollout_pb2.RolloutState


class RolloutWatch:
    """Rollout states as the policy engine writes them."""

    def __init__(self) -> None:
        self.states: list[SeenState] = []

    def on_record(self, record: Record) -> None:
        if not record.value:
            return
        try:
            state = serde.decode(rollout_pb2.RolloutState, record.value)
        except SerdeError:
            return
        self.states.append(SeenState(time.monotonic(), state))

    def latest(self, rollout_id: str) -> rollout_pb2.RolloutState | None:
        for seen in reversed(self.states):
            if seen.state.rollout_id == rollout_id:
                return seen.state
        return None

    def first_since(self, rollout_id: str, unix_ms: int) -> rollout_pb2.RolloutState | None:
        for seen in self.states:
            if seen.state.rollout_id == rollout_id and seen.state.updated_at_unix_ms >= unix_ms:
                return seen.state
        return None


class Load:
    """An open-loop load at ``rate`` req/s through one SDK client; each send is its own task,
    so a send that hangs (broker down) does not slow the pace."""

    def __init__(
        self, client: GraylaneClient, model: str, reply_topic: str, ledger: Ledger
    ) -> None:
        self.client = client
        self.model = model
        self.reply_topic = reply_topic
        self.ledger = ledger
        self.rate = 10.0
        self.phase = "warmup"
        self.skipped = 0
        self._pending: set[asyncio.Task[None]] = set()
        self._tokens = [(7 * k) % 250 + 3 for k in range(32)]

    def request(self) -> inference_pb2.InferenceRequest:
        return self.client.build_request(
            self.model,
            token_ids=self._tokens,
            routing_key=f"user-{uuid.uuid4().hex[:8]}",
            post_process=PostProcess.ARGMAX_LAST,
            reply_topic=self.reply_topic,
        )

    def send_one(self) -> str:
        req = self.request()
        sent = Sent(self.phase, time.monotonic())
        self.ledger.sent[req.request_id] = sent
        task = asyncio.create_task(self._send(req, sent, self.client))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return req.request_id

    @staticmethod
    async def _send(
        req: inference_pb2.InferenceRequest, sent: Sent, client: GraylaneClient
    ) -> None:
        try:
            await client.send(req)
            sent.acked_at = time.monotonic()
        except Exception as exc:  # the SDK surfaced a failed send: not acknowledged
            sent.failure = f"{type(exc).__name__}: {exc}"[:200]

    async def run(self, stop: asyncio.Event) -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            if len(self._pending) < MAX_PENDING_SENDS:
                self.send_one()
            else:
                self.skipped += 1
            next_at += 1.0 / self.rate
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -1.0:
                next_at = time.monotonic()  # fell behind: do not burst to catch up
            else:
                await asyncio.sleep(0)

    async def settle_sends(self, timeout_s: float) -> None:
        """Wait for every send in flight to be acknowledged or to fail."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)
