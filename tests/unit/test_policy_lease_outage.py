"""The lease keeper through a broker outage (in-memory Kafka): a lapsed lease fences
the writer instead of ending it; it resumes when it holds the lease again, and steps
down if another live instance took it meanwhile."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka.errors import KafkaConnectionError

from graylane.policy_engine.lease import LeaseKeeper
from tests.support.memory_kafka import MemoryBroker, MemoryConsumer, MemoryFactory, MemoryProducer
from tests.support.waiting import wait_until

TTL_MS, RENEW_MS = 400, 100


@dataclass
class FlakyFactory(MemoryFactory):
    """A factory whose broker can be made unreachable (every new client fails)."""

    down: bool = False

    def producer(self, *args: object, **kwargs: object) -> MemoryProducer:
        if self.down:
            raise KafkaConnectionError("broker unreachable")
        return super().producer(*args, **kwargs)  # type: ignore[arg-type]

    def consumer(self, *args: object, **kwargs: object) -> MemoryConsumer:
        if self.down:
            raise KafkaConnectionError("broker unreachable")
        return super().consumer(*args, **kwargs)  # type: ignore[arg-type]


def keeper(factory: MemoryFactory, holder: str) -> LeaseKeeper:
    return LeaseKeeper(factory, holder, ttl_ms=TTL_MS, renew_ms=RENEW_MS)  # type: ignore[arg-type]


async def holding(factory: MemoryFactory, holder: str) -> LeaseKeeper:
    factory.broker.create_topic(f"{factory.layout.prefix}.control.policy-lease", 1)
    k = keeper(factory, holder)
    assert await k.step()
    return k


async def test_the_engine_survives_a_lease_renewal_outage_and_resumes() -> None:
    factory = FlakyFactory(MemoryBroker())
    a = await holding(factory, "a")
    displaced: list[bool] = []
    task = asyncio.create_task(a.keep(lambda: displaced.append(True)))
    try:
        await wait_until(a.writable.is_set, timeout=5, what="writing")
        term = a.lease.term
        factory.down = True
        await wait_until(lambda: not a.writable.is_set(), timeout=5, what="fenced in the outage")
        assert not a.active
        # a publication waits behind the fence instead of writing (or ending the process)
        gate = asyncio.create_task(a.wait_writable())
        await asyncio.sleep(3 * TTL_MS / 1000)  # well past the lease: still alive, still fenced
        assert not task.done() and not gate.done() and not a.writable.is_set()
        factory.down = False
        await wait_until(a.writable.is_set, timeout=10, what="writing again after the outage")
        await asyncio.wait_for(gate, 1)
        assert a.active and a.lease.holder == "a" and a.lease.term == term + 1
        assert not displaced and not task.done()
    finally:
        task.cancel()


async def test_a_writer_whose_lease_another_instance_took_steps_down() -> None:
    factory = FlakyFactory(MemoryBroker())
    a = await holding(factory, "a")
    displaced: list[bool] = []
    task = asyncio.create_task(a.keep(lambda: displaced.append(True)))
    try:
        factory.down = True  # only a's clients fail: b still reaches the broker
        await wait_until(lambda: not a.writable.is_set(), timeout=5, what="fenced")
        b = keeper(MemoryFactory(factory.broker), "b")
        await wait_until(b.step, timeout=5, what="the standby takes the lease")
        factory.down = False
        await wait_until(lambda: bool(displaced), timeout=10, what="a steps down")
        await asyncio.wait_for(task, 1)
        assert not a.writable.is_set() and not a.active
        assert b.active
    finally:
        task.cancel()
