"""The chaos bench's stack and traffic.

The stack: a private Kafka broker the bench may stop, and every service as a separate
OS process it may kill -9 and start again. The traffic: a paced load through the
client SDK, every send and every result on record, and followers of the reply and
rollout topics that survive outages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from graylane import serde
from graylane.app.bench.harness import paced
from graylane.app.cli.demo import Service, free_port, start_service
from graylane.client import GraylaneClient
from graylane.errors import GraylaneError, SerdeError
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import KafkaFactory, Record
from graylane.serde import PostProcess
from graylane.settings import REPO_ROOT, Settings
from graylane.v1 import inference_pb2, rollout_pb2

__all__ = [
    "CANDIDATE",
    "MAX_PENDING_SENDS",
    "MODEL",
    "STABLE",
    "TOKEN",
    "Follower",
    "Ledger",
    "Load",
    "PrivateBroker",
    "Proc",
    "ReceivedResult",
    "RolloutWatch",
    "SeenState",
    "Sent",
    "ServiceSet",
    "StackError",
    "build_model",
    "log_mentions",
    "service_env",
    "start_all",
    "tail",
    "wait_port",
    "worker_argv",
]


MODEL = "chaos-gpt"
STABLE, CANDIDATE = "1.0.0", "1.1.0"
TOKEN = "chaos-bench-token-0123456789"


class StackError(GraylaneError):
    """The bench's stack could not be set up."""


@dataclass
class PrivateBroker:
    """A local broker of its own (state under ``root``, free ports), never the shared one."""

    root: Path
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "GRAYLANE_LOCAL_DIR": str(self.root),
            "GRAYLANE_KAFKA_PORT": str(self.port),
            "GRAYLANE_KAFKA_CONTROLLER_PORT": str(self.controller_port),
        }

    def _run(self, command: str, timeout_s: float) -> None:
        done = subprocess.run(
            [sys.executable, str(REPO_ROOT / "deploy" / "kafka" / "kafka.py"), command],
            env=self._env(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(
                f"kafka.py {command} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )

    def start(self) -> None:
        self._run("start", 240)

    def stop(self) -> None:
        self._run("stop", 120)

    def remove(self) -> None:
        """Stop (if running) and delete the broker's data; its logs stay."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root / "kafka" / "data", ignore_errors=True)


@dataclass
class Proc:
    """One service: how to start it, and its current process."""

    name: str
    argv: list[str]
    service: Service | None = None
    starts: int = 0

    @property
    def pid(self) -> int | None:
        return self.service.process.pid if self.service else None

    def alive(self) -> bool:
        return self.service is not None and self.service.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.service is None else self.service.process.poll()

    @property
    def log(self) -> Path | None:
        return self.service.log if self.service else None


@dataclass
class ServiceSet:
    """The stack's service processes (router, workers, policy engine, control plane)."""

    env: dict[str, str]
    logs: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    def add(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv)
        self.procs[name] = proc
        self.start(name)
        return proc

    def start(self, name: str) -> Proc:
        proc = self.procs[name]
        label = name if proc.starts == 0 else f"{name}.{proc.starts}"  # keep earlier logs
        proc.service = start_service(label, proc.argv, self.logs, self.env)
        proc.starts += 1
        return proc

    def kill(self, name: str) -> None:
        """kill -9, and reap it."""
        proc = self.procs[name]
        if proc.service is not None and proc.alive():
            os.kill(proc.service.process.pid, signal.SIGKILL)
            proc.service.process.wait(timeout=30)

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if not p.alive()]

    def all_alive(self) -> bool:
        return not self.dead()

    def stop_all(self) -> None:
        running = [p.service for p in self.procs.values() if p.service and p.alive()]
        for s in running:
            s.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for s in running:
            try:
                s.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.process.kill()
                s.process.wait()


def service_env(settings: Settings, run_dir: Path, cp_port: int) -> dict[str, str]:
    """What every service process is told: the private broker, DB, artifacts, tokens."""
    return {
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_DB_URL": settings.db_url,
        "GRAYLANE_ARTIFACT_DIR": str(settings.artifact_dir),
        "GRAYLANE_LOCAL_DIR": str(run_dir),
        "GRAYLANE_METRICS_PORT": "-1",
        "GRAYLANE_LOG_FORMAT": "text",
        "GRAYLANE_CP_TOKENS": f"{TOKEN}:operator:chaos-bench",
        "GRAYLANE_CP_PORT": str(cp_port),
    }


def worker_argv(version: str, model_file: Path, worker_id: str) -> list[str]:
    return [
        "worker",
        "--model",
        MODEL,
        "--version",
        version,
        "--variant",
        f"fp32={model_file}",
        "--threads",
        "1",
        "--worker-id",
        worker_id,
    ]


def start_all(
    services: ServiceSet,
    files: dict[str, Path],
    *,
    window_ms: int,
    step_ms: int,
    stable_workers: int = 2,
) -> None:
    """Router, ``stable_workers`` workers of the stable version (``worker-a``, ``worker-b``),
    one of the candidate, policy engine, control plane."""
    services.add("controlplane", ["controlplane"])
    services.add("router", ["router", "--model", f"{MODEL}={STABLE}"])
    for letter in "ab"[:stable_workers]:
        services.add(
            f"worker-{letter}", worker_argv(STABLE, files[STABLE], f"chaos-worker-{letter}")
        )
    services.add("candidate", worker_argv(CANDIDATE, files[CANDIDATE], "chaos-candidate"))
    services.add(
        "policy",
        ["policy", "--model", MODEL, "--window-ms", str(window_ms), "--step-ms", str(step_ms)],
    )


def log_mentions(path: Path | None, text: str) -> bool:
    return path is not None and path.exists() and text in path.read_text(errors="replace")


def wait_port(port: int, timeout_s: float, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise StackError(f"the process for port {port} exited")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise StackError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")


def tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def build_model(settings: Settings, progress: Callable[[str], None]) -> dict[str, Path]:
    """Build both demo versions through the builder into this run's registry; model files."""
    from graylane.app.cli.capacity import registered_variants
    from graylane.app.demo.build_versions import build_versions
    from graylane.registry.repository import open_registry

    build_versions(
        settings,
        MODEL,
        {STABLE: 1, CANDIDATE: 2},
        size="tiny",
        precisions=("fp32",),
        progress=progress,
    )
    registry = open_registry(settings.db_url)
    registry.set_stable(MODEL, STABLE)
    registry.engine.dispose()
    return {v: registered_variants(settings, MODEL, v)["fp32"] for v in (STABLE, CANDIDATE)}


log = logging.getLogger(__name__)

MAX_PENDING_SENDS = 50_000


@dataclass
class Sent:
    """One request of the steady load."""

    phase: str
    sent_at: float
    acked_at: float | None = None
    failure: str = ""


@dataclass(frozen=True, slots=True)
class ReceivedResult:
    """One result read back for a request: when, and whether it was OK."""

    at: float
    ok: bool
    code: str


@dataclass
class Ledger:
    """Every request sent and every result read back (duplicates included)."""

    sent: dict[str, Sent] = field(default_factory=dict)
    answers: dict[str, list[ReceivedResult]] = field(default_factory=dict)
    undecodable: int = 0
    waiters: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    def on_result(self, record: Record) -> None:
        try:
            pb = serde.decode(inference_pb2.InferenceResult, record.value)
        except SerdeError:
            self.undecodable += 1
            return
        ok = pb.status == inference_pb2.OK
        code = "" if ok else _code_name(pb.error_code)
        self.answers.setdefault(pb.request_id, []).append(
            ReceivedResult(time.monotonic(), ok, code)
        )
        waiter = self.waiters.pop(pb.request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def first_answer(self, request_id: str) -> ReceivedResult | None:
        got = self.answers.get(request_id)
        return got[0] if got else None

    def unanswered(self, phase: str, sent_before: float) -> int:
        return sum(
            1
            for rid, s in self.sent.items()
            if s.phase == phase
            and s.acked_at is not None
            and s.sent_at < sent_before
            and rid not in self.answers
        )


def _code_name(code: int) -> str:
    try:
        return inference_pb2.ErrorCode.Name(code)
    except ValueError:
        return str(code)


class Follower:
    """Every record of a topic from its beginning, each (partition, offset) handled once;
    a follower that fails (a broker outage) is started again."""

    def __init__(
        self, factory: KafkaFactory, topic: str, handle: Callable[[Record], None], name: str
    ) -> None:
        self._factory, self._topic, self._handle, self._name = factory, topic, handle, name
        self._seen: set[tuple[int, int]] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.restarts = 0
        self.started = asyncio.Event()

    def _on(self, record: Record) -> None:
        mark = (record.partition, record.offset)
        if mark in self._seen:
            return
        self._seen.add(mark)
        self._handle(record)

    async def _run(self) -> None:
        while not self._stop.is_set():
            follower = TopicFollower(
                self._factory,
                self._topic,
                self._on,
                start_at=FollowFrom.BEGINNING,
                client_suffix=f"chaos-{self._name}-{uuid.uuid4().hex[:4]}",
                poll_ms=200,
            )
            try:
                await follower.start()
                self.started.set()
                await follower.run_until(self._stop)
            except Exception as exc:  # an outage: read again from the beginning, skip what was seen
                log.warning("follower of %s failed (%s); starting again", self._topic, exc)
            finally:
                with contextlib.suppress(Exception):
                    await follower.stop()
            if not self._stop.is_set():
                self.restarts += 1
                await asyncio.sleep(1.0)

    async def start(self, timeout_s: float = 60.0) -> None:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.started.wait(), timeout_s)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 30)


@dataclass(frozen=True, slots=True)
class SeenState:
    seen_at: float
    state: rollout_pb2.RolloutState


class RolloutWatch:
    """Rollout states as the policy engine writes them."""

    def __init__(self) -> None:
        self.states: list[SeenState] = []

    def on_record(self, record: Record) -> None:
        if not record.value:
            return
        try:
            state = serde.decode(rollout_pb2.RolloutState, record.value)
        except SerdeError:
            return
        self.states.append(SeenState(time.monotonic(), state))

    def latest(self, rollout_id: str) -> rollout_pb2.RolloutState | None:
        for seen in reversed(self.states):
            if seen.state.rollout_id == rollout_id:
                return seen.state
        return None

    def first_since(self, rollout_id: str, unix_ms: int) -> rollout_pb2.RolloutState | None:
        for seen in self.states:
            if seen.state.rollout_id == rollout_id and seen.state.updated_at_unix_ms >= unix_ms:
                return seen.state
        return None


class Load:
    """An open-loop load at ``rate`` req/s through one SDK client; each send is its own task,
    so a send that hangs (broker down) does not slow the pace."""

    def __init__(
        self, client: GraylaneClient, model: str, reply_topic: str, ledger: Ledger
    ) -> None:
        self.client = client
        self.model = model
        self.reply_topic = reply_topic
        self.ledger = ledger
        self.rate = 10.0
        self.phase = "warmup"
        self.skipped = 0
        self._pending: set[asyncio.Task[None]] = set()
        self._tokens = [(7 * k) % 250 + 3 for k in range(32)]

    def request(self) -> inference_pb2.InferenceRequest:
        return self.client.build_request(
            self.model,
            token_ids=self._tokens,
            routing_key=f"user-{uuid.uuid4().hex[:8]}",
            post_process=PostProcess.ARGMAX_LAST,
            reply_topic=self.reply_topic,
        )

    def send_one(self) -> str:
        req = self.request()
        sent = Sent(self.phase, time.monotonic())
        self.ledger.sent[req.request_id] = sent
        task = asyncio.create_task(self._send(req, sent, self.client))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return req.request_id

    @staticmethod
    async def _send(
        req: inference_pb2.InferenceRequest, sent: Sent, client: GraylaneClient
    ) -> None:
        try:
            await client.send(req)
            sent.acked_at = time.monotonic()
        except Exception as exc:  # the SDK surfaced a failed send: not acknowledged
            sent.failure = f"{type(exc).__name__}: {exc}"[:200]

    async def run(self, stop: asyncio.Event) -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            if len(self._pending) < MAX_PENDING_SENDS:
                self.send_one()
            else:
                self.skipped += 1
            next_at = await paced(next_at, self.rate)

    async def settle_sends(self, timeout_s: float) -> None:
        """Wait for every send in flight to be acknowledged or to fail."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)
