"""A benchmark stack: broker, router, workers and the policy engine as processes,
plus a paced load generator and a monitor of routing, rollouts and results.

The load is FORWARD requests, or generations (``Task.GENERATE``) when the stack
is given a :class:`GenerationLoad`: their answers carry TTFT and TPOT."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graylane import serde
from graylane.app.bench.qos_score import RequestOutcome
from graylane.app.cli.demo import Service, start_service, stop_services
from graylane.app.demo.monitor import Monitor
from graylane.client import GraylaneClient, InferenceTimeout, Task
from graylane.clock import now_ms
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import CompactedFollower
from graylane.kafka.seam import KafkaFactory
from graylane.serde import PostProcess
from graylane.settings import REPO_ROOT, Settings
from graylane.v1 import rollout_pb2

__all__ = [
    "BenchStack",
    "GenerationLoad",
    "WorkerSpec",
    "bench_stack",
    "demo_model",
    "fresh_topics",
    "paced",
    "stack_env",
    "start_router",
    "start_worker",
    "wait_answered",
]


@dataclass(frozen=True)
class GenerationLoad:
    """The load's requests are generations of these output lengths (cycled)."""

    new_tokens: tuple[int, ...]
    ttft_deadline_ms: int = 0
    """Admission control: the worker sheds a generation that gets no decode row within
    this many ms of its creation (0 = none)."""

    def __post_init__(self) -> None:
        if not self.new_tokens or min(self.new_tokens) < 1:
            raise ValueError(f"output lengths {self.new_tokens[:5]}... must be >= 1")


@dataclass(frozen=True)
class WorkerSpec:
    version: str
    variants: dict[str, str]
    """variant name -> ONNX path"""
    extra_args: tuple[str, ...] = ()
    threads: int = 1
    """Engine threads (0: the engine's default)."""


@dataclass
class BenchStack:
    factory: KafkaFactory
    model: str
    monitor: Monitor
    client: GraylaneClient
    rate: float = 50.0
    prompt_len: int = 32
    services: list[Service] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    tag: str = "bench"
    sent_at: dict[str, float] = field(default_factory=dict)
    """request id -> monotonic time it was submitted by :meth:`load`."""
    answers: dict[str, RequestOutcome] = field(default_factory=dict)
    generation: GenerationLoad | None = None
    """Generations instead of FORWARD requests (:class:`GenerationLoad`)."""

    async def command(self, command: rollout_pb2.RolloutCommand) -> None:
        command.command_id = command.command_id or uuid.uuid4().hex
        command.model = self.model
        command.issued_at_unix_ms = now_ms()
        command.issued_by = "graylane bench"
        producer = self.factory.producer()
        await producer.start()
        try:
            await producer.send_and_wait(
                self.factory.layout.commands(), serde.encode(command), key=self.model.encode()
            )
        finally:
            await producer.stop()

    async def wait_served(self, timeout_s: float = 180.0) -> None:
        """Until one request is answered (a worker serves the model)."""
        if self.generation is not None:
            probe = functools.partial(
                self.client.infer,
                self.model,
                token_ids=[1, 2, 3],
                task=Task.GENERATE,
                max_new_tokens=1,
                timeout=5,
            )
        else:
            probe = functools.partial(self.client.infer, self.model, token_ids=[1, 2, 3], timeout=5)
        await wait_answered(probe, within_s=timeout_s)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def load(self, stop: asyncio.Event) -> None:
        """Paced open-loop load at ``self.rate`` (changeable while running)."""
        i = 0
        tokens = [(7 * k) % 250 + 3 for k in range(self.prompt_len)]
        next_at = time.monotonic()
        while not stop.is_set():
            submitted = time.monotonic()
            user = f"user-{uuid.uuid4().hex[:8]}"
            g = self.generation
            if g is not None:
                request_id = await self.client.submit(
                    self.model,
                    token_ids=tokens,
                    routing_key=user,
                    task=Task.GENERATE,
                    max_new_tokens=g.new_tokens[i % len(g.new_tokens)],
                    ttft_deadline_ms=g.ttft_deadline_ms,
                )
            else:
                request_id = await self.client.submit(
                    self.model,
                    token_ids=tokens,
                    routing_key=user,
                    post_process=PostProcess.ARGMAX_LAST,
                )
            self.sent_at[request_id] = submitted
            i += 1
            next_at = await paced(next_at, self.rate)

    def add_worker(self, spec: WorkerSpec) -> None:
        """Start one more worker process with the stack's settings."""
        self.services.append(start_worker(spec, self.model, self.env, self.tag))

    async def collect(self) -> None:
        async for result in self.client.results():
            self.monitor.on_result(result)
            latency = result.client_latency_ms or result.timing.total_ms
            self.answers[result.request_id] = RequestOutcome(
                result.ok,
                result.error_code,
                latency,
                ttft_ms=result.timing.ttft_ms,
                tpot_ms=result.timing.tpot_ms,
            )


def demo_model(
    size: str, *, kv_cache: bool = False, progress: Callable[[str], None] | None = None
) -> Path:
    """The benchmarks' demo GPT of ``size`` (seed 7, with a KV cache if asked), written
    once under ``.local/models`` and reused by every later run."""
    from graylane.models.demo_gpt import write_demo_gpt

    models = REPO_ROOT / ".local" / "models"
    models.mkdir(parents=True, exist_ok=True)
    model = models / f"bench-gpt-{size}{'-kv' if kv_cache else ''}.onnx"
    if not model.exists():
        if progress is not None:
            cache = ", with a KV cache" if kv_cache else ""
            progress(f"writing the demo GPT ({size}{cache})")
        write_demo_gpt(model, size, seed=7, kv_cache=kv_cache)
    return model


async def paced(next_at: float, rate: float) -> float:
    """Wait for the next send of an open-loop load at ``rate`` per second, the last one
    due at ``next_at`` (monotonic seconds); when the next is due. A load that fell behind
    by more than a second starts over from now instead of bursting to catch up."""
    next_at += 1.0 / rate
    delay = next_at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    elif delay < -1.0:
        next_at = time.monotonic()
    else:
        await asyncio.sleep(0)
    return next_at


async def fresh_topics(
    settings: Settings, tag: str, model: str, versions: Sequence[str]
) -> tuple[Settings, KafkaFactory]:
    """``settings`` on a topic prefix of their own (``tag`` and a random suffix: no
    backlog or consumer group carries over), with the shared topics and those of
    ``model``'s ``versions`` made."""
    settings = settings.with_overrides(topic_prefix=f"{tag}{uuid.uuid4().hex[:6]}")
    factory = KafkaFactory(settings)
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(model, list(versions)))
    return settings, factory


def stack_env(settings: Settings) -> dict[str, str]:
    """What the stack's processes need to reach the same broker and topics."""
    return {
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
    }


def start_router(model: str, stable: str, env: dict[str, str], tag: str) -> Service:
    """A router sending all of ``model`` to its ``stable`` version."""
    return start_service(
        f"{tag}-router",
        ["router", "--model", f"{model}={stable}"],
        REPO_ROOT / ".local" / "logs",
        env,
    )


def start_worker(spec: WorkerSpec, model: str, env: dict[str, str], tag: str) -> Service:
    variants = [a for name, path in spec.variants.items() for a in ("--variant", f"{name}={path}")]
    return start_service(
        f"{tag}-worker-{spec.version}",
        [
            "worker",
            "--model",
            model,
            "--version",
            spec.version,
            "--threads",
            str(spec.threads),
            *variants,
            *spec.extra_args,
        ],
        REPO_ROOT / ".local" / "logs",
        env,
    )


async def wait_answered(probe: Callable[[], Awaitable[object]], *, within_s: float = 180.0) -> None:
    """Send ``probe`` (one request with a short client timeout) until it is answered:
    the stack is up. Its :class:`InferenceTimeout` past ``within_s`` is raised."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            await probe()
            return
        except InferenceTimeout:
            if time.monotonic() > deadline:
                raise


@contextlib.asynccontextmanager
async def bench_stack(
    settings: Settings,
    *,
    model: str,
    stable: str,
    workers: Sequence[WorkerSpec],
    window_ms: int = 6000,
    step_ms: int = 1000,
    with_policy: bool = True,
    tag: str = "bench",
    later_versions: Sequence[str] = (),
    policy_args: Sequence[str] = (),
    wait_served: bool = True,
    generation: GenerationLoad | None = None,
) -> AsyncIterator[BenchStack]:
    """``wait_served=False``: yield before any worker answers (the caller starts
    workers some other way, then calls :meth:`BenchStack.wait_served`)."""
    settings, factory = await fresh_topics(
        settings, tag, model, [w.version for w in workers] + list(later_versions)
    )
    layout = factory.layout
    env = stack_env(settings)
    services = [start_router(model, stable, env, tag)]
    if with_policy:
        services.append(
            start_service(
                f"{tag}-policy",
                [
                    "policy",
                    "--model",
                    model,
                    "--window-ms",
                    str(window_ms),
                    "--step-ms",
                    str(step_ms),
                    *policy_args,
                ],
                REPO_ROOT / ".local" / "logs",
                env,
            )
        )
    services += [start_worker(w, model, env, tag) for w in workers]
    monitor = Monitor(model)
    followers = [
        CompactedFollower(factory, layout.routing(), monitor.on_routing, client_suffix="b-r"),
        CompactedFollower(factory, layout.precision(), monitor.on_precision, client_suffix="b-p"),
        CompactedFollower(factory, layout.rollouts(), monitor.on_rollout, client_suffix="b-o"),
    ]
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        for f in followers:
            await f.catch_up()
        tasks += [asyncio.create_task(f.follow(stop)) for f in followers]
        async with GraylaneClient(factory) as client:
            stack = BenchStack(
                factory,
                model,
                monitor,
                client,
                services=services,
                env=env,
                tag=tag,
                generation=generation,
            )
            if wait_served:
                await stack.wait_served()
            tasks.append(asyncio.create_task(stack.collect()))
            yield stack
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for f in followers:
            await f.stop()
        stop_services(services)
