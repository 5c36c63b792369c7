"""``graylane bench chaos``: faults under a steady load on a private stack; nothing may be lost.

A private Kafka broker (its own state folder and free ports, so the bench may stop it),
the demo model built into this run's registry, and every service as its own OS process:
the control plane, the router, two workers of the stable version, one of the canary
candidate and the policy engine. The steady load is half the measured capacity (the
lower of the engine's calibrated figure and the stack's end-to-end throughput), sent
through the client SDK. Phases, one after another: ``worker_kill``, ``router_kill``,
``broker_outage``, ``policy_kill``, ``malformed`` (see :mod:`graylane.app.bench.chaos_phases`).
Each request belongs to the phase it was sent in; it is counted once every answer had
time to come (a final drain). The last output line is one JSON object.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graylane.app.bench.chaos import (
    Delivery,
    PhaseResult,
    account_phase,
    recovery_seconds,
    report_line,
    resumed_same_step,
    table_lines,
)
from graylane.app.bench.chaos_phases import Bench, PhaseRecord, Timing, malformed_answers
from graylane.app.bench.chaos_stack import (
    CANDIDATE,
    MODEL,
    STABLE,
    PrivateBroker,
    ServiceSet,
    build_model,
    log_mentions,
    service_env,
    start_all,
    tail,
    wait_port,
)
from graylane.app.bench.chaos_traffic import Follower, Ledger, Load, RolloutWatch
from graylane.app.cli.demo import free_port
from graylane.client import GraylaneClient
from graylane.kafka.admin import ensure_topics
from graylane.kafka.seam import KafkaFactory
from graylane.settings import REPO_ROOT, Settings

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

    def timing(self) -> Timing:
        if self.quick:
            return Timing(
                2.0, 4.0, 30.0, self.outage_s or 5.0, self.malformed_per_kind or 5, 40.0, 10.0
            )
        return Timing(
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
        from graylane.app.cli.calibrate import ensure_calibrated

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
