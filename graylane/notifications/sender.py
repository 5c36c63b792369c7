"""Post transitions to webhooks, off the decision path.

:meth:`WebhookSender.offer` never blocks and never raises: it puts the delivery on
the bounded queue of its webhook URL and returns; a full queue dead-letters the
delivery at once. One worker per URL posts its queue in order (a receiver sees a
rollout's transitions in the order they were decided) and a slow or dead receiver
delays only its own queue. A delivery is tried ``attempts`` times with capped,
jittered exponential backoff between tries; a 4xx answer other than 408 / 429 is
final at once. What is not delivered goes to the dead-letter callback with the body
and the reason. The HMAC key is read from the webhook's ``secret_file`` at each
delivery (a rotated secret takes effect without a restart); an unreadable secret
file dead-letters the delivery: it is never sent unsigned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from graylane.kafka.backoff import BackoffPolicy
from graylane.notifications.transitions import Transition
from graylane.notifications.webhook import EVENT_ID_HEADER, SIGNATURE_HEADER, body_of, sign
from graylane.rollouts.spec import WebhookFormat, WebhookTarget

__all__ = ["SenderPolicy", "WebhookDelivery", "WebhookSender"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WebhookDelivery:
    """One transition for one webhook."""

    transition: Transition
    target: WebhookTarget


@dataclass(frozen=True, kw_only=True)
class SenderPolicy:
    """Bounds of the sender: queue per URL, URLs, tries, timeout and backoff."""

    queue_size: int = 256
    max_targets: int = 64
    attempts: int = 5
    timeout_s: float = 5.0
    backoff: BackoffPolicy = field(
        default_factory=lambda: BackoffPolicy(base_s=0.5, cap_s=30.0, jitter=0.2)
    )

    def __post_init__(self) -> None:
        if self.queue_size < 1 or self.max_targets < 1 or self.attempts < 1:
            raise ValueError("queue_size, max_targets and attempts must be at least 1")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")


DeadLetters = Callable[[WebhookDelivery, bytes, str], Awaitable[None]]
"""Keeps an undelivered delivery: (delivery, body, reason)."""


class WebhookSender:
    def __init__(
        self,
        dead_letters: DeadLetters,
        policy: SenderPolicy | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.policy = policy or SenderPolicy()
        self._dead_letters = dead_letters
        self._client = httpx.AsyncClient(timeout=self.policy.timeout_s, transport=transport)
        self._queues: dict[str, asyncio.Queue[WebhookDelivery]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._side: set[asyncio.Task[None]] = set()
        self._current: dict[str, WebhookDelivery] = {}
        """The delivery each URL's worker is trying now."""
        self.delivered = 0
        self.retried = 0
        self.dead_lettered = 0

    def offer(self, delivery: WebhookDelivery) -> bool:
        """Queue ``delivery`` (never waits); False when it was dead-lettered instead."""
        url = delivery.target.url
        queue = self._queues.get(url)
        if queue is None:
            if len(self._queues) >= self.policy.max_targets:
                self._dead_letter_later(delivery, f"more than {self.policy.max_targets} webhooks")
                return False
            queue = asyncio.Queue(self.policy.queue_size)
            self._queues[url] = queue
            self._workers[url] = asyncio.create_task(self._work(queue), name=f"webhook {url}")
        try:
            queue.put_nowait(delivery)
        except asyncio.QueueFull:
            self._dead_letter_later(
                delivery, f"the queue of {url} is full ({self.policy.queue_size})"
            )
            return False
        return True

    def pending(self) -> int:
        """Deliveries queued, over every webhook."""
        return sum(q.qsize() for q in self._queues.values())

    async def close(self) -> None:
        """Stop the workers; what is still queued or being tried is dead-lettered."""
        left = [*self._current.values()]  # before the workers' ends forget them
        for task in self._workers.values():
            task.cancel()
        for task in self._workers.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for queue in self._queues.values():
            while not queue.empty():
                left.append(queue.get_nowait())
        for delivery in left:
            await self._dead_letter(delivery, _body(delivery), "the sender stopped before it")
        if self._side:
            await asyncio.gather(*self._side, return_exceptions=True)
        await self._client.aclose()

    def _dead_letter_later(self, delivery: WebhookDelivery, reason: str) -> None:
        task = asyncio.create_task(self._dead_letter(delivery, _body(delivery), reason))
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _dead_letter(self, delivery: WebhookDelivery, body: bytes, reason: str) -> None:
        self.dead_lettered += 1
        log.warning(
            "webhook %s: %s of %s not delivered: %s",
            delivery.target.url,
            delivery.transition.kind.value,
            delivery.transition.rollout_id,
            reason,
        )
        try:
            await self._dead_letters(delivery, body, reason)
        except Exception as exc:  # the dead letter is lost; say so, go on
            log.error("webhook dead letter not written: %s", exc)

    async def _work(self, queue: asyncio.Queue[WebhookDelivery]) -> None:
        while True:
            delivery = await queue.get()
            self._current[delivery.target.url] = delivery
            try:
                await self._deliver(delivery)
            except Exception as exc:  # never end the worker on one delivery
                await self._dead_letter(delivery, _body(delivery), f"failed: {exc!r}")
            finally:
                self._current.pop(delivery.target.url, None)
                queue.task_done()
            if queue.empty():
                # Nothing waits: end this worker, so the URL no longer counts against
                # max_targets (the next offer starts a fresh one; no await between the
                # check and the removal, so no delivery can slip in between).
                url = delivery.target.url
                self._queues.pop(url, None)
                self._workers.pop(url, None)
                return

    async def _deliver(self, delivery: WebhookDelivery) -> None:
        target = delivery.target
        body = _body(delivery)
        headers = {
            "Content-Type": "application/cloudevents+json"
            if target.format is WebhookFormat.CLOUDEVENTS
            else "application/json",
            "User-Agent": "graylane-notifier",
            EVENT_ID_HEADER: delivery.transition.decision_id,
        }
        if target.secret_file:
            try:
                secret = Path(target.secret_file).read_bytes().strip()
            except OSError as exc:
                await self._dead_letter(delivery, body, f"secret file unreadable: {exc}")
                return
            headers[SIGNATURE_HEADER] = sign(secret, body)
        why = ""
        for attempt in range(self.policy.attempts):
            if attempt:
                self.retried += 1
                await asyncio.sleep(self.policy.backoff.delay(attempt - 1, random.random()))
            try:
                answer = await self._client.post(target.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
                continue
            if answer.is_success:
                self.delivered += 1
                return
            why = f"HTTP {answer.status_code}"
            if 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
                break
        await self._dead_letter(
            delivery, body, f"{why} after {attempt + 1} of {self.policy.attempts} tries"
        )


def _body(delivery: WebhookDelivery) -> bytes:
    return body_of(delivery.transition, delivery.target.format)
