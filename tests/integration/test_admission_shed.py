"""Admission control on the real broker: a worker that measured a slow engine sheds
what cannot meet its deadline, at once and with ``SHED``, and serves the rest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from graylane.client import GraylaneClient, Result
from graylane.engine_worker.faults import FaultInjection
from graylane.engine_worker.service import Worker
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.priority import PRIORITY_TAG
from graylane.serde import PostProcess
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt-shed"
ENGINE_MS = 400.0
DEADLINE_S = 1.5
QUEUE_DEADLINE_S = 3.0
"""A deadline a few requests can make and a queue of 16 cannot: room for the path's own
delays on a loaded machine before the first request reaches the worker."""


@asynccontextmanager
async def warmed_slow_worker(
    factory: KafkaFactory, tmp_path: Path
) -> AsyncIterator[tuple[Worker, GraylaneClient]]:
    """One slow worker (>= 400 ms a request, one at a time) that has measured its engine."""
    model = write_demo_gpt(tmp_path / "v1.onnx", "tiny", seed=1)
    faults = {"v1": FaultInjection(extra_latency_ms=ENGINE_MS)}
    async with running_stack(
        factory, model=MODEL, versions={"v1": model}, stable="v1", faults=faults, max_batch_size=1
    ) as stack:
        worker = stack.workers["v1"]
        async with GraylaneClient(factory) as client:
            for i in range(3):  # warm: the worker measures its (slow) engine on its own
                warm = await client.infer(
                    MODEL, token_ids=[1, 2, 3], routing_key=f"w{i}", timeout=60
                )
                assert warm.ok
            assert worker.backend.learner.estimate_ms(1, 16) is not None
            yield worker, client


async def test_requests_that_cannot_make_their_deadline_are_shed(
    factory: KafkaFactory, tmp_path: Path
) -> None:
    """Judged on the stamps the path records (created, started, answered), not on how
    many requests this machine happened to serve in time."""
    async with warmed_slow_worker(factory, tmp_path) as (worker, client):
        n = 16
        for i in range(n):
            await client.submit(
                MODEL,
                token_ids=[5, 6, 7],
                routing_key=f"u{i}",
                post_process=PostProcess.ARGMAX_LAST,
                deadline_s=QUEUE_DEADLINE_S,
            )
        results: list[Result] = []
        async with asyncio.timeout(60):
            async for result in client.results():
                results.append(result)
                if len(results) == n:
                    break
    codes = ["OK" if r.ok else r.error_code for r in results]
    assert set(codes) <= {"OK", "SHED", "DEADLINE_EXCEEDED"}, codes
    deadline_ms = round(QUEUE_DEADLINE_S * 1000)
    for result, code in zip(results, codes, strict=True):
        when = result.timing
        deadline = when.created_at_unix_ms + deadline_ms
        if code == "OK":  # never started once it was too late
            assert when.dequeued_at_unix_ms <= deadline, when
        elif code == "DEADLINE_EXCEEDED":  # refused at intake: its deadline had passed
            assert when.completed_at_unix_ms >= deadline, when
    # 16 requests of >= 400 ms each, one at a time, cannot all finish within their
    # deadline: of those started in time, at most one per 400 ms of it ran.
    assert codes.count("OK") <= QUEUE_DEADLINE_S * 1000 // ENGINE_MS + 1, codes
    # The queue behind them (6.4 s of engine time against 3 s) is shed at once, not run
    # late: a request fetched with its deadline still ahead is SHED.
    assert codes.count("SHED") >= 1, codes
    shed = worker.metrics.shed.labels(MODEL, "v1", "fp32", "deadline")._value.get()
    assert shed == codes.count("SHED")


async def test_sheddable_requests_are_shed_before_critical_ones(
    factory: KafkaFactory, tmp_path: Path
) -> None:
    async with warmed_slow_worker(factory, tmp_path) as (worker, client):
        # A request without deadline holds the engine while the others arrive, so the
        # worker's next cycle fetches them together (a cycle takes up to 4 records):
        # three sheddable requests ahead of a critical one, one deadline for all.
        # Behind the three (>= 1.2 s of engine time, then its own) the critical one
        # could not make it.
        started = worker.backend.last_run_ms
        blocker = await client.submit(MODEL, token_ids=[1, 2, 3], routing_key="blocker")
        await wait_until(lambda: worker.backend.last_run_ms > started, timeout=30, what="blocker")
        priority: dict[str, str] = {blocker: "blocker"}
        for i, level in enumerate(["sheddable"] * 3 + ["critical"]):
            request_id = await client.submit(
                MODEL,
                token_ids=[5, 6, 7],
                routing_key=f"p{i}",
                post_process=PostProcess.ARGMAX_LAST,
                deadline_s=DEADLINE_S,
                tags={PRIORITY_TAG: level},
            )
            priority[request_id] = level
        codes: dict[str, list[str]] = {"blocker": [], "sheddable": [], "critical": []}
        async with asyncio.timeout(60):
            async for result in client.results():
                code = "OK" if result.ok else result.error_code
                codes[priority[result.request_id]].append(code)
                if sum(map(len, codes.values())) == len(priority):
                    break
    assert codes["blocker"] == ["OK"]
    assert codes["critical"] == ["OK"], codes
    assert set(codes["sheddable"]) <= {"OK", "SHED", "DEADLINE_EXCEEDED"}
    assert codes["sheddable"].count("SHED") >= 1
    # counted as shed for their own deadline, or to keep the critical one on time
    shed = worker.metrics.shed.labels(MODEL, "v1", "fp32", "deadline")._value.get()
    displaced = worker.metrics.shed.labels(MODEL, "v1", "fp32", "priority")._value.get()
    assert shed + displaced == codes["sheddable"].count("SHED")
