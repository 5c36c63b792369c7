"""The chaos bench's fault phases, one after another under the steady load."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from graylane.app.bench.chaos import StepMark
from graylane.app.bench.chaos_malformed import Expect, Malformed, burst
from graylane.app.bench.chaos_stack import (
    CANDIDATE,
    MODEL,
    STABLE,
    TOKEN,
    PrivateBroker,
    ServiceSet,
)
from graylane.app.bench.chaos_traffic import Ledger, Load, RolloutWatch
from graylane.clock import now_ms
from graylane.kafka.seam import KafkaFactory
from graylane.v1 import rollout_pb2


@dataclass(frozen=True)
class Timing:
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
    timing: Timing
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

    from graylane.app.cli.ops_client import stubs

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
