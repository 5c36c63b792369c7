"""``graylane bench path``: what the request path itself costs, beside its ceilings.

A pre-filled queue is drained, and the drain timed, five ways in one run:

- **router + worker**: the requests wait on the ingress topic; results are counted
  on the results topic by an independent reader (its end offsets);
- **router alone**: from the ingress to the version topic;
- **worker alone**: from the version topic to the results topic;
- **two Kafka pass-through hops** (consume -> produce, twice: the router -> worker
  topology with nothing in between), once on librdkafka and once on aiokafka: what
  Kafka carries here, and how much of that each client leaves;

and the engine alone (ONNX Runtime, one thread, as the worker runs it) at batch 1
up to the worker's max batch. Each service starts, answers one request, and is
stopped (``SIGSTOP``) while the queue is written, then resumed (``SIGCONT``): the
drain times serving, not start-up or warm-up. Over each drain the CPU seconds of
every process (the broker's too, from ``/proc/<pid>/stat``) are divided by the
requests served; the batch sizes the worker ran come from its telemetry records.

The broker may be shared: its CPU is sampled for a second before the drain (its
processes stopped) and after it (idle), and the lower rate (its other clients, its own
chores) is taken off its CPU over the drain (``broker_cpu_us_per_req``;
``broker_cpu_us_per_req_gross`` keeps it all). The
engine is measured before and after the drains and the two averaged. The last line is JSON with
``path_rps``, ``engine_rps_b1``, ``engine_rps_bmax``, ``kafka_two_hop_rps``,
``router_cpu_us_per_req``, ``worker_cpu_us_per_req``, ``broker_cpu_us_per_req`` and
``mean_batch`` among the other figures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from graylane import serde
from graylane.app.bench.harness import demo_model
from graylane.app.bench.pass_through import READY, HopClient
from graylane.app.bench.spine import PROMPT_LEN, prompt_tokens
from graylane.app.cli.demo import Service, start_service, stop_services
from graylane.capacity import measure_variant
from graylane.client import GraylaneClient
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.kafka.admin import ensure_topics
from graylane.kafka.seam import KafkaFactory
from graylane.serde import PostProcess
from graylane.settings import REPO_ROOT, Settings
from graylane.topics import TopicLayout
from graylane.v1 import telemetry_pb2

__all__ = [
    "MODEL",
    "Drain",
    "DrainFigures",
    "EngineFigures",
    "PathCostConfig",
    "cpu_seconds",
    "main",
    "mean_batch",
    "run_path_cost",
    "summary",
]

MODEL = "bench-path"
VERSION = "v1"
Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class PathCostConfig:
    size: str = "tiny"
    queue: int = 20_000
    """Requests pre-filled for every drain."""
    max_batch: int = 32
    max_wait_ms: int = 5
    fixed_batching: bool = False
    """The worker always waits ``max_wait_ms`` for ``max_batch`` (no learned batching)."""
    engine_seconds: float = 1.5
    """Per batch size, for the engine-alone figures."""
    drain_timeout_s: float = 600.0
    ready_timeout_s: float = 180.0
    private_broker: bool = False
    """Drain through a broker of the bench's own (free ports, state under .local), so the
    broker's CPU is the path's alone; stopped and its data removed at the end."""


class Drain(Enum):
    """What drains the queue."""

    PATH = "router+worker"
    ROUTER = "router alone"
    WORKER = "worker alone"
    LIBRDKAFKA = "2 hops, librdkafka"
    AIOKAFKA = "2 hops, aiokafka"


@dataclass(frozen=True)
class DrainFigures:
    """One timed drain."""

    drain: Drain
    requests: int
    seconds: float
    cpu_s: dict[str, float]
    """Process name (``broker`` among them) -> CPU seconds over the drain."""
    batches: tuple[int, ...] = ()
    """Forward batch sizes the worker ran (from its telemetry)."""

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def cpu_us_per_req(self, process: str) -> float | None:
        seconds = self.cpu_s.get(process)
        if seconds is None or self.requests <= 0:
            return None
        return seconds / self.requests * 1e6


@dataclass(frozen=True)
class EngineFigures:
    """The engine's median ms per batch, by batch size (one thread, the bench's prompt)."""

    batch_ms: dict[int, float]

    def rps(self, batch: int) -> float:
        ms = self.batch_ms[batch]
        return batch / ms * 1000.0 if ms > 0 else 0.0

    def mean(self, other: EngineFigures) -> EngineFigures:
        """The mean of two measurements, size by size."""
        return EngineFigures({b: (ms + other.batch_ms[b]) / 2 for b, ms in self.batch_ms.items()})

    def us_per_req(self, batch: float) -> float:
        """Engine µs per request at the measured batch size nearest ``batch``."""
        nearest = min(self.batch_ms, key=lambda b: (abs(b - batch), b))
        return self.batch_ms[nearest] / nearest * 1000.0


def cpu_seconds(stat: str) -> float:
    """User + system CPU seconds of a process, from the text of its ``/proc/<pid>/stat``."""
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and parens
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float | None:
    try:
        return cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def mean_batch(batches: Sequence[int]) -> float:
    """Rows per forward batch, over the batches run (0 when none ran)."""
    return sum(batches) / len(batches) if batches else 0.0


# -- the bus: filling, counting and reading topics (librdkafka, off the services' seam) --


class _Bus:
    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Consumer, Producer

        self._bootstrap = bootstrap
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "enable.idempotence": True,
                "acks": "all",
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        self._reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-path-reader"})

    def create(self, topics: Sequence[str], partitions: int, replication: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self._bootstrap})
        done = admin.create_topics([NewTopic(t, partitions, replication) for t in topics])
        for future in done.values():
            future.result(30)

    def fill(self, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        for key, value in records:
            while True:
                try:
                    self._producer.produce(topic, value, key=key)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        left = self._producer.flush(60)
        if left:
            raise RuntimeError(f"{left} records not acknowledged while filling {topic}")

    def _partitions(self, topic: str) -> list[int]:
        meta = self._reader.list_topics(topic, timeout=10).topics[topic]
        return sorted(meta.partitions)

    def ends(self, topic: str) -> dict[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        deadline = time.monotonic() + 30
        while True:
            try:
                return {
                    p: self._reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in self._partitions(topic)
                }
            except KafkaException:  # a topic just created: its leaders are being elected
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def count(self, topic: str) -> int:
        return sum(self.ends(topic).values())

    def read(self, topic: str, start: dict[int, int]) -> list[bytes]:
        """Every record of ``topic`` from ``start`` (partition -> offset) to its end now."""
        from confluent_kafka import TopicPartition

        ends = self.ends(topic)
        left = {p: end for p, end in ends.items() if end > start.get(p, 0)}
        if not left:
            return []
        self._reader.assign([TopicPartition(topic, p, start.get(p, 0)) for p in left])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            for m in self._reader.consume(num_messages=1000, timeout=0.5):
                value, partition, offset = m.value(), m.partition(), m.offset()
                if m.error() is not None or value is None or partition is None or offset is None:
                    continue
                values.append(value)
                if offset + 1 >= left.get(partition, 0):
                    left.pop(partition, None)
        self._reader.unassign()
        return values

    def close(self) -> None:
        self._producer.flush(10)
        self._reader.close()


# -- one drain ----------------------------------------------------------------------------


@dataclass
class _Procs:
    """The processes of one drain, by name (the broker is added when its pid is known)."""

    services: list[Service] = field(default_factory=list)
    hops: list[tuple[str, subprocess.Popen[str]]] = field(default_factory=list)

    def pids(self) -> dict[str, int]:
        named = {s.name.split("-")[-1]: s.process.pid for s in self.services}
        named.update({name: p.pid for name, p in self.hops})
        return named

    def signal(self, sig: signal.Signals) -> None:
        for pid in self.pids().values():
            os.kill(pid, sig)

    def stop(self) -> None:
        for _, p in self.hops:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for _, p in self.hops:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for s in self.services:
            if s.process.poll() is None:
                os.kill(s.process.pid, signal.SIGCONT)
        stop_services(self.services)

    def dead(self) -> str | None:
        for s in self.services:
            if s.process.poll() is not None:
                return f"{s.name} exited ({s.process.returncode}); see {s.log}"
        for name, p in self.hops:
            if p.poll() is not None:
                return f"{name} exited ({p.returncode})"
        return None


@dataclass(frozen=True)
class _Plan:
    drain: Drain
    fill_topic: str
    out_topic: str
    records: Sequence[tuple[bytes, bytes]]
    telemetry_topic: str | None = None


def _wait(until: Callable[[], bool], procs: _Procs, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        dead = procs.dead()
        if dead:
            raise RuntimeError(f"{what}: {dead}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.1)


def _timed_drain(
    bus: _Bus,
    plan: _Plan,
    procs: _Procs,
    broker_pid: int | None,
    cfg: PathCostConfig,
    progress: Progress,
) -> DrainFigures:
    """Pause the processes, fill the queue, resume them and time the drain."""
    procs.signal(signal.SIGSTOP)
    try:
        bus.fill(plan.fill_topic, plan.records)
        base = bus.count(plan.out_topic)
        telemetry_from = bus.ends(plan.telemetry_topic) if plan.telemetry_topic else {}
        pids = procs.pids()
        idle_share = 0.0
        if broker_pid is not None:
            pids["broker"] = broker_pid
            idle_share = _idle_share(broker_pid, BROKER_IDLE_S)
        cpu0 = {name: _cpu_of(pid) for name, pid in pids.items()}
        started = time.monotonic()
    finally:
        procs.signal(signal.SIGCONT)
    n = len(plan.records)
    done, shown = 0, started
    while done < n:
        time.sleep(0.02)
        done = bus.count(plan.out_topic) - base
        now = time.monotonic()
        if now - shown >= 2.0:
            shown = now
            rate = done / (now - started)
            progress(f"  {plan.drain.value}: {done:,}/{n:,} drained, {rate:,.0f} req/s")
        dead = procs.dead()
        if dead:
            raise RuntimeError(f"{plan.drain.value}: {dead}")
        if now - started > cfg.drain_timeout_s:
            raise RuntimeError(
                f"{plan.drain.value}: {done:,}/{n:,} drained in {cfg.drain_timeout_s:.0f} s"
            )
    seconds = time.monotonic() - started
    cpu: dict[str, float] = {}
    for name, pid in pids.items():
        before, after = cpu0[name], _cpu_of(pid)
        if before is not None and after is not None:
            cpu[name] = after - before
    if "broker" in cpu and broker_pid is not None:
        # what the broker spends on others meanwhile is not this drain's: its rate before
        # (processes stopped) and after (processes idle), the lower of the two
        idle_share = min(idle_share, _idle_share(broker_pid, BROKER_IDLE_S))
        cpu[BROKER_GROSS] = cpu["broker"]
        cpu["broker"] = max(0.0, cpu["broker"] - idle_share * seconds)
    batches: tuple[int, ...] = ()
    if plan.telemetry_topic:
        batches = _batch_sizes(bus.read(plan.telemetry_topic, telemetry_from))
    figures = DrainFigures(plan.drain, n, seconds, cpu, batches)
    progress(f"  {plan.drain.value}: {n:,} in {seconds:.1f} s = {figures.rps:,.0f} req/s")
    return figures


BROKER_IDLE_S = 1.0
"""How long the broker's CPU is sampled before a drain (its processes stopped) and after
it (idle): the lower rate is the share of a core it spends on everything else (a shared
broker's other clients, its own chores)."""
BROKER_GROSS = "broker (gross)"


def _idle_share(pid: int, seconds: float) -> float:
    before = _cpu_of(pid)
    time.sleep(seconds)
    after = _cpu_of(pid)
    return 0.0 if before is None or after is None else max(0.0, (after - before) / seconds)


def _batch_sizes(values: Sequence[bytes]) -> tuple[int, ...]:
    sizes: list[int] = []
    for value in values:
        t = serde.decode(telemetry_pb2.BatchTelemetry, value)
        if t.model == MODEL and t.request_count > 0:
            sizes.append(t.batch_size)
    return tuple(sizes)


# -- the drains ------------------------------------------------------------------------


def _requests(factory: KafkaFactory, n: int, *, routed: bool) -> list[tuple[bytes, bytes]]:
    """``n`` forward requests as the client writes them (``routed``: as the router
    forwards them, for the worker-alone drain)."""
    client = GraylaneClient(factory, listen=False)
    prompts = [prompt_tokens(i) for i in range(64)]
    run = uuid.uuid4().hex[:8]
    records = []
    for i in range(n):
        request = client.build_request(
            MODEL,
            token_ids=prompts[i % len(prompts)],
            routing_key=f"u{i}",
            post_process=PostProcess.ARGMAX_LAST,
            request_id=f"{run}-{i}",
            reply_topic="",
        )
        if routed:
            request.routed_version = VERSION
            request.routed_at_unix_ms = request.created_at_unix_ms
        records.append((request.routing_key.encode(), serde.encode(request)))
    return records


def _service_env(settings: Settings) -> dict[str, str]:
    return {
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
    }


def _router(settings: Settings) -> Service:
    return start_service(
        "bench-path-router",
        ["router", "--model", f"{MODEL}={VERSION}"],
        REPO_ROOT / ".local" / "logs",
        _service_env(settings),
    )


def _worker(settings: Settings, model: Path, cfg: PathCostConfig) -> Service:
    argv = [
        "worker",
        "--model",
        MODEL,
        "--version",
        VERSION,
        "--variant",
        f"fp32={model}",
        "--threads",
        "1",
        "--max-batch",
        str(cfg.max_batch),
        "--max-wait-ms",
        str(cfg.max_wait_ms),
    ]
    if cfg.fixed_batching:
        argv.append("--fixed-batching")
    return start_service(
        "bench-path-worker", argv, REPO_ROOT / ".local" / "logs", _service_env(settings)
    )


async def _fresh(settings: Settings) -> KafkaFactory:
    """A factory on a topic prefix of its own, its topics created (no backlog carries over)."""
    factory = KafkaFactory(settings.with_overrides(topic_prefix=f"bp{uuid.uuid4().hex[:6]}"))
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(MODEL, [VERSION]))
    return factory


def _service_drain(
    drain: Drain,
    settings: Settings,
    model: Path,
    bus: _Bus,
    broker_pid: int | None,
    cfg: PathCostConfig,
    progress: Progress,
) -> DrainFigures:
    factory = asyncio.run(_fresh(settings))
    layout: TopicLayout = factory.layout
    ingress = layout.ingress(MODEL)
    version_topic = layout.version_requests(MODEL, VERSION)
    results = layout.results(MODEL)
    procs = _Procs()
    try:
        if drain in (Drain.PATH, Drain.ROUTER):
            procs.services.append(_router(factory.settings))
        if drain in (Drain.PATH, Drain.WORKER):
            procs.services.append(_worker(factory.settings, model, cfg))
        fill_topic = version_topic if drain is Drain.WORKER else ingress
        out_topic = version_topic if drain is Drain.ROUTER else results
        routed = drain is Drain.WORKER
        progress(f"{drain.value}: starting, waiting for one request to be served")
        bus.fill(fill_topic, _requests(factory, 1, routed=routed))
        _wait(lambda: bus.count(out_topic) >= 1, procs, cfg.ready_timeout_s, drain.value)
        plan = _Plan(
            drain,
            fill_topic,
            out_topic,
            _requests(factory, cfg.queue, routed=routed),
            telemetry_topic=None if drain is Drain.ROUTER else layout.telemetry(),
        )
        progress(f"{drain.value}: paused, {cfg.queue:,} requests queued on {fill_topic}")
        return _timed_drain(bus, plan, procs, broker_pid, cfg, progress)
    finally:
        procs.stop()


def _hop(
    client: HopClient, bootstrap: str, src: str, dst: str, group: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "graylane.app.bench.pass_through",
            client.value,
            bootstrap,
            src,
            dst,
            group,
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        start_new_session=True,
    )


def _hops_drain(
    client: HopClient,
    settings: Settings,
    bus: _Bus,
    broker_pid: int | None,
    cfg: PathCostConfig,
    progress: Progress,
) -> DrainFigures:
    drain = Drain.LIBRDKAFKA if client is HopClient.LIBRDKAFKA else Drain.AIOKAFKA
    prefix = f"bp{uuid.uuid4().hex[:6]}.hop"
    topics = [f"{prefix}.in", f"{prefix}.mid", f"{prefix}.out"]
    bus.create(topics, settings.partitions, settings.replication_factor)
    procs = _Procs()
    try:
        for i, (src, dst) in enumerate(itertools.pairwise(topics)):
            hop = _hop(client, settings.bootstrap_servers, src, dst, f"{prefix}.g{i}")
            procs.hops.append((f"hop{i + 1}", hop))
        progress(f"{drain.value}: starting, waiting for one record to pass")
        for name, hop in procs.hops:
            line = hop.stdout.readline().strip() if hop.stdout else ""
            if line != READY:
                raise RuntimeError(f"{drain.value}: {name} did not start ({line!r})")
        factory = KafkaFactory(settings)
        bus.fill(topics[0], _requests(factory, 1, routed=False))
        _wait(lambda: bus.count(topics[2]) >= 1, procs, cfg.ready_timeout_s, drain.value)
        plan = _Plan(drain, topics[0], topics[2], _requests(factory, cfg.queue, routed=False))
        progress(f"{drain.value}: paused, {cfg.queue:,} records queued")
        return _timed_drain(bus, plan, procs, broker_pid, cfg, progress)
    finally:
        procs.stop()


def _engine(model: Path, cfg: PathCostConfig, progress: Progress) -> EngineFigures:
    sizes = sorted({*(2**k for k in range(12) if 2**k < cfg.max_batch), cfg.max_batch})
    progress(f"engine alone: ONNX Runtime, 1 thread, batch {', '.join(map(str, sizes))}")
    engine = OnnxRuntimeEngine.load(model, "fp32", intra_op_threads=1)
    try:
        seq = BucketPolicy.powers_of_two(512, 1).bucket_for(PROMPT_LEN)
        cap = measure_variant(
            engine, "fp32", seq_len=seq, batches=sizes, seconds_per_point=cfg.engine_seconds
        )
    finally:
        engine.close()
    figures = EngineFigures({p.batch: p.service_ms for p in cap.points})
    progress(
        "  engine alone: "
        + ", ".join(f"b{b} {figures.rps(b):,.0f}" for b in figures.batch_ms)
        + " req/s"
    )
    return figures


@dataclass(frozen=True)
class PathCostRun:
    """Everything one run measured."""

    config: PathCostConfig
    engine: EngineFigures
    drains: dict[Drain, DrainFigures]
    broker_known: bool


def run_path_cost(cfg: PathCostConfig, progress: Progress) -> PathCostRun:
    from graylane.app.bench.chaos_stack import PrivateBroker
    from graylane.deploy.kafka import broker as kafka_broker
    from graylane.deploy.kafka.process import running_pid

    settings = Settings.from_env()
    private: PrivateBroker | None = None
    if cfg.private_broker:
        private = PrivateBroker(REPO_ROOT / ".local" / "bench-path" / uuid.uuid4().hex[:6])
        progress(f"starting a broker of the bench's own on {private.bootstrap}")
        private.start()
        broker_pid = _pid_in(private.root / "kafka" / "kafka.pid")
        settings = settings.with_overrides(bootstrap_servers=private.bootstrap)
    else:
        progress("starting the broker")
        kafka_broker.start()
        broker_pid = running_pid()
    if broker_pid is None:
        progress("the broker's pid is unknown here (not this checkout's): no broker CPU figure")
    try:
        return _measure(settings, broker_pid, cfg, progress)
    finally:
        if private is not None:
            private.remove()


def _pid_in(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _measure(
    settings: Settings, broker_pid: int | None, cfg: PathCostConfig, progress: Progress
) -> PathCostRun:

    if settings.security.client_options().get("security_protocol", "PLAINTEXT") != "PLAINTEXT":
        raise SystemExit("graylane bench path runs on a plaintext broker (the local one)")
    model = demo_model(cfg.size, progress=progress)
    first = _engine(model, cfg, progress)
    bus = _Bus(settings.bootstrap_servers)
    drains: dict[Drain, DrainFigures] = {}
    try:
        for client in (HopClient.LIBRDKAFKA, HopClient.AIOKAFKA):
            figures = _hops_drain(client, settings, bus, broker_pid, cfg, progress)
            drains[figures.drain] = figures
        for drain in (Drain.ROUTER, Drain.WORKER, Drain.PATH):
            drains[drain] = _service_drain(drain, settings, model, bus, broker_pid, cfg, progress)
    finally:
        bus.close()
    # before and after the drains: a load that comes and goes on a shared machine
    engine = first.mean(_engine(model, cfg, progress))
    return PathCostRun(cfg, engine, drains, broker_pid is not None)


def _us(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def summary(run: PathCostRun) -> dict[str, Any]:
    """The JSON figures of a run (``None`` where a figure could not be measured)."""
    cfg, engine, d = run.config, run.engine, run.drains
    path, worker = d[Drain.PATH], d[Drain.WORKER]
    batch = mean_batch(path.batches)
    two_hop = d[Drain.LIBRDKAFKA].rps
    bmax = engine.rps(cfg.max_batch)
    engine_us = engine.us_per_req(batch) if batch else None
    worker_us = path.cpu_us_per_req("worker")
    ceiling = min(bmax, two_hop)
    return {
        "model": f"demo-gpt-{cfg.size}",
        "prompt_tokens": PROMPT_LEN,
        "queue": cfg.queue,
        "max_batch": cfg.max_batch,
        "fixed_batching": cfg.fixed_batching,
        "path_rps": round(path.rps, 1),
        "engine_rps_b1": round(engine.rps(1), 1),
        "engine_rps_bmax": round(bmax, 1),
        "kafka_two_hop_rps": round(two_hop, 1),
        "kafka_two_hop_rps_aiokafka": round(d[Drain.AIOKAFKA].rps, 1),
        "router_alone_rps": round(d[Drain.ROUTER].rps, 1),
        "worker_alone_rps": round(worker.rps, 1),
        "router_cpu_us_per_req": _us(path.cpu_us_per_req("router")),
        "worker_cpu_us_per_req": _us(worker_us),
        "broker_cpu_us_per_req": _us(path.cpu_us_per_req("broker")),
        "broker_cpu_us_per_req_gross": _us(path.cpu_us_per_req(BROKER_GROSS)),
        "router_alone_cpu_us_per_req": _us(d[Drain.ROUTER].cpu_us_per_req("router")),
        "router_alone_broker_cpu_us_per_req": _us(d[Drain.ROUTER].cpu_us_per_req("broker")),
        "worker_alone_cpu_us_per_req": _us(worker.cpu_us_per_req("worker")),
        "worker_alone_broker_cpu_us_per_req": _us(worker.cpu_us_per_req("broker")),
        "two_hop_cpu_us_per_req": _us(_hops_cpu(d[Drain.LIBRDKAFKA])),
        "two_hop_broker_cpu_us_per_req": _us(d[Drain.LIBRDKAFKA].cpu_us_per_req("broker")),
        "two_hop_aiokafka_cpu_us_per_req": _us(_hops_cpu(d[Drain.AIOKAFKA])),
        "two_hop_aiokafka_broker_cpu_us_per_req": _us(d[Drain.AIOKAFKA].cpu_us_per_req("broker")),
        "mean_batch": round(batch, 2),
        "worker_alone_mean_batch": round(mean_batch(worker.batches), 2),
        "batches_run": len(path.batches),
        "batch_sizes": _histogram(path.batches),
        "engine_us_per_req_at_mean_batch": _us(engine_us),
        "engine_ms_per_batch": {str(b): round(ms, 3) for b, ms in engine.batch_ms.items()},
        "path_over_ceiling": round(path.rps / ceiling, 3) if ceiling > 0 else None,
        "worker_cpu_over_engine": (
            round(worker_us / engine_us, 2) if worker_us and engine_us else None
        ),
    }


def _hops_cpu(figures: DrainFigures) -> float | None:
    hops = [figures.cpu_us_per_req(name) for name in ("hop1", "hop2")]
    return None if any(h is None for h in hops) else sum(h for h in hops if h is not None)


def _histogram(batches: Sequence[int]) -> dict[str, int]:
    sizes, counts = np.unique(np.asarray(batches, dtype=np.int64), return_counts=True)
    return {str(int(s)): int(c) for s, c in zip(sizes, counts, strict=True)}


def table(run: PathCostRun) -> str:
    """The drains side by side, one line each."""
    lines = [
        f"{'drain':<20} {'req/s':>9} {'batch':>6} "
        + " ".join(f"{n + ' µs/req':>14}" for n in ("router", "worker", "hops", "broker"))
    ]
    for figures in run.drains.values():
        cells = [
            figures.cpu_us_per_req("router"),
            figures.cpu_us_per_req("worker"),
            _hops_cpu(figures),
            figures.cpu_us_per_req("broker"),
        ]
        batch = f"{mean_batch(figures.batches):.1f}" if figures.batches else "-"
        lines.append(
            f"{figures.drain.value:<20} {figures.rps:>9,.0f} {batch:>6} "
            + " ".join(f"{c:>14,.0f}" if c is not None else f"{'-':>14}" for c in cells)
        )
    e = run.engine
    lines.append(
        "engine alone         "
        + ", ".join(
            f"b{b} {e.rps(b):,.0f} req/s ({e.us_per_req(b):,.0f} µs/req)" for b in e.batch_ms
        )
    )
    return "\n".join(lines)


def main(cfg: PathCostConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    run = run_path_cost(cfg, progress)
    print(table(run), flush=True)
    print(json.dumps(summary(run)))
    return 0
