"""The serving part of ``graylane demo``: traffic through the SDK, then a summary."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from rich.table import Table

from graylane import serde
from graylane.app.demo.monitor import demo_console
from graylane.client import GraylaneClient, InferenceTimeout, Result, Task
from graylane.clock import now_ms
from graylane.kafka.seam import KafkaFactory
from graylane.routing.convert import table_to_pb
from graylane.routing.table import RoutingRule, table_for_weights
from graylane.serde import PostProcess
from graylane.settings import Settings

__all__ = ["PROBE_TAG", "percentile", "publish_table", "run_serving_demo", "wait_until_served"]

PROBE_TAG = ("demo-probe", "v2")


class _Service(Protocol):
    name: str

    @property
    def process(self) -> object: ...


async def publish_table(factory: KafkaFactory, model: str, candidate_percent: float) -> None:
    """Publish a routing table (in production the policy engine owns this topic)."""
    table = table_for_weights(
        model=model,
        stable_version="v1",
        weights=[("v2", candidate_percent)],
        rules=[RoutingRule("probe", (PROBE_TAG,), "v2")],
        epoch=now_ms(),
        reason="demo split",
    )
    producer = factory.producer()
    await producer.start()
    try:
        await producer.send_and_wait(
            factory.layout.routing(), serde.encode(table_to_pb(table)), key=model.encode()
        )
    finally:
        await producer.stop()


async def wait_until_served(client: GraylaneClient, model: str, timeout_s: float = 120) -> None:
    """Both versions answer a probe (workers warm up before they join)."""
    deadline = time.monotonic() + timeout_s
    for tags in ({}, dict([PROBE_TAG])):
        while True:
            try:
                await client.infer(model, prompt="probe", tags=tags, timeout=5)
                break
            except InferenceTimeout:
                if time.monotonic() > deadline:
                    raise
    await asyncio.sleep(0)


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


async def run_serving_demo(
    settings: Settings,
    *,
    model: str,
    requests: int,
    candidate_percent: float,
    services: Sequence[_Service],
    step: Callable[[str], None],
) -> None:
    factory = KafkaFactory(settings)
    console = demo_console()
    step(f"routing table: v2 gets {candidate_percent:.0f}% of users (sticky buckets)")
    await publish_table(factory, model, candidate_percent)
    async with GraylaneClient(factory, client_id="demo") as client:
        step("waiting for both workers to warm up and join their groups")
        await wait_until_served(client, model)
        step(f"sending {requests} requests through the SDK (forward + generate)")
        sent = 0
        for i in range(requests):
            if i % 4 == 3:
                await client.submit(
                    model,
                    prompt=f"user {i} says hi",
                    task=Task.GENERATE,
                    max_new_tokens=8,
                    routing_key=f"user-{i}",
                )
            else:
                await client.submit(
                    model,
                    prompt=f"request number {i}",
                    post_process=PostProcess.ARGMAX_LAST,
                    routing_key=f"user-{i}",
                )
            sent += 1
        await client.flush()
        results: list[Result] = []

        async def collect() -> None:
            async for r in client.results():
                results.append(r)
                if len(results) % 100 == 0:
                    print(f"    ... {len(results)}/{sent} results", flush=True)
                if len(results) == sent:
                    return

        await asyncio.wait_for(collect(), timeout=300)

    by_version: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_version[r.version].append(r)
    table = Table(title=f"{len(results)} requests served by {model}")
    for col in (
        "version",
        "requests",
        "share",
        "errors",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "mean batch",
    ):
        table.add_column(col, justify="right")
    for version in sorted(by_version):
        rs = by_version[version]
        lat = [r.client_latency_ms or r.timing.total_ms for r in rs]
        table.add_row(
            version,
            str(len(rs)),
            f"{100 * len(rs) / len(results):.1f}%",
            str(sum(not r.ok for r in rs)),
            f"{percentile(lat, 50):.1f}",
            f"{percentile(lat, 95):.1f}",
            f"{percentile(lat, 99):.1f}",
            f"{np.mean([r.timing.batch_size for r in rs]):.1f}",
        )
    console.print(table)
    sample = next((r for r in results if r.tokens), None)
    if sample is not None:
        console.print(f"a generated continuation ({sample.version}): {sample.text!r}")
    counts = Counter(r.version for r in results)
    if len(counts) < 2:
        raise RuntimeError(f"expected both versions to serve, got {dict(counts)}")
