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
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from graylane.client import GraylaneClient
from graylane.kafka.admin import ensure_topics
from graylane.kafka.recovering import RecoveringProducer
from graylane.kafka.seam import KafkaFactory, Producer, ProducerOptions
from graylane.settings import Settings
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.py"
REQUEST_TIMEOUT_MS = 5_000
MODEL = "gpt"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PrivateBroker:
    env: dict[str, str]
    bootstrap: str

    def run(self, action: str) -> None:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), action],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    port = _free_port()
    env = dict(os.environ)
    env.update(
        GRAYLANE_LOCAL_DIR=str(tmp_path / "local"),
        GRAYLANE_KAFKA_PORT=str(port),
        GRAYLANE_KAFKA_CONTROLLER_PORT=str(_free_port()),
    )
    broker = PrivateBroker(env, f"127.0.0.1:{port}")
    broker.run("start")
    try:
        yield broker
    finally:
        broker.run("stop")  # only the private one: found through its own local dir


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
        producer = client._producer
        assert isinstance(producer, RecoveringProducer)
        print("outcomes:", outcomes, "rebuilt:", producer.recreated)
    finally:
        sending = False
        await client.close()
