"""``graylane bench policy-scale``: where one policy engine stops keeping up.

For each size N (default 10, 100, 1,000, 3,000 models), on a topic prefix of its
own: the real policy-engine process (``graylane serve policy``, scale-out on) and
N models x 3 versions. Each model has a canary rollout (v1 -> v2, held at its
first step by a long dwell) and each version a QoS policy, all started through
the commands topic as the control plane would. The workers are replaced by a
telemetry writer: one ``BatchTelemetry`` per version per batch, at a per-version
request rate stated in the config, written to the real broker.

Measured per N, over a window after the engine has caught up with its commands:

- CPU per telemetry record: the engine process's user + system time (``/proc``)
  over the telemetry records it took (its ``graylane_policy_telemetry_records``);
- the tick time, p50 and p99 (``graylane_policy_tick_seconds``: metric gates,
  QoS and scale over every key, and publishing);
- how far behind it reads: telemetry written to taken by the core, p99
  (``graylane_policy_telemetry_delay_seconds``);
- memory: the engine's RSS at the end;
- lag: the engine's consumer group on the telemetry topic, at the start and at
  the end of the window (committed offsets, from the broker);
- decision latency: a regression is injected into known models' candidates
  (from then on every request of theirs fails). Detection runs from the first
  failing record's timestamp to the rollout's ``ROLLED_BACK`` state on its topic
  (the routing update goes out in the same publish). The sequential error test
  needs its evidence over ``k`` ticks whatever the load (:func:`evidence_ticks`
  replays it without I/O); decision latency is detection less ``(k - 1)`` steps:
  the engine's own delay from complete evidence to the command, plus under one
  step (an upper bound).

The largest N with p99 decision latency within ``max_decision_ms`` and no growing
lag is ``max_models_one_instance``.

``--instances 1,3`` runs each size again with three engines sharded by model
(``--sharded``, one consumer group): the same telemetry, commands and regressions, the
figures summed over the instances (CPU, records, tick and read-delay histograms; RSS is
the largest instance's). After each sharded size, one instance is killed (-9): the bench
waits until the survivors decide for each of its models (from the audit, which names the
instance and generation of every decision), injects regressions into some of them, and
judges the handover from the audit: no model lost, none resumed at another step, no
(model, generation) decided by two instances, no rollout rolled back twice. Those
figures are ``instances_scaling``.

A table, a plot (decision latency and CPU against N) and one JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from graylane import serde
from graylane.app.bench.harness import stack_env
from graylane.app.bench.policy_handover import (
    DecisionLedger,
    Takeover,
    instance_of,
    judge_takeover,
)
from graylane.app.cli.demo import Service, start_service, stop_services
from graylane.clock import now_ms
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.admin import ensure_topics, partition_counts
from graylane.kafka.reading import CompactedFollower, group_lag
from graylane.kafka.seam import ConsumerOptions, KafkaFactory, Producer, Record
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.messages import CommandRejected, RecordSkipped, RolloutAudit
from graylane.policy_engine.service import telemetry_into
from graylane.policy_engine.wire import command_of
from graylane.rollouts.vocabulary import DecisionKind
from graylane.settings import REPO_ROOT, Settings
from graylane.v1 import rollout_pb2, telemetry_pb2

__all__ = [
    "PolicyScaleConfig",
    "SizeResult",
    "TelemetryWriter",
    "evidence_ticks",
    "main",
    "max_models",
    "run_size",
    "tick_quantile",
]

VERSIONS = ("v1", "v2", "v3")
"""Per model: the stable version, the canary candidate and the previous stable kept warm."""
BASELINE, CANDIDATE = VERSIONS[0], VERSIONS[1]


@dataclass(frozen=True)
class PolicyScaleConfig:
    sizes: tuple[int, ...] = (10, 100, 1000, 3000)
    batches_per_s: float = 1.0
    """Batch telemetry records per version per second."""
    requests_per_batch: int = 8
    """So each version serves ``batches_per_s * requests_per_batch`` requests/s."""
    measure_s: float = 30.0
    regressions: int = 8
    """Injected per size, into distinct models, spread over the window."""
    window_ms: int = 10_000
    step_ms: int = 500
    """The engine's decision tick: part of every decision's latency."""
    max_decision_ms: float = 2_000.0
    instances: tuple[int, ...] = (1,)
    """Policy-engine processes per run: 1 is one engine (the lease's single writer, here
    without a lease); more run sharded by model (``--sharded``, one consumer group), and
    after the measured window one is killed (-9) and its models' takeover is checked."""
    ready_timeout_s: float = 600.0
    plot: Path = field(default_factory=lambda: REPO_ROOT / ".local" / "policy-scale.png")


@dataclass(frozen=True)
class SizeResult:
    models: int
    records_per_s: float
    cpu_us_per_record: float
    cpu_share: float
    """The engine's CPU seconds per second of the window (1.0 = one core busy)."""
    tick_ms_p50: float
    tick_ms_p99: float
    rss_mb: float
    lag_start: int
    lag_end: int
    decision_ms: tuple[float, ...]
    """Per regression: detection less the evidence floor (see :func:`evidence_ticks`)."""
    detection_ms: tuple[float, ...]
    """Per regression: its first failing record to the ROLLED_BACK state on its topic."""
    missed: int
    """Regressions injected that were not rolled back by the end of the wait."""
    ready_s: float
    read_delay_ms_p99: float = math.nan
    """How long after it was written a telemetry record reached the engine's core, p99
    (``graylane_policy_telemetry_delay_seconds``): how far behind the engine reads."""
    catch_up_s: float = 0.0
    """After the rollouts ran: until the engines had read the telemetry written meanwhile."""
    instances: int = 1
    takeover: Takeover | None = None
    """Sharded runs: one instance killed (-9) after the window, checked from the audit."""

    @property
    def lag_growing(self) -> bool:
        # A caught-up engine is at most a few commit intervals of records behind.
        slack = max(200.0, self.records_per_s * 5)
        return self.lag_end > self.lag_start + slack

    @property
    def decision_p99_ms(self) -> float:
        return float(np.percentile(self.decision_ms, 99)) if self.decision_ms else math.inf

    @property
    def keeps_up(self) -> bool:
        return not self.lag_growing and self.missed == 0

    def row(self) -> dict[str, object]:
        return {
            "models": self.models,
            "records_per_s": round(self.records_per_s, 1),
            "cpu_us_per_record": round(self.cpu_us_per_record, 1),
            "cpu_share": round(self.cpu_share, 2),
            "tick_ms_p50": round(self.tick_ms_p50, 1),
            "tick_ms_p99": round(self.tick_ms_p99, 1),
            "rss_mb": round(self.rss_mb, 1),
            "lag_start": self.lag_start,
            "lag_end": self.lag_end,
            "decision_ms_p50": round(float(np.percentile(self.decision_ms, 50)), 1)
            if self.decision_ms
            else None,
            "decision_ms_p99": round(self.decision_p99_ms, 1) if self.decision_ms else None,
            "detection_ms_p99": round(float(np.percentile(self.detection_ms, 99)), 1)
            if self.detection_ms
            else None,
            "missed": self.missed,
            "ready_s": round(self.ready_s, 1),
            "read_delay_ms_p99": round(self.read_delay_ms_p99, 1),
            "catch_up_s": round(self.catch_up_s, 1),
            "instances": self.instances,
            "takeover": None if self.takeover is None else self.takeover.row(),
        }


def tick_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """Quantile ``q`` (0-1) in ms of a Prometheus histogram's growth between two
    scrapes (cumulative ``le`` buckets): the upper bound of the bucket it falls in."""
    les = sorted(after)
    counts = [after[le] - before.get(le, 0.0) for le in les]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return math.nan
    for le, cum in zip(les, counts, strict=True):
        if cum >= q * total:
            return le * 1000.0
    return math.inf


def max_models(results: list[SizeResult], max_decision_ms: float) -> int:
    """The largest N kept up with (no growing lag, nothing missed, p99 within bound),
    every smaller N kept up with too; 0 when even the smallest was not."""
    best = 0
    for r in sorted(results, key=lambda r: r.models):
        if not (r.keeps_up and r.decision_p99_ms <= max_decision_ms):
            break
        best = r.models
    return best


# -- the engine process, seen from outside -----------------------------------------------


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return math.nan


@dataclass(frozen=True)
class Scrape:
    tick_buckets: dict[float, float]
    delay_buckets: dict[float, float]
    telemetry_records: float

    def plus(self, other: Scrape) -> Scrape:
        """Two engines' counters together (a sharded run reports its instances as one)."""

        def add(a: dict[float, float], b: dict[float, float]) -> dict[float, float]:
            return {le: a.get(le, 0.0) + b.get(le, 0.0) for le in a.keys() | b.keys()}

        return Scrape(
            add(self.tick_buckets, other.tick_buckets),
            add(self.delay_buckets, other.delay_buckets),
            self.telemetry_records + other.telemetry_records,
        )


def _scrape_all(ports: list[int]) -> Scrape:
    total = Scrape({}, {}, 0.0)
    for port in ports:
        total = total.plus(_scrape(port))
    return total


def _scrape(port: int) -> Scrape:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    histograms: dict[str, dict[float, float]] = {
        "graylane_policy_tick_seconds_bucket{": {},
        "graylane_policy_telemetry_delay_seconds_bucket{": {},
    }
    records = 0.0
    for line in text.splitlines():
        for prefix, buckets in histograms.items():
            if line.startswith(prefix):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                buckets[math.inf if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
        if line.startswith("graylane_policy_telemetry_records_total "):
            records = float(line.rsplit(" ", 1)[1])
    tick, delay = histograms.values()
    return Scrape(tick, delay, records)


# -- what the control plane and the workers would write ----------------------------------


def _model(i: int) -> str:
    return f"m{i:05d}"


def _commands(model: str, cfg: PolicyScaleConfig) -> list[rollout_pb2.RolloutCommand]:
    rate = cfg.batches_per_s * cfg.requests_per_batch
    cmds = [
        rollout_pb2.RolloutCommand(
            kind=rollout_pb2.COMMAND_SET_QOS_POLICY,
            qos_policy=rollout_pb2.QosPolicy(
                model=model,
                version=v,
                slo_p99_ms=200.0,
                ladder=["fp32", "fp16", "int8"],
                quality_floor="int8",
                step_down_margin=0.2,
                step_up_ratio=0.6,
                sustain_s=3.0,
                min_dwell_s=10.0,
                enabled=True,
                rung_capacity_rps={"fp32": rate * 4, "fp16": rate * 8, "int8": rate * 12},
                up_capacity_fraction=0.7,
            ),
        )
        for v in VERSIONS
    ]
    rid = f"{model}-canary"
    cmds.append(
        rollout_pb2.RolloutCommand(
            rollout_id=rid,
            kind=rollout_pb2.COMMAND_START,
            spec=rollout_pb2.RolloutSpec(
                rollout_id=rid,
                model=model,
                baseline_version=BASELINE,
                candidate_version=CANDIDATE,
                strategy=rollout_pb2.CANARY,
                steps=[
                    # Held at the first step for the whole run: its dwell is an hour.
                    rollout_pb2.RolloutStep(weight_percent=10.0, min_samples=50, min_dwell_s=3600),
                    rollout_pb2.RolloutStep(weight_percent=100.0, min_samples=50, min_dwell_s=60),
                ],
                failures_to_rollback=1,
            ),
        )
    )
    for i, cmd in enumerate(cmds):
        cmd.command_id = f"{model}-{i}"
        cmd.model = model
        cmd.issued_by = "graylane bench policy-scale"
    return cmds


class TelemetryWriter:
    """One ``BatchTelemetry`` per version per ``1 / batches_per_s`` seconds, paced in
    small slices; latencies drawn once per version from one distribution, so baseline
    and candidate are alike and no healthy canary is judged a regression."""

    def __init__(self, topic: str, models: list[str], cfg: PolicyScaleConfig) -> None:
        self._topic = topic
        self._cfg = cfg
        self._keys = [(m, v) for m in models for v in VERSIONS]
        rng = random.Random(7)
        self._shapes: list[telemetry_pb2.LatencyHistogram] = []
        for _ in range(32):
            h = LatencyHistogram()
            draws = range(cfg.requests_per_batch)
            h.record_many(rng.lognormvariate(math.log(20.0), 0.25) for _ in draws)
            self._shapes.append(histogram_to_pb(h))
        self._offsets = itertools.count()
        self.sent = 0
        self.regressed: set[str] = set()
        """Models whose candidate fails every request from now on."""
        self.onset: dict[str, int] = {}
        """Model -> the timestamp of its candidate's first failing record."""

    def record(self, model: str, version: str, *, done_ms: int | None = None) -> bytes:
        """One batch's telemetry; every request failed when ``model`` regressed and
        ``version`` is its candidate."""
        done = now_ms() if done_ms is None else done_ms
        n = self._cfg.requests_per_batch
        errors = n if version == CANDIDATE and model in self.regressed else 0
        t = telemetry_pb2.BatchTelemetry(
            model=model,
            version=version,
            variant="fp32",
            worker_id=f"w-{model}-{version}",
            batch_size=n,
            request_count=n,
            error_count=errors,
            latency=self._shapes[next(self._offsets) % len(self._shapes)],
            queue_wait_ms_mean=1.0,
            compute_ms=5.0,
            device_load=0.3,
            started_at_unix_ms=done - 25,
            completed_at_unix_ms=done,
            error_codes={"ENGINE_FAILURE": errors} if errors else {},
            batch_id=telemetry_pb2.BatchId(
                worker_id=f"w-{model}-{version}", partition=0, first_offset=next(self._offsets)
            ),
        )
        return serde.encode(t)

    async def send(self, producer: Producer, model: str, version: str) -> None:
        ts = now_ms()
        failing = version == CANDIDATE and model in self.regressed
        await producer.send(
            self._topic,
            self.record(model, version, done_ms=ts),
            key=model.encode(),  # keyed by model, as workers write it
            timestamp_ms=ts,
        )
        if failing and model not in self.onset:
            self.onset[model] = ts
        self.sent += 1

    async def run(self, producer: Producer, stop: asyncio.Event) -> None:
        slice_s = 0.05
        per_slice = len(self._keys) * self._cfg.batches_per_s * slice_s
        owed = 0.0
        keys = itertools.cycle(self._keys)
        next_at = time.monotonic()
        while not stop.is_set():
            owed += per_slice
            while owed >= 1.0:
                model, version = next(keys)
                await self.send(producer, model, version)
                owed -= 1.0
            next_at += slice_s
            delay = next_at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            else:
                next_at = time.monotonic()  # behind: never burst to catch up


def evidence_ticks(cfg: PolicyScaleConfig) -> int:
    """The decision ticks that must see a failing candidate before the pure decision
    logic rolls it back, at this config's rates, window and step: replayed here on a
    :class:`PolicyCore` with a simulated clock (no broker, no lag, no tick cost).

    A regression's first failing record is followed by its first tick within one step,
    and by the deciding tick ``k - 1`` steps later: a detection time less
    ``(k - 1) * step`` is the engine's own delay plus under one step, an upper bound."""
    core = PolicyCore(cfg.window_ms, cfg.step_ms)
    model = "m-replay"
    start = 1_700_000_000_000
    for pb in _commands(model, cfg):
        cmd = command_of(serde.encode(pb), core.guard, start)
        if isinstance(cmd, (CommandRejected, RecordSkipped)):
            raise RuntimeError(f"the bench's own command was refused: {cmd}")
        core.on_command(cmd, start)
    writer = TelemetryWriter("replay", [model], cfg)
    period_ms = 1000.0 / cfg.batches_per_s
    onset = start + 2 * cfg.window_ms
    next_record, next_tick, seen = float(start), start + cfg.step_ms, 0
    while next_tick < onset + 600_000:
        if next_record <= next_tick:
            at = int(next_record)
            if at >= onset:
                writer.regressed.add(model)
            for v in VERSIONS:
                telemetry_into(core, writer.record(model, v, done_ms=at), core.guard, at)
            next_record += period_ms
            continue
        outputs = core.tick(next_tick)
        seen += 1 if writer.regressed else 0
        if any(
            isinstance(o, RolloutAudit) and o.decision.kind is DecisionKind.ROLLBACK
            for o in outputs
        ):
            return max(1, seen)
        next_tick += cfg.step_ms
    raise RuntimeError("the replayed regression was never rolled back")


# -- one size ------------------------------------------------------------------------------


async def run_size(
    base: Settings,
    n: int,
    cfg: PolicyScaleConfig,
    progress: Callable[[str], None],
    instances: int = 1,
) -> SizeResult:
    import uuid

    settings = base.with_overrides(topic_prefix=f"pscale{n}x{uuid.uuid4().hex[:6]}")
    factory = KafkaFactory(settings)
    layout = factory.layout
    models = [_model(i) for i in range(n)]
    tag = f"N={n}" if instances == 1 else f"N={n} x{instances} instances"
    # The version topics the engine's liveness probe reads (one partition each: thousands
    # of them on one broker); no worker consumes them, so their lag stays 0.
    version_topics = [
        replace(s, partitions=1)
        for m in models
        for s in layout.model_specs(m, list(VERSIONS))
        if s.name in {layout.version_requests(m, v) for v in VERSIONS}
    ]
    progress(f"{tag}: creating {len(version_topics)} version topics")
    await ensure_topics(factory, layout.shared_specs())
    for i in range(0, len(version_topics), 500):  # the broker refuses larger create batches
        await ensure_topics(factory, version_topics[i : i + 500])
    rolled: dict[str, int] = {}  # rollout id -> the ROLLED_BACK record's timestamp
    running: set[str] = set()

    def on_rollout(record: Record) -> None:
        if record.value is None:
            return
        state = serde.decode(rollout_pb2.RolloutState, record.value)
        if state.phase == rollout_pb2.PROGRESSING:
            running.add(state.rollout_id)
        elif state.phase == rollout_pb2.ROLLED_BACK and state.rollout_id not in rolled:
            rolled[state.rollout_id] = int(record.timestamp)

    follower = CompactedFollower(factory, layout.rollouts(), on_rollout, client_suffix="ps-r")
    await follower.catch_up()
    stop_follow = asyncio.Event()
    following = [asyncio.create_task(follower.follow(stop_follow))]
    ledger = DecisionLedger()
    auditor = CompactedFollower(factory, layout.audit(), ledger.take, client_suffix="ps-a")
    if instances > 1:
        await auditor.catch_up()
        following.append(asyncio.create_task(auditor.follow(stop_follow)))
    mode = ["--no-lease"] if instances == 1 else ["--sharded"]
    engines: list[Service] = [
        start_service(
            f"policy-scale-{n}" + ("" if instances == 1 else f"-{i}"),
            [
                "policy",
                *mode,
                "--window-ms",
                str(cfg.window_ms),
                "--step-ms",
                str(cfg.step_ms),
                "--max-replicas",
                "4",
                "--loglevel",
                "warning" if instances == 1 else "info",
            ],
            REPO_ROOT / ".local" / "logs",
            stack_env(settings),
        )
        for i in range(instances)
    ]
    producer = factory.producer()
    await producer.start()
    writer = TelemetryWriter(layout.telemetry(), models, cfg)
    stop_writing = asyncio.Event()
    writing: asyncio.Task[None] | None = None
    admin = factory.admin()
    ends = factory.consumer(options=ConsumerOptions(group_id=None), client_suffix="ps-lag")
    await admin.start()
    await ends.start()
    try:
        t0 = time.monotonic()
        for m in models:
            for cmd in _commands(m, cfg):
                cmd.issued_at_unix_ms = now_ms()
                await producer.send(layout.commands(), serde.encode(cmd), key=m.encode())
        await producer.flush()
        progress(f"{tag}: {len(models) * 4} commands sent; waiting for {n} rollouts to run")
        writing = asyncio.create_task(writer.run(producer, stop_writing))
        while len(running) < n:
            for engine in engines:
                if engine.process.poll() is not None:
                    raise RuntimeError(f"a policy engine exited; see {engine.log}")
            if time.monotonic() - t0 > cfg.ready_timeout_s:
                raise RuntimeError(
                    f"only {len(running)}/{n} rollouts ran in {cfg.ready_timeout_s} s"
                )
            await asyncio.sleep(0.5)
        ready_s = time.monotonic() - t0
        progress(f"{tag}: all rollouts running after {ready_s:.1f} s; warming the windows")
        await asyncio.sleep(cfg.window_ms / 1000.0)
        (telemetry_partitions,) = (await partition_counts(factory, [layout.telemetry()])).values()
        group = f"{settings.topic_prefix}-policy"

        async def lag() -> int:
            offsets = await group_lag(ends, admin, group, layout.telemetry(), telemetry_partitions)
            return offsets.lag

        # The commands and topics of a large N take the engines a while, and the telemetry
        # written meanwhile waits for them: the window is measured once they have read it
        # (their group's lag within a few seconds of records), not while they catch up.
        rate = n * len(VERSIONS) * cfg.batches_per_s
        slack = max(200.0, rate * 5)
        catching = time.monotonic()
        caught_up_by = catching + cfg.ready_timeout_s
        behind = await lag()
        least, least_at = behind, catching
        # ... unless they stop gaining on it: then the window shows them falling behind.
        while behind > slack and time.monotonic() < min(caught_up_by, least_at + 30.0):
            progress(f"{tag}: catching up with the telemetry written meanwhile: lag {behind}")
            await asyncio.sleep(5.0)
            behind = await lag()
            if behind < least:
                least, least_at = behind, time.monotonic()
        catch_up_s = time.monotonic() - catching
        pids = [e.process.pid for e in engines]
        ports = [e.metrics_port for e in engines]
        lag0, cpu0, scrape0 = await lag(), sum(map(_cpu_s, pids)), _scrape_all(ports)
        w0 = time.monotonic()
        targets = random.Random(n).sample(models, min(cfg.regressions, n))
        gap = cfg.measure_s / (len(targets) + 1)
        for i, m in enumerate(targets):
            await asyncio.sleep(gap)
            writer.regressed.add(m)
            progress(f"{tag}: regression {i + 1}/{len(targets)} injected into {m}")
        await asyncio.sleep(max(0.0, cfg.measure_s - gap * len(targets)))
        cpu1, scrape1, w1 = sum(map(_cpu_s, pids)), _scrape_all(ports), time.monotonic()
        lag1, rss = await lag(), max(map(_rss_mb, pids))
        injected = {f"{m}-canary": m for m in targets}
        await _wait_rolled(rolled, injected, cfg)
        floor_ms = (evidence_ticks(cfg) - 1) * cfg.step_ms
        detected = {r: rolled[r] - writer.onset[m] for r, m in injected.items() if r in rolled}
        takeover = None
        if instances > 1:
            takeover = await _kill_one(engines, ledger, writer, rolled, targets, cfg, tag, progress)
        records = scrape1.telemetry_records - scrape0.telemetry_records
        cpu = cpu1 - cpu0
        return SizeResult(
            models=n,
            records_per_s=records / (w1 - w0),
            cpu_us_per_record=cpu / records * 1e6 if records else math.inf,
            cpu_share=cpu / (w1 - w0),
            tick_ms_p50=tick_quantile(scrape0.tick_buckets, scrape1.tick_buckets, 0.5),
            tick_ms_p99=tick_quantile(scrape0.tick_buckets, scrape1.tick_buckets, 0.99),
            rss_mb=rss,
            lag_start=lag0,
            lag_end=lag1,
            decision_ms=tuple(float(d - floor_ms) for d in detected.values()),
            detection_ms=tuple(float(d) for d in detected.values()),
            missed=sum(1 for r in injected if r not in rolled),
            ready_s=ready_s,
            read_delay_ms_p99=tick_quantile(scrape0.delay_buckets, scrape1.delay_buckets, 0.99),
            catch_up_s=catch_up_s,
            instances=instances,
            takeover=takeover,
        )
    finally:
        stop_writing.set()
        if writing is not None:
            with contextlib.suppress(Exception):
                await writing
        stop_follow.set()
        for task in following:
            with contextlib.suppress(Exception):
                await task
        await follower.stop()
        await auditor.stop()
        await producer.stop()
        await ends.stop()
        stop_services(engines)
        # The size's topics go with it: a broker holding every earlier size's thousands of
        # topics answers each metadata request of the next size's engines with all of them.
        names = [t.name for t in version_topics] + [t.name for t in layout.shared_specs()]
        for i in range(0, len(names), 500):
            with contextlib.suppress(Exception):
                await admin.delete_topics(names[i : i + 500])
        await admin.close()


async def _wait_rolled(
    rolled: dict[str, int], injected: dict[str, str], cfg: PolicyScaleConfig
) -> None:
    wait_until = time.monotonic() + max(30.0, 10 * cfg.max_decision_ms / 1000.0)
    while any(r not in rolled for r in injected) and time.monotonic() < wait_until:
        await asyncio.sleep(0.2)


async def _kill_one(
    engines: list[Service],
    ledger: DecisionLedger,
    writer: TelemetryWriter,
    rolled: dict[str, int],
    regressed: list[str],
    cfg: PolicyScaleConfig,
    tag: str,
    progress: Callable[[str], None],
) -> Takeover:
    """Kill -9 the first instance; wait until survivors decide for all of its models;
    inject regressions into some of them; judge the handover from the audit."""
    victim = engines[0]
    dead = instance_of(victim.log)
    if dead is None:
        raise RuntimeError(f"no instance id in {victim.log}")
    # Its models whose rollout still runs (one rolled back has no decision left to make).
    moved = sorted(
        m for m in ledger.by_model if ledger.owner(m) == dead and f"{m}-canary" not in rolled
    )
    progress(f"{tag}: kill -9 of instance {dead}, which decides for {len(moved)} models")
    victim.process.kill()
    victim.process.wait(10)
    killed = time.monotonic()
    deadline = killed + cfg.ready_timeout_s
    waiting = set(moved)
    while waiting and time.monotonic() < deadline:
        waiting = {m for m in waiting if ledger.handover(m, dead) is None}
        await asyncio.sleep(0.2)
    took = time.monotonic() - killed
    progress(
        f"{tag}: survivors decide for {len(moved) - len(waiting)}/{len(moved)} moved models "
        f"after {took:.1f} s"
    )
    fresh = [m for m in moved if m not in regressed][: max(1, cfg.regressions // 2)]
    for m in fresh:
        writer.regressed.add(m)
    injected = {f"{m}-canary": m for m in fresh}
    await _wait_rolled(rolled, injected, cfg)
    progress(f"{tag}: {sum(r in rolled for r in injected)}/{len(fresh)} regressions after it")
    await asyncio.sleep(2.0)  # the audit of the last rollbacks
    return judge_takeover(
        ledger,
        dead,
        moved,
        took_s=took,
        lost=len(waiting),
        detected_ms={
            m: float(rolled[r] - writer.onset[m]) if r in rolled else None
            for r, m in injected.items()
        },
    )


# -- report --------------------------------------------------------------------------------


def _table(results: list[SizeResult]) -> str:
    head = (
        f"{'inst':>4} {'models':>7} {'rec/s':>8} {'cpu us/rec':>10} {'cpu':>5} {'tick p50':>9} "
        f"{'tick p99':>9} {'rss MB':>7} {'lag start':>9} {'lag end':>8} "
        f"{'read p99':>9} {'decide p50':>10} {'decide p99':>10} {'missed':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        row = r.row()
        lines.append(
            f"{r.instances:>4} {r.models:>7} {r.records_per_s:>8.0f} {r.cpu_us_per_record:>10.0f} "
            f"{r.cpu_share:>5.2f} {r.tick_ms_p50:>8.1f}m {r.tick_ms_p99:>8.1f}m "
            f"{r.rss_mb:>7.0f} {r.lag_start:>9} {r.lag_end:>8} {r.read_delay_ms_p99:>7.0f}ms "
            f"{_ms(row['decision_ms_p50']):>10} {_ms(row['decision_ms_p99']):>10} {r.missed:>6}"
        )
    for r in results:
        if r.takeover is not None:
            t = r.takeover
            lines.append(
                f"kill -9 of 1 of {r.instances} at N={r.models}: {t.models_moved} models moved, "
                f"decided by survivors after {t.takeover_s:.1f} s; lost {t.lost}, step changed "
                f"{t.step_changed}, two deciders {t.double_deciders}, duplicate rollbacks "
                f"{t.duplicate_rollbacks}; regressions after it detected in "
                f"{', '.join(f'{d:.0f}' for d in t.regressions_after) or '-'} ms, "
                f"missed {t.missed_after}"
            )
    return "\n".join(lines)


def _ms(value: object) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def plot(runs: dict[int, list[SizeResult]], cfg: PolicyScaleConfig) -> Path:
    """Decision latency (left) and CPU per record (right) against N, one line per
    instance count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.2))
    everything = [r.models for results in runs.values() for r in results] or [1]
    for k, results in sorted(runs.items()):
        if not results:
            continue
        ns = [r.models for r in results]
        name = "1 engine" if k == 1 else f"{k} sharded"
        p99 = [r.decision_p99_ms if r.decision_ms else math.nan for r in results]
        left.plot(ns, p99, "s-", label=f"p99, {name}")
        p50 = [
            float(np.percentile(r.decision_ms, 50)) if r.decision_ms else math.nan for r in results
        ]
        left.plot(ns, p50, "o:", label=f"p50, {name}")
        right.plot(ns, [r.cpu_us_per_record for r in results], "o-", label=name)
    left.axhline(cfg.max_decision_ms, color="grey", linestyle="--", label="bound")
    from matplotlib.ticker import NullFormatter

    sizes = sorted(set(everything))
    for ax in (left, right):
        ax.set_xlim(min(everything) / 2, max(everything) * 2)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [f"{n:,}" for n in sizes])  # the sizes run, nothing between
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("models (x3 versions)")
    left.set_ylabel("ms")
    left.set_title("decision latency (evidence -> rollback)")
    left.legend(loc="upper left", fontsize=8)
    right.set_ylabel("CPU per telemetry record (us, all engines)")
    right.set_title("the policy engines' cost")
    right.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    cfg.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(cfg.plot, dpi=110)
    plt.close(fig)
    return cfg.plot


def main(cfg: PolicyScaleConfig) -> int:
    from graylane.deploy.kafka import broker as kafka_broker

    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    progress("starting the broker")
    kafka_broker.start()
    settings = Settings.from_env()
    runs: dict[int, list[SizeResult]] = {}
    for k in cfg.instances:
        results = runs.setdefault(k, [])
        for n in cfg.sizes:
            progress(
                f"N={n}: {n} models x {len(VERSIONS)} versions, "
                f"{n * len(VERSIONS) * cfg.batches_per_s:.0f} telemetry records/s, "
                f"{k} policy engine{'s, sharded' if k > 1 else ''}"
            )
            result = asyncio.run(run_size(settings, n, cfg, progress, instances=k))
            results.append(result)
            progress(f"N={n}: {json.dumps(result.row())}")
            each = ", ".join(f"{d:.0f}" for d in sorted(result.decision_ms))
            progress(f"N={n}: each regression's decision latency (ms): {each or '-'}")
            if result.lag_growing and result.missed:
                progress(f"N={n}: the engines fell behind; larger sizes are not run")
                break
    everything = [r for k in cfg.instances for r in runs[k]]
    print(_table(everything), flush=True)
    print(f"plot: {plot(runs, cfg)}", flush=True)
    single = runs.get(1, [])
    best = max_models(single, cfg.max_decision_ms) if single else None
    at_max = next((r for r in single if r.models == best), None)
    print(
        json.dumps(
            {
                "max_models_one_instance": best,
                "cpu_us_per_record": round(at_max.cpu_us_per_record, 1) if at_max else None,
                "tick_ms_p99_at_max": round(at_max.tick_ms_p99, 1) if at_max else None,
                "decision_latency_ms_p99_at_max": round(at_max.decision_p99_ms, 1)
                if at_max
                else None,
                "instances_scaling": {
                    str(k): {
                        "max_models": max_models(runs[k], cfg.max_decision_ms),
                        "takeover_clean": all(
                            r.takeover is not None and r.takeover.clean for r in runs[k]
                        ),
                    }
                    for k in cfg.instances
                    if k > 1
                }
                or None,
                "versions_per_model": len(VERSIONS),
                "requests_per_s_per_version": cfg.batches_per_s * cfg.requests_per_batch,
                "step_ms": cfg.step_ms,
                "sizes": [r.row() for r in everything],
            }
        ),
        flush=True,
    )
    return 0
