"""The rollout story of ``graylane demo``: a healthy canary promoted (the
registry's stable version moves to it), a bad one rolled back automatically, both
decided by the policy engine from live telemetry; then an operator's ``graylane
rollout undo`` sends 100 % back to the previous stable version. (The QoS ladder
under a load spike is SmolLM2's act, :mod:`graylane.app.demo.qos_act`.) With a gateway, a fifth of
the load goes through it (OpenAI completions), the rest straight to Kafka: the policy
engine judges both alike."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.live import Live
from rich.table import Table

from graylane import serde
from graylane.app.demo.gateway_calls import GatewayPool, completion_result
from graylane.app.demo.monitor import Monitor, demo_console
from graylane.client import GraylaneClient, InferenceTimeout
from graylane.clock import now_ms
from graylane.kafka.reading import CompactedFollower
from graylane.kafka.seam import KafkaFactory
from graylane.registry.repository import open_registry
from graylane.rollouts.pb import phase_from_pb
from graylane.rollouts.vocabulary import Phase
from graylane.serde import PostProcess
from graylane.settings import Settings
from graylane.v1 import audit_pb2, rollout_pb2

__all__ = [
    "BAD",
    "HEALTHY",
    "MODEL",
    "SEEDS",
    "STABLE",
    "Story",
    "StoryConfig",
    "audit_table",
    "demo_rollout_spec",
]

MODEL = "demo-gpt"
PROBE_CALLERS = 32
"""Closed-loop callers of the path probe: enough to keep the worker's batches full."""
STABLE, HEALTHY, BAD = "1.0.0", "1.1.0", "1.2.0"
SEEDS = {STABLE: 1, HEALTHY: 2, BAD: 3}


@dataclass(frozen=True, kw_only=True)
class StoryConfig:
    rate: float = 20.0
    prompt_len: int = 96
    phase_timeout_s: float = 150.0
    report: Path = Path(".local/report.png")
    load_fraction: float = 0.0
    """When > 0: measure the whole path's capacity first (:mod:`graylane.app.bench.path`)
    and run at this fraction of min(path, ``engine_rps``) instead of ``rate``."""
    engine_rps: float = 0.0
    """One fp32 worker's calibrated capacity (the probe offers it: more than the path)."""
    gateway_port: int = 0
    """When set: ``gateway_share`` of the load goes through the API gateway on this port
    (OpenAI completions of one token, the same routing key), the rest straight to Kafka."""
    gateway_key: str = ""
    gateway_share: float = 0.2


def demo_rollout_spec(rollout_id: str, baseline: str, candidate: str) -> rollout_pb2.RolloutSpec:
    return rollout_pb2.RolloutSpec(
        rollout_id=rollout_id,
        model=MODEL,
        baseline_version=baseline,
        candidate_version=candidate,
        strategy=rollout_pb2.CANARY,
        steps=[
            rollout_pb2.RolloutStep(weight_percent=10, min_samples=40, min_dwell_s=6),
            rollout_pb2.RolloutStep(weight_percent=50, min_samples=60, min_dwell_s=6),
            rollout_pb2.RolloutStep(weight_percent=100, min_samples=60, min_dwell_s=4),
        ],
        gates=rollout_pb2.GateSpec(
            max_p99_ratio=2.0, max_error_rate_delta=0.05, significance_alpha=0.01
        ),
        failures_to_rollback=2,
        created_at_unix_ms=now_ms(),
        created_by="graylane demo",
    )


class Story:
    def __init__(
        self,
        settings: Settings,
        cfg: StoryConfig,
        step: Callable[[str], None],
        *,
        clock_origin: float | None = None,
    ) -> None:
        """``clock_origin``: the ``time.monotonic()`` every time of the story counts from
        (the demo's start, the printed steps' clock; default: now)."""
        self.factory = KafkaFactory(settings)
        self.layout = self.factory.layout
        self.cfg = cfg
        self.step = step
        self.monitor = Monitor(MODEL, t0=clock_origin)
        self.model = MODEL
        self.rate = cfg.rate
        self.base_rate = cfg.rate
        self.path_rps = 0.0
        """The whole path's measured capacity (0 until measured)."""
        """The steady load (``rate``, or measured: :meth:`_probe_path`)."""
        self.console = demo_console()
        self.stop = asyncio.Event()
        self.gateway = (
            GatewayPool(cfg.gateway_port, key=cfg.gateway_key) if cfg.gateway_port else None
        )
        self._calls: set[asyncio.Task[None]] = set()
        self.registry = open_registry(settings.db_url, migrate=False)

    def registry_stable(self) -> str:
        """The registry's stable version of the model (the control plane moves it)."""
        info = self.registry.get_stable(MODEL)
        return str(info.version) if info is not None else "none"

    async def send_command(self, command: rollout_pb2.RolloutCommand) -> None:
        command.command_id = uuid.uuid4().hex
        command.model = MODEL
        command.issued_by = "graylane demo"
        command.issued_at_unix_ms = now_ms()
        producer = self.factory.producer()
        await producer.start()
        try:
            await producer.send_and_wait(
                self.layout.commands(), serde.encode(command), key=MODEL.encode()
            )
        finally:
            await producer.stop()

    async def _load(self, client: GraylaneClient) -> None:
        i = 0
        prompt = "graylane " * (self.cfg.prompt_len // 9)
        next_at = time.monotonic()
        every = round(1.0 / self.cfg.gateway_share) if self.cfg.gateway_share > 0 else 0
        while not self.stop.is_set():
            if self.gateway is not None and every and i % every == 0:
                call = asyncio.create_task(
                    self._through_gateway(self.gateway, f"{i:06d} {prompt}", f"user-{i % 997}")
                )
                self._calls.add(call)
                call.add_done_callback(self._calls.discard)
            else:
                await client.submit(
                    MODEL,
                    prompt=f"{i:06d} {prompt}",
                    routing_key=f"user-{i % 997}",
                    post_process=PostProcess.ARGMAX_LAST,
                )
            i += 1
            next_at += 1.0 / self.rate
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = time.monotonic()

    async def _through_gateway(self, pool: GatewayPool, prompt: str, user: str) -> None:
        """One completion through the API gateway, counted by the monitor like the rest."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "user": user}
        headers: dict[str, str] = {}
        sent = time.perf_counter()
        answer = await pool.request(
            "POST", "/v1/completions", json.dumps(body).encode(), headers=headers
        )
        self.monitor.on_result(
            completion_result(
                answer,
                request_id=uuid.uuid4().hex,
                model=MODEL,
                latency_ms=(time.perf_counter() - sent) * 1000.0,
            )
        )

    async def _collect(self, client: GraylaneClient) -> None:
        async for result in client.results():
            self.monitor.on_result(result)

    async def _live(self, title: Callable[[], str]) -> None:
        with Live(self.monitor.table(title()), console=self.console, refresh_per_second=2) as live:
            while not self.stop.is_set():
                await asyncio.sleep(1.0)
                self.monitor.snapshot()
                live.update(self.monitor.table(title()))

    def _rollout_budget_s(self) -> float:
        """Time a demo rollout needs at the current load: each step's samples arrive at
        ``rate x weight`` (a slow machine gets a low rate, so more time), with margin."""
        spec = demo_rollout_spec("budget", STABLE, HEALTHY)
        need = sum(
            max(
                step.min_dwell_s,
                step.min_samples / max(self.rate * step.weight_percent / 100, 1e-3),
            )
            for step in spec.steps
        )
        return max(self.cfg.phase_timeout_s, 2.0 * need + 30.0)

    async def _wait(self, done: Callable[[], bool], what: str, timeout_s: float = 0.0) -> bool:
        timeout_s = timeout_s or self.cfg.phase_timeout_s
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                self.console.print(f"[yellow]{what}: not reached within {timeout_s:.0f}s")
                self.monitor.event(f"timeout: {what}")
                return False
            await asyncio.sleep(0.5)
        self.monitor.event(what)
        return True

    def _phase_of(self, rollout_id: str) -> Phase | None:
        state = self.monitor.rollouts.get(rollout_id)
        return phase_from_pb(state.phase) if state is not None else None

    async def run(self) -> list[audit_pb2.AuditRecord]:
        followers = [
            CompactedFollower(
                self.factory,
                self.layout.routing(),
                self.monitor.on_routing,
                client_suffix="demo-routing",
            ),
            CompactedFollower(
                self.factory,
                self.layout.precision(),
                self.monitor.on_precision,
                client_suffix="demo-precision",
            ),
            CompactedFollower(
                self.factory,
                self.layout.rollouts(),
                self.monitor.on_rollout,
                client_suffix="demo-rollouts",
            ),
        ]
        for f in followers:
            await f.catch_up()
        phase_title = ["warming up"]
        async with GraylaneClient(self.factory, client_id=f"demo-{uuid.uuid4().hex[:6]}") as client:
            await self._wait_served(client)
            await self._wait_gateway()
            tasks = [asyncio.create_task(f.follow(self.stop)) for f in followers]
            tasks += [
                asyncio.create_task(self._collect(client)),
                asyncio.create_task(self._live(lambda: f"{MODEL} — {phase_title[0]}")),
            ]
            try:
                if self.cfg.load_fraction > 0.0 and self.cfg.engine_rps > 0.0:
                    phase_title[0] = "measuring the path's capacity"
                    await self._probe_path(client)
                # The steady load starts only now: at a rate the path was measured to carry.
                tasks.append(asyncio.create_task(self._load(client)))
                await self._story(phase_title)
            finally:
                self.stop.set()
                for t in [*tasks, *self._calls]:
                    t.cancel()
                if self.gateway is not None:
                    self.gateway.close()
                for t in tasks:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t
                for f in followers:
                    await f.stop()
        return await self.audit_records()

    async def _probe_path(self, client: GraylaneClient) -> None:
        """Measure what the whole path carries before any steady load: closed-loop callers
        (each sends its next request when its last is answered) for a few seconds, so no
        backlog builds; their answers are not the story's. Then the load is
        ``load_fraction`` of that (or of the engine's capacity, whichever is lower)."""
        from graylane.app.bench.path import PROBE_S

        cfg = self.cfg
        answered: list[float] = []
        end = time.monotonic() + PROBE_S
        prompt = "graylane " * (cfg.prompt_len // 9)

        async def caller(k: int) -> None:
            i = 0
            while time.monotonic() < end:
                with contextlib.suppress(Exception):
                    await client.infer(
                        MODEL,
                        prompt=f"probe {k} {i} {prompt}",
                        routing_key=f"probe-{k}",
                        post_process=PostProcess.ARGMAX_LAST,
                        timeout=10,
                    )
                    answered.append(time.monotonic())
                i += 1

        await asyncio.gather(*(caller(k) for k in range(PROBE_CALLERS)))
        half = end - PROBE_S / 2
        path = sum(1 for t in answered if t >= half) / (PROBE_S / 2)
        self.rate = cfg.load_fraction * min(path, cfg.engine_rps) if path > 0 else cfg.rate
        self.base_rate = self.rate
        self.path_rps = path
        self.monitor.event(
            f"path capacity {path:.1f} req/s (engine {cfg.engine_rps:.1f}): "
            f"load {self.rate:.1f} req/s"
        )

    async def _wait_gateway(self, timeout_s: float = 60.0) -> None:
        """Until the gateway is ready; without one in time, all the load goes to Kafka."""
        if self.gateway is None:
            return
        deadline = time.monotonic() + timeout_s
        while (await self.gateway.request("GET", "/readyz")).status != 200:
            if time.monotonic() > deadline:
                self.console.print("[yellow]the gateway is not ready: all load goes to Kafka")
                self.gateway = None
                return
            await asyncio.sleep(0.5)

    async def _wait_served(self, client: GraylaneClient) -> None:
        deadline = time.monotonic() + 180
        while True:
            try:
                await client.infer(MODEL, prompt="probe", timeout=5)
                return
            except InferenceTimeout:
                if time.monotonic() > deadline:
                    raise

    async def _canary(self, baseline: str, candidate: str, suffix: str) -> str:
        rollout_id = f"ro-{MODEL}-{int(time.time())}-{suffix}"
        self.monitor.event(f"start rollout {rollout_id}: {baseline} -> {candidate}")
        await self.send_command(
            rollout_pb2.RolloutCommand(
                rollout_id=rollout_id,
                kind=rollout_pb2.COMMAND_START,
                spec=demo_rollout_spec(rollout_id, baseline, candidate),
            )
        )
        return rollout_id

    async def _story(self, title: list[str]) -> None:
        await asyncio.sleep(6)  # a baseline before anything changes
        title[0] = f"canary {STABLE} -> {HEALTHY} (healthy)"
        # The story starts from STABLE (the router's too), whatever earlier runs left there;
        # by now the control plane has caught up with the rollouts on record.
        self.registry.set_stable(MODEL, STABLE)
        before = self.registry_stable()
        self.monitor.event(f"registry stable version before the rollout: {before}")
        healthy = await self._canary(STABLE, HEALTHY, "a")
        await self._wait(
            lambda: self._phase_of(healthy) is Phase.PROMOTED,
            f"{HEALTHY} promoted",
            self._rollout_budget_s(),
        )
        await self._wait(
            lambda: self.registry_stable() == HEALTHY,
            f"registry stable version: {before} -> {HEALTHY}",
        )
        await asyncio.sleep(4)

        title[0] = f"canary {HEALTHY} -> {BAD} (slow and failing)"
        bad = await self._canary(HEALTHY, BAD, "b")
        await self._wait(
            lambda: self._phase_of(bad) is Phase.ROLLED_BACK,
            f"{BAD} rolled back automatically",
            self._rollout_budget_s(),
        )
        await asyncio.sleep(4)

        await self._revert(title)

    async def _revert(self, title: list[str]) -> None:
        """The operator's one-step way back: ``graylane rollout undo`` (control plane RPC)."""
        from graylane.app.cli.main import main

        before = self.registry_stable()
        title[0] = f"operator: graylane rollout undo {MODEL} (stable {before})"
        self.monitor.event(f"graylane rollout undo {MODEL} (stable {before})")
        argv = ["rollout", "undo", MODEL, "--reason", "demo: previous stable"]
        if await asyncio.to_thread(main, argv) != 0:
            self.monitor.event("rollout undo refused")
            return
        await self._wait(
            lambda: (
                self.monitor.weights.get(STABLE, 0.0) == 100.0 and self.registry_stable() == STABLE
            ),
            f"reverted: 100 % to {STABLE}; registry stable version: {before} -> {STABLE}",
        )
        await asyncio.sleep(3)

    async def audit_records(self) -> list[audit_pb2.AuditRecord]:
        from graylane.kafka.reading import read_to_end

        read = await read_to_end(
            self.factory, self.layout.audit(), timeout_s=None, client_suffix="demo-audit"
        )
        records = [serde.decode(audit_pb2.AuditRecord, r.value) for r in read]
        return [r for r in records if r.model == MODEL]


def audit_table(records: list[audit_pb2.AuditRecord], t0_ms: int) -> Table:
    """Every decision, timed from ``t0_ms`` (the demo's start: the report's clock)."""
    table = Table(title="audit timeline: every decision and why (seconds since the demo started)")
    for col in ("t (s)", "decision", "version", "rule", "reason"):
        table.add_column(col)
    for r in sorted(records, key=lambda r: r.decided_at_unix_ms):
        table.add_row(
            f"{(r.decided_at_unix_ms - t0_ms) / 1000:.1f}",
            audit_pb2.DecisionKind.Name(r.kind).removeprefix("DECISION_"),
            r.version or r.rollout_id,
            r.rule,
            r.reason[:90],
        )
    return table
