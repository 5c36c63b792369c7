"""A broker outage longer than the producer's request timeout, on a private broker.

Regression (issue 10, item 3): after such an outage an idempotent producer has a
gap in its sequence numbers and the broker refuses its every batch with
``OutOfOrderSequenceNumber``, for ever: the client SDK could not send again until
it was recreated (a worker died of it). Now the producer rebuilds itself: sends
fail visibly while the broker is away, and the same client instance sends again
once it is back. Slow (two broker starts, ~1-2 min); never touches the shared broker.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from aiokafka.errors import KafkaTimeoutError

from graylane.client import GraylaneClient
from graylane.kafka.admin import ensure_topics
from graylane.kafka.recovering import RecoveringProducer, is_fatal_for_producer
from graylane.kafka.seam import KafkaFactory, Producer, ProducerOptions
from graylane.settings import Settings
from tests.support.brokers import PrivateBroker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REQUEST_TIMEOUT_MS = 5_000
MODEL = "gpt"


@dataclass(frozen=True)
class ShortTimeoutFactory(KafkaFactory):
    """Producers with a short request timeout, so that a test outage is "long"."""

    def producer(
        self, options: ProducerOptions | None = None, *, client_suffix: str = "producer"
    ) -> Producer:
        return super().producer(
            options or ProducerOptions(request_timeout_ms=REQUEST_TIMEOUT_MS),
            client_suffix=client_suffix,
        )


async def test_the_same_client_sends_again_after_a_long_outage(
    private_broker: PrivateBroker, unique_prefix: str
) -> None:
    factory = ShortTimeoutFactory(
        Settings(bootstrap_servers=private_broker.bootstrap, topic_prefix=unique_prefix)
    )
    await ensure_topics(factory, factory.layout.model_specs(MODEL, []))
    client = GraylaneClient(factory, listen=False)
    await client.start()
    outcomes: list[str] = []
    errors: list[BaseException] = []
    sending = True

    async def keep_sending() -> None:
        # Sends in flight when the broker goes: their batches time out and leave the gap.
        while sending:
            try:
                await client.submit(MODEL, prompt="hi")
                outcomes.append("ok")
            except Exception as exc:  # what the caller sees
                outcomes.append(type(exc).__name__)
                errors.append(exc)
            await asyncio.sleep(0.05)

    try:
        await client.submit(MODEL, prompt="before")
        producer = client._producer
        assert isinstance(producer, RecoveringProducer)
        assert producer.recreated == 0
        sender = asyncio.create_task(keep_sending())
        await wait_until(lambda: outcomes.count("ok") >= 3, timeout=30, what="steady sends")
        down_at = time.monotonic()
        await asyncio.to_thread(private_broker.run, "stop")
        await wait_until(lambda: any(o != "ok" for o in outcomes), timeout=60, what="a failed send")
        # Longer than the request timeout, whatever the stop took.
        while time.monotonic() - down_at < 3 * REQUEST_TIMEOUT_MS / 1000:
            await asyncio.sleep(0.5)
        await asyncio.to_thread(private_broker.run, "start")
        sending = False
        await sender
        failures = [o for o in outcomes if o != "ok"]
        assert failures  # the outage reached the caller: nothing was swallowed

        async def sends_again() -> bool:
            try:
                await client.submit(MODEL, prompt="after")
            except Exception as exc:
                outcomes.append(type(exc).__name__)
                return False
            return True

        await wait_until(sends_again, timeout=90, poll_s=0.5, what="the same client sends")
        for _ in range(3):
            await client.submit(MODEL, prompt="after, again")  # and keeps sending
        assert client._producer is producer  # the same client and the same wrapper
        # Whether the outage leaves a sequence gap depends on when the broker went: a
        # batch refused with LeaderNotAvailable consumed no sequence number. When a send
        # failed in a way that leaves the gap (a timeout or a fatal producer error), the
        # client is sending on a rebuilt producer.
        if any(is_fatal_for_producer(e) or isinstance(e, KafkaTimeoutError) for e in errors):
            assert producer.recreated >= 1, outcomes
        assert producer.generation == producer.recreated
        print("outcomes:", outcomes, "rebuilt:", producer.recreated)
    finally:
        sending = False
        await client.close()
