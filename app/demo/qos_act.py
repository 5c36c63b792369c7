"""The demo's QoS act: SmolLM2 on Graylane's own precision ladder, under a load spike.

SmolLM2-135M-Instruct imported by the builder from its GGUF into ONNX (no torch), with
the weight-only rung below fp32 (``int8-weight-only``: 1.86x fp32 at top-1 0.988 on
English text, ``builder/README.md``), registered and served by one native worker (its
continuous decode batch, ``--from-registry``). The act:

0. a version an earlier run left on the lower rung is set back to fp32 first (a QoS
   policy whose floor is fp32: the policy engine sets it at once);
1. one chat answer at fp32, printed;
2. the worker's capacity measured here: closed-loop chat generations, one caller per
   decode row, for :data:`PROBE_S` seconds (generations/s, and their TTFT);
3. a QoS policy (ladder fp32 -> int8-weight-only) whose TTFT objective and calibrated
   capacity come from that measurement; a steady load of :data:`STEADY_FRACTION` x the
   capacity, then a spike of :data:`SPIKE_FACTOR` x it (raised while the worker still
   carries it calmly: :func:`raised_spike_rate`);
4. the policy engine steps the version down a rung from its telemetry (a precision
   record); an answer is asked and printed on the lower rung, with the variant that
   served it;
5. the spike ends; the policy engine steps back up once the offered load is below its
   band (0.7 x fp32's capacity here); one more answer, at fp32.

Decisions are the policy engine's (the audit topic names each step and its reason);
every answer shown is the engine's own text, with the variant its result names.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from rich.table import Table

from graylane import serde
from graylane.app.cli.demo import Service, start_service, stop_services
from graylane.app.demo.engine_act import QUESTIONS, workers_ready
from graylane.app.demo.monitor import Monitor, demo_console
from graylane.client import GraylaneClient, Result, Task
from graylane.clock import now_ms
from graylane.kafka.reading import CompactedFollower, read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.registry.repository import open_registry
from graylane.services.gateway.chat import ChatFormat, ChatMessage, ChatRole, load_chat_template
from graylane.settings import Settings
from graylane.v1 import audit_pb2, inference_pb2, rollout_pb2

__all__ = [
    "LADDER",
    "QOS_MODEL",
    "QOS_VERSION",
    "ActRates",
    "PrecisionStep",
    "QosActShown",
    "RungAnswer",
    "act_rates",
    "chat_template_of",
    "precision_steps",
    "qos_act_policy",
    "qos_table",
    "raised_spike_rate",
    "run_qos_act",
    "rung_table",
    "ttft_objective_ms",
]

QOS_MODEL = "smollm2-onnx"
"""SmolLM2 as the builder's ONNX import (the engine act serves it as ``smollm2`` on
llama.cpp: another model name, its own topics and versions)."""
QOS_VERSION = "1.0.0"
LADDER = ("fp32", "int8-weight-only")
ROWS = 4
"""Sequences the worker decodes together (its continuous batch)."""
NEW_TOKENS = 16
"""Tokens of each generation of the act's load (and of its probe)."""
PROBE_S = 10.0
STEADY_FRACTION = 0.2
"""The steady load, x the measured capacity: well under the step-up band (0.7 x fp32's
capacity as it holds in the running stack: the policy engine scales the calibrated figure
by the contention it measures, and on a busy machine that halved it)."""
SPIKE_FACTOR = 2.0
"""The spike, x the measured capacity at fp32: more than the top rung decodes."""
MIN_TTFT_OBJECTIVE_MS = 1000.0
GIVE_UP_OBJECTIVES = 3.0
"""The load's generations are shed when still waiting after this many TTFT objectives."""
SHOWN_QUESTION = "What is the capital of France? Answer in one word."


@dataclass(frozen=True)
class RungAnswer:
    """One chat answer shown during the act, with the rung its result names."""

    moment: str
    variant: str
    question: str
    text: str
    ttft_ms: float


@dataclass(frozen=True)
class PrecisionStep:
    """One precision change of the act's version, as the audit records it."""

    decided_at_unix_ms: int
    before: str
    after: str
    rule: str
    reason: str


@dataclass(frozen=True)
class ActRates:
    steady_gps: float
    spike_gps: float


@dataclass
class QosActShown:
    capacity_gps: float = 0.0
    """Generations/s one worker carried at fp32 here (the probe)."""
    ttft_objective_ms: float = 0.0
    rates: ActRates = field(default_factory=lambda: ActRates(0.0, 0.0))
    answers: list[RungAnswer] = field(default_factory=list)
    steps: list[PrecisionStep] = field(default_factory=list)
    stepped_down_s: float = 0.0
    """Seconds from the spike's start to the step down (0: none)."""
    stepped_up_s: float = 0.0
    """Seconds from the spike's end to the step back up (0: none)."""
    results: list[Result] = field(default_factory=list)
    """Every generation of the act's load that came back (answered or not)."""


# -- decisions of the act (pure) ------------------------------------------------------------


def act_rates(capacity_gps: float) -> ActRates:
    """The steady load and the spike, from the capacity measured here."""
    return ActRates(STEADY_FRACTION * capacity_gps, SPIKE_FACTOR * capacity_gps)


def ttft_objective_ms(probe_ttft_ms: Sequence[float]) -> float:
    """The policy's TTFT objective: twice the p99 of the probe's (a full decode batch,
    nobody waiting), and at least :data:`MIN_TTFT_OBJECTIVE_MS`. A spike beyond the
    capacity queues sequences whose first token comes later and later."""
    if not probe_ttft_ms:
        return MIN_TTFT_OBJECTIVE_MS
    return max(MIN_TTFT_OBJECTIVE_MS, 2.0 * float(np.percentile(probe_ttft_ms, 99)))


def qos_act_policy(
    capacity_gps: float, ttft_ms: float, floor: str = LADDER[-1]
) -> rollout_pb2.QosPolicy:
    """Steps down on TTFT or waiting sequences; back up once the offered load is below
    0.7 x fp32's measured capacity (as it holds in the running stack). ``floor`` =
    fp32: the policy engine sets the top rung at once (the act's start, whatever an
    earlier run left on record)."""
    return rollout_pb2.QosPolicy(
        model=QOS_MODEL,
        version=QOS_VERSION,
        slo_p99_ms=0.0,  # a generation's whole latency is mostly its length
        slo_ttft_p99_ms=ttft_ms,
        ladder=list(LADDER),
        quality_floor=floor,
        step_down_margin=0.2,
        sustain_s=2.0,
        min_dwell_s=8.0,
        enabled=True,
        rung_capacity_rps={LADDER[0]: capacity_gps} if capacity_gps > 0.0 else {},
        up_capacity_fraction=0.7,
    )


def precision_steps(
    records: Sequence[audit_pb2.AuditRecord], model: str = QOS_MODEL, version: str = QOS_VERSION
) -> list[PrecisionStep]:
    """The precision changes of ``model``/``version`` on record, oldest first."""
    return [
        PrecisionStep(
            r.decided_at_unix_ms,
            r.qos_before.active_variant,
            r.qos_after.active_variant,
            r.rule,
            r.reason,
        )
        for r in sorted(records, key=lambda r: r.decided_at_unix_ms)
        if r.kind == audit_pb2.DECISION_PRECISION_CHANGE
        and r.model == model
        and r.version == version
    ]


# -- the spike raised while carried calmly (pure) ----------------------------------------

RAISE_EVERY_S = 10.0
"""How long a spike runs before it may be raised (the QoS window's seconds, and more)."""
RAISE_FACTOR = 1.3
MAX_RAISE = 4.0
"""The spike is raised to at most this multiple of its first rate."""
CALM_SHED = 0.01
"""A stack that sheds under this share of the spike carries it calmly."""


def raised_spike_rate(
    rate: float, first: float, p99_ms: float | None, shed_fraction: float, slo_p99_ms: float
) -> float | None:
    """The next spike rate when the stack carries ``rate`` calmly (p99 of the answered
    under the SLO, almost nothing shed), up to :data:`MAX_RAISE` x ``first``; ``None``:
    keep it (the spike already strains the stack, nothing was answered, or the cap)."""
    if p99_ms is None or p99_ms >= slo_p99_ms or shed_fraction >= CALM_SHED:
        return None
    higher = min(rate * RAISE_FACTOR, MAX_RAISE * first)
    return higher if higher > rate else None


# -- the act (I/O) ---------------------------------------------------------------------------


_Sent = TypeVar("_Sent")


@dataclass(frozen=True)
class _Chat:
    """A chat question as a request's arguments: rendered by the model's own template
    (what the gateway does for a model served by Graylane's decoder), with its message
    and the strings that close the assistant's turn."""

    prompt: str
    messages: list[inference_pb2.ChatMessage]
    turn_end: list[str]

    @classmethod
    def of(cls, template: ChatFormat, question: str) -> _Chat:
        return cls(
            template.render([ChatMessage(ChatRole.USER, question)]),
            [inference_pb2.ChatMessage(role="user", content=question)],
            list(template.stop),
        )


class _Act:
    def __init__(
        self,
        factory: KafkaFactory,
        client: GraylaneClient,
        monitor: Monitor,
        out: Callable[[str], None],
        template: ChatFormat,
    ) -> None:
        self.template = template
        self.factory = factory
        self.client = client
        self.monitor = monitor
        self.out = out
        self.rate = 0.0
        self.ttft_deadline_ms = 0
        """The load's time-to-first-token budget: a generation still waiting for a decode
        row past it is shed (a chat user who gave up), so a spike's backlog stays bounded."""
        self.stop = asyncio.Event()
        self.results: list[Result] = []
        self.answered: list[float] = []
        self.sent: list[float] = []
        """When each generation of the load was sent (``time.monotonic()``)."""

    def _generation(
        self, send: Callable[..., Awaitable[_Sent]], question: str, **call: Any
    ) -> Awaitable[_Sent]:
        """``send`` (the client's ``infer`` or ``submit``) of a generation answering
        ``question`` in the model's chat template, with ``call``'s further arguments."""
        chat = _Chat.of(self.template, question)
        return send(
            QOS_MODEL,
            task=Task.GENERATE,
            prompt=chat.prompt,
            messages=chat.messages,
            turn_end=chat.turn_end,
            **call,
        )

    async def ask(self, question: str, moment: str) -> RungAnswer:
        result = await self._generation(self.client.infer, question, max_new_tokens=24, timeout=180)
        answer = RungAnswer(
            moment, result.variant, question, result.text.strip(), result.timing.ttft_ms
        )
        self.out(f"    [{answer.variant}] user: {question}\n")
        self.out(f"    [{answer.variant}] {QOS_MODEL}: {answer.text}\n")
        return answer

    async def probe(self) -> tuple[float, list[float]]:
        """Closed-loop callers, one per decode row: generations/s in the second half."""
        done: list[float] = []
        ttfts: list[float] = []
        end = time.monotonic() + PROBE_S

        async def caller(k: int) -> None:
            i = k
            while time.monotonic() < end:
                result = await self._generation(
                    self.client.infer,
                    QUESTIONS[i % len(QUESTIONS)],
                    max_new_tokens=NEW_TOKENS,
                    routing_key=f"probe-{k}",
                    timeout=60,
                )
                if result.ok:
                    done.append(time.monotonic())
                    ttfts.append(result.timing.ttft_ms)
                i += ROWS

        await asyncio.gather(*(caller(k) for k in range(ROWS)))
        half = end - PROBE_S / 2
        return sum(1 for t in done if t >= half) / (PROBE_S / 2), ttfts

    async def load(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            if self.rate <= 0.0:
                await asyncio.sleep(0.2)
                next_at = time.monotonic()
                continue
            await self._generation(
                self.client.submit,
                QUESTIONS[i % len(QUESTIONS)],
                max_new_tokens=NEW_TOKENS,
                routing_key=f"chat-user-{i % 499}",
                ttft_deadline_ms=self.ttft_deadline_ms,
            )
            self.sent.append(time.monotonic())
            i += 1
            next_at += 1.0 / self.rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def collect(self) -> None:
        async for result in self.client.results():
            self.results.append(result)
            self.answered.append(time.monotonic())
            self.monitor.on_result(result)

    async def spike_until(self, done: Callable[[], bool], timeout_s: float, ttft_ms: float) -> bool:
        """:meth:`until`, raising the spike while the worker still carries it calmly.

        The spike comes from a capacity measured moments before, on a machine whose load
        others share; one that now answers all of it with first tokens within the
        objective would show no QoS at all. Every :data:`RAISE_EVERY_S` the load is
        raised as :func:`raised_spike_rate` says (TTFT p99 against the objective; the
        share of the interval's generations shed, or not answered in it, as its shed
        share)."""
        deadline = time.monotonic() + timeout_s
        first, raised_at = self.rate, time.monotonic()
        while not done():
            now = time.monotonic()
            if now > deadline:
                return False
            if now - raised_at >= RAISE_EVERY_S:
                since, raised_at = raised_at, now
                sent = sum(1 for t in self.sent if t >= since)
                answered = sum(1 for t in self.answered if t >= since)
                recent = self.results[len(self.results) - answered :] if answered else []
                ttfts = [r.timing.ttft_ms for r in recent if r.ok and r.timing.ttft_ms > 0]
                p99 = float(np.percentile(ttfts, 99)) if ttfts else None
                behind = max(0.0, (sent - answered) / sent) if sent else 0.0
                shed = sum(r.error_code == "SHED" for r in recent) / len(recent) if recent else 0.0
                behind = max(behind, shed)
                higher = raised_spike_rate(self.rate, first, p99, behind, ttft_ms)
                if higher is not None and p99 is not None:
                    self.monitor.event(
                        f"{QOS_MODEL}: {self.rate:.2f} generations/s carried calmly (TTFT p99 "
                        f"{p99:.0f} ms): spike raised to {higher:.2f}"
                    )
                    self.out(f"    spike raised to {higher:.2f} generations/s (carried calmly)\n")
                    self.rate = higher
            await asyncio.sleep(0.5)
        return True

    @staticmethod
    async def until(done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.5)
        return True


def _policy_command(policy: rollout_pb2.QosPolicy) -> rollout_pb2.RolloutCommand:
    return rollout_pb2.RolloutCommand(
        command_id=uuid.uuid4().hex,
        model=QOS_MODEL,
        kind=rollout_pb2.COMMAND_SET_QOS_POLICY,
        qos_policy=policy,
        issued_by="graylane demo",
        issued_at_unix_ms=now_ms(),
    )


async def _send(factory: KafkaFactory, command: rollout_pb2.RolloutCommand) -> None:
    producer = factory.producer()
    await producer.start()
    try:
        await producer.send_and_wait(
            factory.layout.commands(), serde.encode(command), key=QOS_MODEL.encode()
        )
    finally:
        await producer.stop()


async def _audit_steps(factory: KafkaFactory, since_ms: int) -> list[PrecisionStep]:
    read = await read_to_end(factory, factory.layout.audit(), client_suffix="demo-qos-audit")
    records = [serde.decode(audit_pb2.AuditRecord, r.value) for r in read if r.value]
    return precision_steps([r for r in records if r.decided_at_unix_ms >= since_ms])


async def _play(
    factory: KafkaFactory,
    worker: Service,
    template: ChatFormat,
    monitor: Monitor,
    out: Callable[[str], None],
    step: Callable[[str], None],
    phase_timeout_s: float,
) -> QosActShown:
    shown = QosActShown()
    await workers_ready([worker], timeout_s=180.0)
    precision = CompactedFollower(
        factory, factory.layout.precision(), monitor.on_precision, client_suffix="demo-qos-prec"
    )
    await precision.catch_up()
    seen = len(monitor.precision_changes[QOS_VERSION])

    def moved_to(variant: str) -> Callable[[], bool]:
        """A precision record of the act's version, newer than the last one seen, says
        ``variant`` (records of earlier runs do not count)."""

        def done() -> bool:
            changes = monitor.precision_changes[QOS_VERSION][seen:]
            return bool(changes) and changes[-1][1] == variant

        return done

    started_ms = now_ms()
    if monitor.variants.get(QOS_VERSION, LADDER[0]) != LADDER[0]:
        step(
            f"{QOS_MODEL} {QOS_VERSION} is on {monitor.variants[QOS_VERSION]} from an earlier "
            f"run: a QoS policy with the floor {LADDER[0]} sets it back first"
        )
        await _send(factory, _policy_command(qos_act_policy(0.0, MIN_TTFT_OBJECTIVE_MS, LADDER[0])))
        follow = asyncio.Event()
        following = asyncio.create_task(precision.follow(follow))
        try:
            await _Act.until(moved_to(LADDER[0]), phase_timeout_s)
        finally:
            follow.set()
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        seen = len(monitor.precision_changes[QOS_VERSION])
    # the chart starts here, at fp32 (records of earlier runs read on catching up are not
    # this act's)
    monitor.timeline.variants[QOS_VERSION] = [(monitor.now(), LADDER[0])]
    async with GraylaneClient(factory, client_id=f"demo-qos-{uuid.uuid4().hex[:6]}") as client:
        act = _Act(factory, client, monitor, out, template)
        step(f"{QOS_MODEL} {QOS_VERSION} (SmolLM2, ONNX, one native worker) answers at fp32:")
        shown.answers.append(await act.ask(SHOWN_QUESTION, "before the spike"))
        step(f"measuring what one {QOS_MODEL} worker carries here ({PROBE_S:.0f} s, closed loop)")
        shown.capacity_gps, ttfts = await act.probe()
        if shown.capacity_gps <= 0.0:
            raise RuntimeError(f"{QOS_MODEL}: no generation answered while measuring")
        shown.ttft_objective_ms = ttft_objective_ms(ttfts)
        shown.rates = act_rates(shown.capacity_gps)
        step(
            f"capacity {shown.capacity_gps:.2f} generations/s at fp32 ({NEW_TOKENS} tokens "
            f"each); QoS policy: {' -> '.join(LADDER)}, TTFT p99 objective "
            f"{shown.ttft_objective_ms:.0f} ms, back up below 0.7 x that capacity"
        )
        await _send(
            factory,
            _policy_command(qos_act_policy(shown.capacity_gps, shown.ttft_objective_ms)),
        )
        act.ttft_deadline_ms = int(GIVE_UP_OBJECTIVES * shown.ttft_objective_ms)
        tasks = [
            asyncio.create_task(precision.follow(act.stop)),
            asyncio.create_task(act.collect()),
            asyncio.create_task(act.load()),
        ]
        try:
            act.rate = shown.rates.steady_gps
            step(f"steady chat load: {act.rate:.2f} generations/s")
            await asyncio.sleep(8)
            act.rate = shown.rates.spike_gps
            spike_at = time.monotonic()
            monitor.event(f"{QOS_MODEL}: spike to {act.rate:.2f} generations/s")
            step(
                f"load spike: {act.rate:.2f} generations/s ({SPIKE_FACTOR:g} x the capacity "
                "measured at fp32)"
            )
            if await act.spike_until(moved_to(LADDER[1]), phase_timeout_s, shown.ttft_objective_ms):
                shown.stepped_down_s = time.monotonic() - spike_at
                monitor.event(f"{QOS_MODEL}: QoS stepped down to {LADDER[1]}")
                step(
                    f"the policy engine stepped {QOS_MODEL} down to {LADDER[1]} after "
                    f"{shown.stepped_down_s:.0f} s; an answer on the lower rung:"
                )
                shown.answers.append(await act.ask(SHOWN_QUESTION, "on the lower rung"))
            else:
                step(f"no step down within {phase_timeout_s:.0f} s")
            act.rate = shown.rates.steady_gps
            spike_over = time.monotonic()
            monitor.event(f"{QOS_MODEL}: spike over")
            step(f"spike over: back to {act.rate:.2f} generations/s")
            if shown.stepped_down_s and await act.until(moved_to(LADDER[0]), phase_timeout_s):
                shown.stepped_up_s = time.monotonic() - spike_over
                monitor.event(f"{QOS_MODEL}: QoS stepped back up to {LADDER[0]}")
                step(
                    f"the policy engine stepped {QOS_MODEL} back up to {LADDER[0]} after "
                    f"{shown.stepped_up_s:.0f} s; an answer at fp32 again:"
                )
                act.rate = 0.0
                shown.answers.append(await act.ask(SHOWN_QUESTION, "after the spike"))
            elif shown.stepped_down_s:
                step(f"no step back up within {phase_timeout_s:.0f} s")
        finally:
            act.stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await precision.stop()
        shown.results = list(act.results)
    shown.steps = await _audit_steps(factory, started_ms)
    return shown


def run_qos_act(
    factory: KafkaFactory,
    log_dir: Path,
    step: Callable[[str], None],
    *,
    template: ChatFormat,
    clock_origin: float | None = None,
    phase_timeout_s: float = 150.0,
) -> tuple[QosActShown, Monitor]:
    """The act (see the module's docstring); its worker stops at its end. ``template``:
    the model's chat template (its artifacts carry it: :func:`chat_template_of`)."""

    def out(text: str) -> None:
        print(text, end="", flush=True)

    monitor = Monitor(QOS_MODEL, window_s=600.0, t0=clock_origin)
    worker = start_service(
        f"worker-{QOS_MODEL}-{QOS_VERSION}",
        [
            "worker",
            "--model",
            QOS_MODEL,
            "--version",
            QOS_VERSION,
            "--from-registry",
            "--threads",
            "1",
            "--max-sequences",
            str(ROWS),
            "--max-new-tokens",
            "64",
        ],
        log_dir,
    )
    try:
        step(f"starting one native worker for {QOS_MODEL} {QOS_VERSION} ({', '.join(LADDER)})")
        shown = asyncio.run(_play(factory, worker, template, monitor, out, step, phase_timeout_s))
    finally:
        stop_services([worker])
    demo_console().print(rung_table(shown.results))
    return shown, monitor


def rung_table(results: Sequence[Result]) -> Table:
    """The act's generations by the rung that served them: count, TTFT and TPOT p99."""
    table = Table(title=f"{QOS_MODEL}: the act's chat generations, by the rung that served them")
    for col in ("variant", "generations", "shed or failed", "TTFT p99 ms", "TPOT p99 ms"):
        table.add_column(col, justify="right")
    for variant in sorted({r.variant for r in results if r.variant}, key=_rung_order):
        rs = [r for r in results if r.variant == variant]
        ok = [r for r in rs if r.ok]
        ttft = [r.timing.ttft_ms for r in ok if r.timing.ttft_ms > 0]
        tpot = [r.timing.tpot_ms for r in ok if r.timing.tpot_ms > 0]
        table.add_row(
            variant,
            str(len(ok)),
            str(len(rs) - len(ok)),
            f"{np.percentile(ttft, 99):.0f}" if ttft else "-",
            f"{np.percentile(tpot, 99):.1f}" if tpot else "-",
        )
    return table


def _rung_order(variant: str) -> int:
    return LADDER.index(variant) if variant in LADDER else len(LADDER)


def qos_table(shown: QosActShown, t0_ms: int) -> Table:
    """The act in one table: each precision step on record (timed from ``t0_ms``, the
    demo's start) and each answer shown, with the rung that gave it."""
    table = Table(title=f"{QOS_MODEL} {QOS_VERSION}: the QoS ladder under the spike")
    for col in ("t (s)", "what", "rung", "rule / question", "reason / answer"):
        table.add_column(col)
    for s in shown.steps:
        table.add_row(
            f"{(s.decided_at_unix_ms - t0_ms) / 1000:.1f}",
            "precision step",
            f"{s.before} -> {s.after}",
            s.rule,
            s.reason[:90],
        )
    for a in shown.answers:
        table.add_row("", f"answer {a.moment}", a.variant, a.question, a.text[:90])
    return table


def chat_template_of(
    settings: Settings, model: str = QOS_MODEL, version: str = QOS_VERSION
) -> ChatFormat:
    """The chat template ``model``/``version``'s registered fp32 artifact carries."""
    registry = open_registry(settings.db_url, migrate=False)
    for info in registry.list_artifacts(model, version):
        if info.precision.value == LADDER[0]:
            folder = Path(info.path)
            folder = folder if folder.is_absolute() else settings.artifact_dir / folder
            template = load_chat_template(folder)
            if template is not None:
                return template
    raise RuntimeError(
        f"{model} {version}: no registered {LADDER[0]} artifact with a chat template"
    )
