"""One Kafka pass-through hop (consume -> produce, no other work), as a process of its own.

``graylane bench path`` runs two of them in a row (in -> mid -> out: the router ->
worker topology with nothing in between) as the ceiling of what Kafka carries on
this machine, once with librdkafka (confluent-kafka) and once with aiokafka, so the
two clients are compared in the same run. Both producers are idempotent with
``acks=all`` (the services' producer settings); offsets are committed automatically
(a ceiling, not a service: at-least-once bookkeeping is the path's own cost).

Run as ``python -m graylane.app.bench.pass_through CLIENT BOOTSTRAP SRC DST GROUP``;
the process prints ``ready`` once it holds its partitions and runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from enum import Enum

__all__ = ["HopClient", "main"]

READY = "ready"
"""What a hop prints once it holds its partitions (the bench then fills the queue)."""


class HopClient(Enum):
    LIBRDKAFKA = "librdkafka"
    AIOKAFKA = "aiokafka"


def _confluent(bootstrap: str, src: str, dst: str, group: str) -> None:
    from confluent_kafka import Consumer, Producer

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
        }
    )
    announced = False

    def assigned(consumer: object, partitions: object) -> None:
        nonlocal announced
        if not announced:
            print(READY, flush=True)
            announced = True

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.subscribe([src], on_assign=assigned)
    try:
        while not stopping:
            for m in consumer.consume(num_messages=500, timeout=0.1):
                if m.error() is None:
                    producer.produce(dst, m.value(), key=m.key())
            producer.poll(0)
    finally:
        producer.flush(10)
        consumer.close()


async def _aiokafka(bootstrap: str, src: str, dst: str, group: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.abc import ConsumerRebalanceListener

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    class Announce(ConsumerRebalanceListener):  # type: ignore[misc]
        announced = False

        async def on_partitions_revoked(self, revoked: object) -> None:
            return None

        async def on_partitions_assigned(self, assigned: object) -> None:
            if not self.announced:
                print(READY, flush=True)
                self.announced = True

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=2
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=10,
        max_poll_records=500,
    )
    await producer.start()
    consumer.subscribe([src], listener=Announce())
    await consumer.start()
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=500)
            for records in batches.values():
                for r in records:
                    await producer.send(dst, r.value, key=r.key)  # awaits only a full buffer
    finally:
        await producer.stop()
        await consumer.stop()


def main(argv: list[str]) -> int:
    client, bootstrap, src, dst, group = argv
    if HopClient(client) is HopClient.LIBRDKAFKA:
        _confluent(bootstrap, src, dst, group)
    else:
        asyncio.run(_aiokafka(bootstrap, src, dst, group))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
