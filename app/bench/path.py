"""The whole path's capacity (client, router, worker and back) in a running bench stack.

``graylane calibrate`` measures the engine alone with the whole machine; in a
stack the router, the policy engine and the client share the CPU, and on a
small machine the path serves far less. Benchmarks load at a fraction of
min(engine, path): :func:`path_capacity` offers more than the path can take
for ``PROBE_S`` seconds and counts the results/s of the second half, once a
queue has formed; :func:`drained` waits for that queue to go.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from graylane.app.bench.harness import BenchStack
from graylane.app.demo.monitor import Monitor
from graylane.kafka.reading import group_lag
from graylane.kafka.seam import ConsumerOptions, KafkaFactory

__all__ = ["DRAIN_TIMEOUT_S", "PROBE_S", "Served", "delivered_rps", "drained", "path_capacity"]


class Served(Protocol):
    """What :func:`drained` needs: the stack's Kafka factory and its model."""

    @property
    def factory(self) -> KafkaFactory: ...

    @property
    def model(self) -> str: ...


PROBE_S = 8.0
"""How long the path is offered more than it can take, to measure its capacity."""
DRAIN_TIMEOUT_S = 60.0


async def path_capacity(
    stack: BenchStack, offered: float, versions: tuple[str, ...], probe_s: float = PROBE_S
) -> float:
    """Results/s the whole path delivers while offered ``offered`` req/s (the last
    half of ``probe_s``, once a queue has formed); then waits for the queue to drain."""
    m = stack.monitor
    stack.rate = offered
    stop = asyncio.Event()
    load = asyncio.create_task(stack.load(stop))
    t0 = m.now()
    await asyncio.sleep(probe_s)
    stop.set()
    await load
    t1 = m.now()
    await drained(stack, dict.fromkeys(versions, 0))
    return delivered_rps(m, t0, t1, probe_s)


def delivered_rps(monitor: Monitor, t0: float, t1: float, probe_s: float) -> float:
    """Results/s the monitor saw from ``t0 + probe_s / 2`` to ``t1`` (a probe's second
    half); requests shed by admission control were not served and do not count."""
    counted = sum(1 for s in monitor.history if t0 + probe_s / 2 <= s.at <= t1 and not s.shed)
    span = t1 - t0 - probe_s / 2
    return counted / span if span > 0 else 0.0


async def drained(
    stack: Served, limits: dict[str, int], timeout_s: float = DRAIN_TIMEOUT_S
) -> bool:
    """Wait until each version's worker group is at most ``limits[version]`` records
    behind on its topic (0 for an idle version: its queue is gone; a version under
    load always has a few records in flight)."""
    factory = stack.factory
    layout = factory.layout
    admin = factory.admin()
    ends = factory.consumer(options=ConsumerOptions(group_id=None), client_suffix="bench-lag")
    await admin.start()
    await ends.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            lags = [
                await group_lag(
                    ends,
                    admin,
                    layout.worker_group(stack.model, v),
                    layout.version_requests(stack.model, v),
                    layout.partitions,
                )
                for v in limits
            ]
            if all(o.lag <= limit for o, limit in zip(lags, limits.values(), strict=True)):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
    finally:
        await ends.stop()
        await admin.close()
