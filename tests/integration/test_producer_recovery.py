"""A broker outage longer than the producer's request timeout, on a private broker.

Regression (issue 10, item 3): after such an outage an idempotent producer has a
gap in its sequence numbers and the broker refuses its every batch with
``OutOfOrderSequenceNumber``, for ever: the client SDK could not send again until
it was recreated (a worker died of it). Now the producer rebuilds itself: sends
fail visibly while the broker is away, and the same client instance sends again
once it is back.

The outage is a broker that stops answering (frozen with SIGSTOP): every batch in
flight then times out, which is what leaves the gap, so the rebuild is exercised on
every run. (A broker that shuts down cleanly may refuse batches with
``LeaderNotAvailable`` before they take a sequence number; then nothing needs
rebuilding.) Never touches the shared broker.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass

import pytest

from graylane.client import GraylaneClient
from graylane.kafka.admin import ensure_topics
from graylane.kafka.recovering import RecoveringProducer
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
    sending = True

    async def keep_sending() -> None:
        # Sends in flight when the broker goes: their batches time out and leave the gap.
        while sending:
            try:
                await client.submit(MODEL, prompt="hi")
                outcomes.append("ok")
            except Exception as exc:  # what the caller sees
                outcomes.append(type(exc).__name__)
            await asyncio.sleep(0.05)

    try:
        await client.submit(MODEL, prompt="before")
        producer = client._producer
        assert isinstance(producer, RecoveringProducer)
        assert producer.recreated == 0
        sender = asyncio.create_task(keep_sending())
        await wait_until(lambda: outcomes.count("ok") >= 3, timeout=30, what="steady sends")
        os.kill(private_broker.pid, signal.SIGSTOP)  # the broker stops answering
        try:
            # Batches in flight time out: the producer records its own generation broken
            # (the sequence gap is there), and the caller sees its sends fail.
            await wait_until(lambda: producer.broken, timeout=60, what="a timed-out batch")
            await wait_until(
                lambda: any(o != "ok" for o in outcomes), timeout=60, what="a failed send"
            )
        finally:
            os.kill(private_broker.pid, signal.SIGCONT)
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
        # The client sends on a rebuilt producer (a new producer id: no sequence gap).
        assert producer.recreated >= 1, outcomes
        assert producer.generation == producer.recreated
        assert not producer.broken
        print("outcomes:", outcomes, "rebuilt:", producer.recreated)
    finally:
        sending = False
        await client.close()
