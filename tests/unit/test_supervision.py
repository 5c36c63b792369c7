"""Crash-only background tasks (graylane/supervision.py), and the services that use them:
a follower that dies ends the router's / worker's ``run()`` with the reason instead of
leaving the service serving stale tables or precision."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.service import Worker
from graylane.kafka.reading import CompactedFollower
from graylane.models.demo_gpt import write_demo_gpt
from graylane.services.controlplane.audit_sink import AuditSink
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.services.router.service import Router, RouterConfig
from graylane.settings import Settings
from graylane.supervision import BackgroundTaskDied, BackgroundTasks
from tests.support.memory_kafka import MemoryBroker, MemoryFactory


class FollowerBug(RuntimeError):
    """A handler bug that kills a follower task."""


async def _boom(after: asyncio.Event) -> None:
    await after.wait()
    raise FollowerBug("bad luck")


async def test_a_task_that_dies_is_remembered_and_raised_with_its_cause() -> None:
    tasks = BackgroundTasks()
    go = asyncio.Event()
    tasks.spawn(_boom(go), name="follower")
    assert tasks.healthy
    go.set()
    await asyncio.wait_for(tasks.failed.wait(), 5)
    assert not tasks.healthy
    with pytest.raises(BackgroundTaskDied, match="'follower' died: FollowerBug: bad luck") as info:
        tasks.raise_if_failed()
    assert isinstance(info.value.__cause__, FollowerBug)
    await tasks.close()


async def test_tasks_that_return_or_are_cancelled_are_not_failures() -> None:
    tasks = BackgroundTasks()
    tasks.spawn(asyncio.sleep(0), name="quick")
    tasks.spawn(asyncio.Event().wait(), name="forever")
    await asyncio.sleep(0.01)
    await tasks.close()  # cancels "forever"
    assert tasks.healthy
    tasks.raise_if_failed()


async def test_wait_returns_on_stop_and_raises_when_a_task_dies_first() -> None:
    stop = asyncio.Event()
    stop.set()
    await BackgroundTasks().wait(stop)
    tasks = BackgroundTasks()
    go = asyncio.Event()
    go.set()
    tasks.spawn(_boom(go), name="sink")
    with pytest.raises(BackgroundTaskDied):
        await asyncio.wait_for(tasks.wait(asyncio.Event()), 5)
    await tasks.close()


async def test_abort_keeps_the_first_reason() -> None:
    tasks = BackgroundTasks()
    first, second = ValueError("first"), ValueError("second")
    tasks.abort(first)
    tasks.abort(second)
    assert tasks.failure is first and tasks.failed.is_set()
    with pytest.raises(ValueError, match="first"):
        tasks.raise_if_failed()


# --- the services ------------------------------------------------------------------------

MODEL = "gpt"


@pytest.fixture
def factory() -> MemoryFactory:
    broker = MemoryBroker()
    factory = MemoryFactory(broker, Settings(topic_prefix="t", partitions=1))
    for spec in factory.layout.shared_specs() + factory.layout.model_specs(MODEL, ["v1"]):
        broker.create_topic(spec.name, spec.partitions)
    return factory


def break_fetches(follower: CompactedFollower, bug: str) -> None:
    """Make a running follower's fetch fail (a bug in the follower, not in one record:
    a record its handler fails on is passed over, see test_kafka_reading)."""
    consumer = follower._consumer
    if consumer is None:
        raise RuntimeError("the follower has not started")

    async def broken(*args: object, **kwargs: object) -> object:
        raise FollowerBug(bug)

    consumer.getmany = broken  # type: ignore[method-assign]


async def test_a_dead_table_follower_ends_the_router_with_the_reason(
    factory: MemoryFactory,
) -> None:
    config = RouterConfig(stable_versions={MODEL: "v1"}, group_id="g", metrics_port=-1)
    router = Router(factory, config)
    stop = asyncio.Event()
    task = asyncio.create_task(router.run(stop))
    await asyncio.wait_for(router.ready.wait(), 5)
    break_fetches(router._tables, "table follower bug")
    with pytest.raises(BackgroundTaskDied, match="router-table-follower") as info:
        await asyncio.wait_for(task, 10)
    assert isinstance(info.value.__cause__, FollowerBug)
    assert not stop.is_set()  # it ended on its own, not because it was asked to


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> OnnxRuntimeEngine:
    path: Path = write_demo_gpt(tmp_path_factory.mktemp("m") / "tiny.onnx", "tiny", seed=5)
    return OnnxRuntimeEngine.load(path, "fp32", name=MODEL, intra_op_threads=1)


async def test_a_dead_precision_follower_ends_the_worker_with_the_reason(
    factory: MemoryFactory, engine: OnnxRuntimeEngine
) -> None:
    config = WorkerConfig(
        model=MODEL,
        version="v1",
        initial_variant="fp32",
        max_seq_len=16,
        buckets=(16,),
        metrics_port=-1,
        worker_id="w",
    )
    worker = Worker(factory, config, {"fp32": engine})
    task = asyncio.create_task(worker.run(asyncio.Event()))
    await asyncio.wait_for(worker.ready.wait(), 30)
    break_fetches(worker._precision, "precision follower bug")
    with pytest.raises(BackgroundTaskDied, match="worker-precision-follower") as info:
        await asyncio.wait_for(task, 10)
    assert isinstance(info.value.__cause__, FollowerBug)


class BuggySink(AuditSink):
    """An audit sink with a bug (not a database error: those it survives)."""

    async def run(self, stop: asyncio.Event) -> None:
        self.ready.set()
        await asyncio.sleep(0.05)
        raise FollowerBug("sink bug")


async def test_a_dead_audit_sink_ends_the_control_plane_with_the_reason(
    factory: MemoryFactory, tmp_path: Path
) -> None:
    factory.settings = Settings(
        topic_prefix="t", partitions=1, db_url=f"sqlite:///{tmp_path / 'cp.db'}"
    )
    config = ServerConfig(
        port=0,
        tokens=TokenTable(parse_tokens("ops-token-0123456:operator:alice")),
        check_candidates=False,
        metrics_port=-1,
    )
    server = ControlPlaneServer(config, factory)  # type: ignore[arg-type]
    server.sink = BuggySink(factory, server.store, server.hub)  # type: ignore[arg-type]
    with pytest.raises(BackgroundTaskDied, match="cp-audit-sink") as info:
        await asyncio.wait_for(server.serve(asyncio.Event()), 20)
    assert isinstance(info.value.__cause__, FollowerBug)
