"""An in-process Graylane stack (router + workers) on the real broker, for tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graylane import serde
from graylane.artifacts.model_info import ModelInfo
from graylane.artifacts.signing import RefusedArtifact
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine.protocol import InferenceEngine
from graylane.engine.server import EngineEndpoint
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.engine_server import EngineServerSettings
from graylane.engine_worker.faults import FaultInjection
from graylane.engine_worker.requests import Tokenizer
from graylane.engine_worker.service import Worker
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import KafkaFactory, Record
from graylane.services.router.service import Router, RouterConfig
from graylane.v1 import dlq_pb2
from tests.support.waiting import wait_until


@dataclass
class Stack:
    factory: KafkaFactory
    router: Router
    workers: dict[str, Worker]
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def running_stack(
    factory: KafkaFactory,
    *,
    model: str,
    versions: Mapping[str, Path],
    stable: str,
    max_seq_len: int = 256,
    faults: Mapping[str, FaultInjection] | None = None,
    extra_variants: Mapping[str, Mapping[str, Path]] | None = None,
    max_batch_size: int = 8,
    engines: Mapping[str, Mapping[str, InferenceEngine]] | None = None,
    model_info: ModelInfo | None = None,
    initial_variant: str = "fp32",
    tokenizer: Tokenizer | None = None,
    tokenizers: Mapping[str, Tokenizer] | None = None,
    max_sequences: int = 0,
    refused_artifacts: tuple[RefusedArtifact, ...] = (),
    endpoints: Mapping[str, Sequence[EngineEndpoint]] | None = None,
    engine_server: EngineServerSettings | None = None,
    max_new_tokens: int = 256,
) -> AsyncIterator[Stack]:
    """Start a router and one worker per version; stop them all on exit.

    ``tokenizers``: a version's own tokenizer (else ``tokenizer``); ``max_sequences``:
    rows of a continuous decode batch (0: ``max_batch_size``); ``refused_artifacts``: what
    loading refused (counted by each worker's metrics); ``endpoints``: versions served
    by engine servers (their entry in ``versions`` is not read), with ``engine_server``'s
    settings."""
    stop = asyncio.Event()
    router = Router(factory, RouterConfig(stable_versions={model: stable}))
    workers: dict[str, Worker] = {}
    for version, served in (endpoints or {}).items():
        workers[version] = Worker(
            factory,
            WorkerConfig(
                model=model,
                version=version,
                initial_variant=served[0].variant,
                endpoints=tuple(served),
                engine_server=engine_server or EngineServerSettings(),
                max_new_tokens=max_new_tokens,
                worker_id=f"test-{version}",
            ),
        )
    for version, path in versions.items():
        if version in workers:
            continue
        loaded: dict[str, InferenceEngine] = dict((engines or {}).get(version, {}))
        if not loaded:
            loaded["fp32"] = OnnxRuntimeEngine.load(path, "fp32", name=model, intra_op_threads=1)
        for variant, vpath in (extra_variants or {}).get(version, {}).items():
            loaded[variant] = OnnxRuntimeEngine.load(vpath, variant, name=model, intra_op_threads=1)
        workers[version] = Worker(
            factory,
            WorkerConfig(
                model=model,
                version=version,
                initial_variant=initial_variant,
                model_info=model_info,
                tokenizer=(tokenizers or {}).get(version, tokenizer),
                max_seq_len=max_seq_len,
                max_sequences=max_sequences,
                buckets=(16, 32, 64, 128, 256),
                max_batch_size=max_batch_size,
                worker_id=f"test-{version}",
                faults=(faults or {}).get(version, FaultInjection()),
                refused_artifacts=refused_artifacts,
            ),
            loaded,
        )
    # Topics of every version must exist before the router forwards to them.
    from graylane.kafka.admin import ensure_topics

    await ensure_topics(
        factory, factory.layout.shared_specs() + factory.layout.model_specs(model, list(versions))
    )
    stack = Stack(factory, router, workers, stop)
    stack.tasks.append(asyncio.create_task(router.run(stop)))
    stack.tasks.extend(asyncio.create_task(w.run(stop)) for w in workers.values())
    try:
        waits = [router.ready.wait(), *(w.ready.wait() for w in workers.values())]
        done, _ = await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=60)
        failed = [t for t in stack.tasks if t.done() and t.exception()]
        if failed:
            raise failed[0].exception()  # type: ignore[misc]
        if len(done) != len(waits):
            raise TimeoutError("the stack did not become ready within 60 s")
        yield stack
    finally:
        stop.set()
        results = await asyncio.gather(*stack.tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]


async def read_topic(
    factory: KafkaFactory, topic: str, *, expect: int, timeout_s: float = 20.0
) -> list[bytes]:
    """Values of ``topic`` from the beginning, once ``expect`` arrived or ``timeout_s`` passed."""
    values: list[bytes] = []
    enough = asyncio.Event()
    if expect <= 0:
        enough.set()

    def keep(record: Record) -> None:
        if record.value is not None:
            values.append(record.value)
        if len(values) >= expect:
            enough.set()

    async with TopicFollower(
        factory, topic, keep, start_at=FollowFrom.BEGINNING, client_suffix="reader"
    ):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(enough.wait(), timeout_s)
    return values


async def dead_letters(factory: KafkaFactory, expect: int) -> list[dlq_pb2.DeadLetter]:
    values = await read_topic(factory, factory.layout.dlq(), expect=expect)
    return [serde.decode(dlq_pb2.DeadLetter, v) for v in values]


def versions_served(results: Sequence[object]) -> set[str]:
    return {getattr(r, "version") for r in results}  # noqa: B009


async def wait_for_table(stack: Stack, model: str, epoch: int, timeout: float = 20.0) -> None:
    """Wait until the router has applied the routing table of `model` at `epoch` (or later)."""

    def applied() -> bool:
        table = stack.router.tables.tables.get(model)
        return table is not None and table.epoch >= epoch

    await wait_until(applied, timeout=timeout, what=f"router table {model} epoch {epoch}")
