"""``graylane bench chaos``: faults under a steady load on a private stack; nothing may be lost.

A private Kafka broker (its own state folder and free ports, so the bench may stop it),
the demo model built into this run's registry, and every service as its own OS process:
the control plane, the router, two workers of the stable version, one of the canary
candidate and the policy engine. The steady load is half the measured capacity (the
lower of the engine's calibrated figure and the stack's end-to-end throughput), sent
through the client SDK. Phases, one after another: ``worker_kill``, ``router_kill``,
``broker_outage``, ``policy_kill``, ``malformed`` (:class:`Bench`).
Each request belongs to the phase it was sent in; it is counted once every answer had
time to come (a final drain). The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graylane.app.bench.chaos import (
    Delivery,
    Expect,
    Malformed,
    PhaseResult,
    StepMark,
    account_phase,
    burst,
    recovery_seconds,
    report_line,
    resumed_same_step,
    table_lines,
)
from graylane.app.bench.chaos_stack import (
    CANDIDATE,
    MODEL,
    STABLE,
    TOKEN,
    Follower,
    Ledger,
    Load,
    PrivateBroker,
    RolloutWatch,
    ServiceSet,
    build_model,
    log_mentions,
    service_env,
    start_all,
    tail,
    wait_port,
)
from graylane.app.cli.demo import free_port
from graylane.client import GraylaneClient
from graylane.clock import now_ms
from graylane.kafka.admin import ensure_topics
from graylane.kafka.seam import KafkaFactory
from graylane.settings import REPO_ROOT, Settings
from graylane.v1 import rollout_pb2

__all__ = ["PHASES", "ChaosConfig", "main"]


PHASES = ("worker_kill", "router_kill", "broker_outage", "policy_kill", "malformed")


@dataclass(frozen=True)
class ChaosConfig:
    quick: bool = False
    outage_s: float | None = None
    """Broker outage; default 60 s (10 s with ``quick``)."""
    load_fraction: float = 0.5
    max_rate: float = 0.0
    """Upper bound of the steady load in req/s (0 = none)."""
    malformed_per_kind: int | None = None
    work_dir: Path | None = None
    window_ms: int = 4000
    step_ms: int = 1000

    def timing(self) -> PhaseTiming:
        if self.quick:
            return PhaseTiming(
                2.0, 4.0, 30.0, self.outage_s or 5.0, self.malformed_per_kind or 5, 40.0, 10.0
            )
        return PhaseTiming(
            8.0, 15.0, 90.0, self.outage_s or 60.0, self.malformed_per_kind or 40, 60.0, 60.0
        )


async def _wait_served(load: Load, ledger: Ledger, timeout_s: float) -> None:
    """A probe answered end to end (workers warm up before they join)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rid = load.send_one()
        waiter = ledger.waiters[rid] = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, 5.0)
            return
    raise TimeoutError(f"no answer through the stack within {timeout_s:.0f} s")


async def _closed_loop(load: Load, ledger: Ledger, seconds: float, window: int = 32) -> float:
    """Answers per second with ``window`` requests always in flight: the stack's throughput."""
    end = time.monotonic() + seconds
    done = 0

    async def slot() -> None:
        nonlocal done
        while time.monotonic() < end:
            rid = load.send_one()
            waiter = ledger.waiters[rid] = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, 10.0)
                done += 1

    t0 = time.monotonic()
    await asyncio.gather(*(slot() for _ in range(window)))
    return done / (time.monotonic() - t0)


async def _ticker(
    load: Load, ledger: Ledger, progress: Callable[[str], None], stop: asyncio.Event
) -> None:
    """A progress line every 5 s: what was sent, acknowledged and answered meanwhile."""
    last = (0, 0, 0)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 5.0)
        sent = len(ledger.sent)
        acked = sum(1 for s in ledger.sent.values() if s.acked_at is not None)
        answered = len(ledger.answers)
        progress(
            f"    [{load.phase}] last 5 s: sent {sent - last[0]}, acked {acked - last[1]}, "
            f"answered {answered - last[2]}; failed sends so far "
            f"{sum(1 for s in ledger.sent.values() if s.failure)}"
        )
        last = (sent, acked, answered)


def account(bench: Bench, rec: PhaseRecord) -> PhaseResult:
    ledger = bench.ledger
    ids = [rid for rid, s in ledger.sent.items() if s.phase == rec.name]
    acked = [rid for rid in ids if ledger.sent[rid].acked_at is not None]
    answers = [rid for rid in ids for _ in ledger.answers.get(rid, [])]
    errored = [rid for rid in ids if any(not a.ok for a in ledger.answers.get(rid, []))]
    deliveries = []
    for rid in acked:
        first = ledger.first_answer(rid)
        deliveries.append(Delivery(ledger.sent[rid].sent_at, first.at if first else None))
    return account_phase(
        acked=acked,
        answers=answers,
        errored=errored,
        recovery_s=recovery_seconds(
            deliveries, fault_at=rec.fault_at, since=rec.since, stall_s=bench.stall_s
        ),
        services_alive=rec.services_alive,
        send_failed=sum(1 for rid in ids if ledger.sent[rid].acked_at is None),
    )


async def run(cfg: ChaosConfig, progress: Callable[[str], None]) -> dict[str, object]:
    run_dir = cfg.work_dir or REPO_ROOT / ".local" / "chaos" / time.strftime("run-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    log_handler = _log_to(run_dir / "bench.log")
    broker = PrivateBroker(run_dir / "broker")
    timing = cfg.timing()
    progress(f"starting a private Kafka broker on {broker.bootstrap} (state in {broker.root})")
    await asyncio.to_thread(broker.start)
    settings = Settings.from_env().with_overrides(
        bootstrap_servers=broker.bootstrap,
        topic_prefix=f"chaos{uuid.uuid4().hex[:6]}",
        db_url=f"sqlite:///{run_dir / 'graylane.db'}",
        artifact_dir=run_dir / "artifacts",
    )
    services = ServiceSet(env={}, logs=run_dir / "logs")
    stops: list[Callable[[], object]] = []
    try:
        progress(
            f"building {MODEL} {STABLE} and {CANDIDATE} (demo GPT, tiny) into this run's registry"
        )
        files = await asyncio.to_thread(build_model, settings, progress)
        from graylane.app.cli.capacity import ensure_calibrated

        profile = await asyncio.to_thread(
            ensure_calibrated,
            settings,
            MODEL,
            STABLE,
            {"fp32": files[STABLE]},
            seq_len=32,
            batches=(1,) if cfg.quick else (1, 8),
            progress=progress,
        )
        engine_rps = profile.variant("fp32").rps()
        factory = KafkaFactory(settings)
        layout = factory.layout
        await ensure_topics(
            factory, layout.shared_specs() + layout.model_specs(MODEL, [STABLE, CANDIDATE])
        )
        cp_port = free_port()
        services.env = service_env(settings, run_dir, cp_port)
        progress(
            f"starting control plane, router, 3 workers, policy engine (logs in {services.logs})"
        )
        start_all(services, files, window_ms=cfg.window_ms, step_ms=cfg.step_ms)
        cp = services.procs["controlplane"]
        await asyncio.to_thread(wait_port, cp_port, 120, cp.alive)
        ledger, rollouts = Ledger(), RolloutWatch()
        client_id = f"chaos-{uuid.uuid4().hex[:8]}"
        reply_topic = layout.reply(client_id)
        await ensure_topics(factory, [layout.reply_spec(client_id)])
        followers = [
            Follower(factory, reply_topic, ledger.on_result, "replies"),
            Follower(factory, layout.rollouts(), rollouts.on_record, "rollouts"),
        ]
        for f in followers:
            await f.start()
            stops.append(f.stop)
        client = GraylaneClient(factory, client_id=client_id, listen=False)
        await client.start()
        load = Load(client, MODEL, reply_topic, ledger)

        async def replace_client() -> None:
            old = load.client
            new = GraylaneClient(factory, client_id=client_id, listen=False)
            await new.start()
            load.client = new
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.close(), 10)

        stops.append(lambda: load.client.close())
        progress("waiting for the stack to answer (workers warm up before they join)")
        await _wait_served(load, ledger, 240)
        policy = services.procs["policy"]
        deadline = time.monotonic() + 120
        while not log_mentions(policy.log, "restored ") and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        load.phase = "capacity"
        e2e_rps = await _closed_loop(load, ledger, 3.0 if cfg.quick else 6.0)
        capacity = min(engine_rps, e2e_rps)
        rate = cfg.load_fraction * capacity
        if cfg.max_rate > 0:
            rate = min(rate, cfg.max_rate)
        progress(
            f"capacity: engine {engine_rps:.0f} req/s (calibrated), stack {e2e_rps:.0f} req/s "
            f"(closed loop); steady load {rate:.0f} req/s"
        )
        load.rate, load.phase = rate, "steady"
        stop_load = asyncio.Event()
        load_task = asyncio.create_task(load.run(stop_load))
        ticker = asyncio.create_task(_ticker(load, ledger, progress, stop_load))
        await asyncio.sleep(2 * timing.settle_s)
        steady = [
            a.at - s.sent_at
            for rid, s in ledger.sent.items()
            if s.phase == "steady" and (a := ledger.first_answer(rid)) is not None
        ]
        p99 = float(np.percentile(steady, 99)) if steady else 1.0
        stall_s = max(1.0, 3.0 * p99)
        progress(f"steady p99 {1000 * p99:.0f} ms; a request is stalled beyond {stall_s:.1f} s")
        bench = Bench(
            factory,
            broker,
            services,
            load,
            ledger,
            rollouts,
            timing,
            cp_port,
            stall_s,
            progress,
            replace_client,
        )
        for name in PHASES:
            await bench.phase(name, getattr(bench, name))
        stop_load.set()
        await load_task
        await ticker
        progress("load stopped; waiting for the last answers")
        await load.settle_sends(60)
        deadline = time.monotonic() + timing.max_wait_s
        while time.monotonic() < deadline:
            if all(ledger.unanswered(r.name, time.monotonic()) == 0 for r in bench.records):
                break
            await asyncio.sleep(0.5)
        results = {rec.name: account(bench, rec) for rec in bench.records}
        by_name = {rec.name: rec for rec in bench.records}
        pol_rec = by_name["policy_kill"]
        notes = {rec.name: rec.notes for rec in bench.records}
        pol, brk = notes["policy_kill"], notes["broker_outage"]
        extra: dict[str, object] = {
            "policy_decides_again_s": pol.get("decides_again_s"),
            "policy_before": pol.get("before"),
            "policy_after": pol.get("after"),
            "broker_down_s": brk.get("broker_down_s"),
            "client_resumed_after_outage_s": brk.get("client_resumed_s"),
            "same_client_recovered": brk.get("client_resumed_s") is not None,
            "malformed_answers": malformed_answers(ledger, by_name["malformed"].malformed_sent),
            "send_failures": _failure_causes(ledger),
            "dead_at_phase_end": {r.name: r.dead for r in bench.records if r.dead},
            "capacity_rps": round(capacity, 1),
            "engine_capacity_rps": round(engine_rps, 1),
            "stack_capacity_rps": round(e2e_rps, 1),
            "rate_rps": round(rate, 1),
            "stall_s": round(stall_s, 2),
            "quick": cfg.quick,
            "logs": str(services.logs),
        }
        return {
            "results": results,
            "resumed": resumed_same_step(pol_rec.before, pol_rec.after),
            "extra": extra,
        }
    except BaseException:
        for name, proc in services.procs.items():
            if not proc.alive():
                progress(f"{name} is not running; its log ends:\n{tail(proc.log)}")
        raise
    finally:
        for stop in reversed(stops):
            with contextlib.suppress(Exception):
                got = stop()
                if asyncio.iscoroutine(got):
                    await asyncio.wait_for(got, 30)
        await asyncio.to_thread(services.stop_all)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(broker.remove)
        _unlog(log_handler)


def _log_to(path: Path) -> logging.Handler:
    """aiokafka's logs in this process (a retry per send while the broker is down) go to a
    file, not to the console."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    noisy = logging.getLogger("aiokafka")
    noisy.addHandler(handler)
    noisy.propagate = False
    return handler


def _unlog(handler: logging.Handler) -> None:
    noisy = logging.getLogger("aiokafka")
    noisy.removeHandler(handler)
    noisy.propagate = True
    handler.close()


def _failure_causes(ledger: Ledger) -> dict[str, dict[str, int]]:
    """Failed sends per phase, by exception type."""
    causes: dict[str, dict[str, int]] = {}
    for s in ledger.sent.values():
        if s.failure:
            per = causes.setdefault(s.phase, {})
            key = s.failure.split(":")[0]
            per[key] = per.get(key, 0) + 1
    return causes


def main(cfg: ChaosConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    out = asyncio.run(run(cfg, progress))
    results: dict[str, PhaseResult] = out["results"]  # type: ignore[assignment]
    extra: dict[str, object] = out["extra"]  # type: ignore[assignment]
    print()
    for line in table_lines(results):
        print(line)
    print(
        f"rollout resumed at the same step: {'yes' if out['resumed'] else 'NO'} "
        f"({extra['policy_before']} -> {extra['policy_after']}); "
        f"the new policy engine decided after {extra['policy_decides_again_s']} s"
    )
    print(
        f"broker down {extra['broker_down_s']} s; the same client was acknowledged again "
        f"after {extra['client_resumed_after_outage_s']} s"
    )
    print(f"failed sends by cause: {extra['send_failures']}")
    print(f"malformed records: {extra['malformed_answers']}")
    print(report_line(results, rollout_resumed_same_step=bool(out["resumed"]), extra=extra))
    return 0


@dataclass(frozen=True)
class PhaseTiming:
    """How long each chaos phase settles, observes and waits."""

    settle_s: float
    observe_s: float
    max_wait_s: float
    outage_s: float
    malformed_per_kind: int
    policy_wait_s: float
    resume_wait_s: float
    """How long the same client instance gets to be acknowledged again after the outage."""


@dataclass
class PhaseRecord:
    """What the runner noted about one phase while it ran."""

    name: str
    started_at: float
    fault_at: float = 0.0
    since: float = 0.0
    ended_at: float = 0.0
    services_alive: bool = True
    dead: list[str] = field(default_factory=list)
    notes: dict[str, object] = field(default_factory=dict)
    malformed_sent: list[tuple[str, Malformed]] = field(default_factory=list)
    before: StepMark | None = None
    after: StepMark | None = None


@dataclass
class Bench:
    """Everything the phases act on."""

    factory: KafkaFactory
    broker: PrivateBroker
    services: ServiceSet
    load: Load
    ledger: Ledger
    rollouts: RolloutWatch
    timing: PhaseTiming
    cp_port: int
    stall_s: float
    progress: Callable[[str], None]
    replace_client: Callable[[], Awaitable[None]]
    records: list[PhaseRecord] = field(default_factory=list)

    async def phase(self, name: str, fault: Callable[[PhaseRecord], Awaitable[None]]) -> None:
        rec = PhaseRecord(name, time.monotonic())
        self.records.append(rec)
        self.load.phase = name
        self.progress(f"phase {name}: steady load for {self.timing.settle_s:.0f} s")
        await asyncio.sleep(self.timing.settle_s)
        rec.fault_at = rec.since = time.monotonic()
        await fault(rec)
        await self.settle(rec)
        rec.dead = self.services.dead()
        rec.services_alive = not rec.dead
        rec.ended_at = time.monotonic()
        pending = self.ledger.unanswered(name, rec.ended_at)
        self.progress(
            f"phase {name} done: {pending} acknowledged requests still unanswered; "
            + ("every service alive" if rec.services_alive else f"DEAD: {', '.join(rec.dead)}")
        )
        for dead in rec.dead:
            proc = self.services.procs[dead]
            self.progress(
                f"    {dead} exited with {proc.exit_code()} (log {proc.log}); starting it again"
            )
            self.services.start(dead)

    async def settle(self, rec: PhaseRecord) -> None:
        """Observe at least ``observe_s`` after the fault, then until every acknowledged
        request sent more than the stall bound ago has its answer (at most ``max_wait_s``)."""
        t = self.timing
        await asyncio.sleep(t.observe_s)
        deadline = rec.since + t.max_wait_s
        while time.monotonic() < deadline:
            if self.ledger.unanswered(rec.name, time.monotonic() - self.stall_s) == 0:
                return
            await asyncio.sleep(0.5)

    # -- the faults ------------------------------------------------------------

    async def restart_after_kill(self, name: str, rec: PhaseRecord) -> None:
        pid = self.services.procs[name].pid
        self.services.kill(name)
        self.progress(f"    kill -9 {name} (pid {pid}); starting it again")
        self.services.start(name)

    async def worker_kill(self, rec: PhaseRecord) -> None:
        await self.restart_after_kill("worker-a", rec)

    async def router_kill(self, rec: PhaseRecord) -> None:
        await self.restart_after_kill("router", rec)

    async def broker_outage(self, rec: PhaseRecord) -> None:
        self.progress("    stopping the broker")
        await asyncio.to_thread(self.broker.stop)
        self.progress(f"    broker down; starting it again in {self.timing.outage_s:.0f} s")
        await asyncio.sleep(self.timing.outage_s)
        await asyncio.to_thread(self.broker.start)
        rec.since = time.monotonic()
        down = rec.since - rec.fault_at
        rec.notes["broker_down_s"] = round(down, 1)
        self.progress(f"    broker back after {down:.0f} s")
        resumed = await self.first_ack_after(rec.since, self.timing.resume_wait_s)
        rec.notes["client_resumed_s"] = resumed
        if resumed is None:
            self.progress("    the same client instance sends nothing acknowledged; new client")
            rec.notes["client_replaced"] = True
            await self.replace_client()
        else:
            self.progress(
                f"    the same client instance is acknowledged again after {resumed:.1f} s"
            )

    async def first_ack_after(self, since: float, timeout_s: float) -> float | None:
        deadline = since + timeout_s
        while time.monotonic() < deadline:
            acks = [
                s.acked_at for s in self.ledger.sent.values() if s.sent_at >= since and s.acked_at
            ]
            if acks:
                return round(min(acks) - since, 2)
            await asyncio.sleep(0.5)
        return None

    async def policy_kill(self, rec: PhaseRecord) -> None:
        try:
            rollout_id = await self.start_rollout()
        except RuntimeError as exc:  # reported; the engine is still killed and restarted
            rec.notes["rollout_error"] = str(exc)
            self.progress(f"    the control plane refused the canary: {exc}")
            rollout_id = ""
        rec.notes["rollout_id"] = rollout_id
        if rollout_id:
            self.progress(f"    canary {rollout_id} started; waiting for its second step")
        deadline = time.monotonic() + self.timing.policy_wait_s
        while rollout_id and time.monotonic() < deadline:
            state = self.rollouts.latest(rollout_id)
            if (
                state is not None
                and state.phase == rollout_pb2.PROGRESSING
                and state.step_index >= 1
            ):
                break
            await asyncio.sleep(0.3)
        state = self.rollouts.latest(rollout_id)
        before = _mark(state)
        rec.notes["before"] = _describe(state)
        rec.fault_at = time.monotonic()
        await self.restart_after_kill("policy", rec)
        rec.since = time.monotonic()
        restarted_ms = now_ms()
        self.progress(f"    killed at {_describe(state)}; waiting for a decision of the new engine")
        after_state = None
        deadline = time.monotonic() + self.timing.policy_wait_s + 60
        while rollout_id and time.monotonic() < deadline and after_state is None:
            after_state = self.rollouts.first_since(rollout_id, restarted_ms)
            await asyncio.sleep(0.2)
        rec.notes["after"] = _describe(after_state)
        if after_state is not None:
            decided = round((after_state.updated_at_unix_ms - restarted_ms) / 1000.0, 2)
            rec.notes["decides_again_s"] = decided
            self.progress(
                f"    the restarted engine decided after {decided:.1f} s: {_describe(after_state)}"
            )
        else:
            rec.notes["decides_again_s"] = None
            self.progress("    the restarted engine wrote no decision")
        rec.before, rec.after = before, _mark(after_state)

    async def start_rollout(self) -> str:
        """Start a canary through the control plane (retried while it refuses the candidate)."""
        spec = rollout_pb2.RolloutSpec(
            model=MODEL,
            baseline_version=STABLE,
            candidate_version=CANDIDATE,
            strategy=rollout_pb2.CANARY,
            steps=[
                rollout_pb2.RolloutStep(weight_percent=5, min_samples=10, min_dwell_s=1.0),
                rollout_pb2.RolloutStep(weight_percent=25, min_samples=20, min_dwell_s=3600.0),
                rollout_pb2.RolloutStep(weight_percent=100, min_samples=20, min_dwell_s=3600.0),
            ],
            gates=rollout_pb2.GateSpec(max_p99_ratio=50.0, max_error_rate_delta=0.5),
            failures_to_rollback=50,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                state = await asyncio.to_thread(_grpc_start, self.cp_port, spec)
                return str(state.rollout_id)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)

    async def malformed(self, rec: PhaseRecord) -> None:
        layout = self.factory.layout
        targets = {
            "ingress": layout.ingress(MODEL),
            "version": layout.version_requests(MODEL, STABLE),
        }
        sent: list[tuple[str, Malformed]] = []
        producer = self.factory.producer(client_suffix="chaos-hostile")
        await producer.start()
        try:
            for seed, (where, topic) in enumerate(targets.items()):
                reply, per_kind = self.load.reply_topic, self.timing.malformed_per_kind
                for m in burst(
                    MODEL, layout, reply, per_kind=per_kind, seed=seed, direct=where == "version"
                ):
                    await producer.send(topic, m.value, key=m.key)
                    sent.append((where, m))
            await producer.flush()
        finally:
            await producer.stop()
        rec.malformed_sent = sent
        self.progress(f"    {len(sent)} malformed records sent onto {', '.join(targets.values())}")


def _grpc_start(port: int, spec: rollout_pb2.RolloutSpec) -> rollout_pb2.RolloutState:
    import grpc

    from graylane.app.cli.controlplane_calls import stubs

    rpc, (channel, metadata) = stubs(
        argparse.Namespace(addr=f"127.0.0.1:{port}", token=TOKEN, ca=None)
    )
    try:
        state: rollout_pb2.RolloutState = rpc.RolloutsStub(channel).Start(
            spec, metadata=metadata, timeout=30
        )
        return state
    except grpc.RpcError as exc:
        raise RuntimeError(f"{exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()


def _mark(state: rollout_pb2.RolloutState | None) -> StepMark | None:
    if state is None:
        return None
    return StepMark(int(state.phase), int(state.step_index), float(state.candidate_weight_percent))


def _describe(state: rollout_pb2.RolloutState | None) -> str:
    if state is None:
        return "no state"
    return (
        f"{rollout_pb2.RolloutPhase.Name(state.phase)} step {state.step_index} "
        f"({state.candidate_weight_percent:g} %)"
    )


def malformed_answers(ledger: Ledger, sent: list[tuple[str, Malformed]]) -> dict[str, object]:
    """How the malformed records were answered; ``misses``: kind@topic -> records that did
    not get the expected answer (an error, the requester's own OK, or nothing)."""
    counts = {"expected_error": 0, "got_error": 0, "expected_ok": 0, "got_ok": 0, "unexpected": 0}
    misses: dict[str, int] = {}
    for where, m in sent:
        first = ledger.first_answer(m.request_id)
        if m.expect is Expect.ERROR:
            counts["expected_error"] += 1
            hit = first is not None and not first.ok
            counts["got_error"] += int(hit)
        elif m.expect is Expect.OK:
            counts["expected_ok"] += 1
            hit = first is not None and first.ok
            counts["got_ok"] += int(hit)
        else:
            hit = first is None
            counts["unexpected"] += int(not hit)
        if not hit:
            got = "nothing" if first is None else ("ok" if first.ok else first.code)
            key = f"{m.kind}@{where}:{got}"
            misses[key] = misses.get(key, 0) + 1
    return {**counts, "misses": misses}
