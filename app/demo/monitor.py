"""What the demo watches: routing weights, per-version latency/errors/shed, active variants.

The p99 shown is of the requests answered OK (admitted and served); shed
requests (``SHED``, refused at once by admission control) have their own
column and are not errors. For generations (results that carry a time to first
token) the table also shows the TTFT p99 and the TPOT p99 (mean time per output
token after the first, per generation): a generation's whole latency is mostly
its output length, these two are what its SLO states.

Fed by the client's results and by the compacted control topics; renders a live
table and keeps a timeline for the final report.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np
from aiokafka.structs import ConsumerRecord
from rich.console import Console
from rich.table import Table

from graylane import serde
from graylane.client import Result
from graylane.v1 import control_pb2, rollout_pb2

__all__ = ["PIPE_WIDTH", "Monitor", "RequestSample", "Timeline", "demo_console"]


@dataclass(frozen=True)
class RequestSample:
    """One answered request as the demo monitor records it."""

    at: float
    version: str
    variant: str
    latency_ms: float
    ok: bool
    shed: bool = False
    """Answered SHED by admission control (not run; not an engine error)."""
    worker: str = ""
    ttft_ms: float = 0.0
    """A generation's time to first token (0.0: not a generation, or not known)."""
    tpot_ms: float = 0.0
    """A generation's mean time per output token after the first (0.0: fewer than two)."""


@dataclass
class Timeline:
    """Points for the report: weights, p99 per version, variant per version."""

    weights: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    p99: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    variants: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    events: list[tuple[float, str]] = field(default_factory=list)


class Monitor:
    def __init__(self, model: str, window_s: float = 5.0, t0: float | None = None) -> None:
        self.model = model
        self.window_s = window_s
        self.t0 = time.monotonic() if t0 is None else t0
        """The origin of every time here (``time.monotonic()``): the demo's start, so the
        report's axis is the printed steps' clock."""
        self.samples: deque[RequestSample] = deque()
        self.history: list[RequestSample] = []
        """Every result seen (the live window forgets; reports and benchmarks do not)."""
        self.weights: dict[str, float] = {}
        self.routing_epoch = 0
        self.variants: dict[str, str] = {}
        self.rollouts: dict[str, rollout_pb2.RolloutState] = {}
        self.timeline = Timeline()
        self.total = 0
        self.errors = 0
        self.shed = 0
        self.precision_changes: dict[str, list[tuple[float, str]]] = defaultdict(list)
        """Per version, (time, variant) of every precision command seen."""
        self.workers_seen: dict[str, list[tuple[float, int]]] = defaultdict(list)
        """Per version, (time, workers that answered in the live window) at each snapshot."""

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, text: str) -> None:
        self.timeline.events.append((self.now(), text))

    def on_result(self, result: Result) -> None:
        latency = result.client_latency_ms or result.timing.total_ms
        shed = result.error_code == "SHED"
        sample = RequestSample(
            self.now(),
            result.version,
            result.variant,
            latency,
            result.ok,
            shed,
            result.worker_id,
            ttft_ms=result.timing.ttft_ms,
            tpot_ms=result.timing.tpot_ms,
        )
        self.samples.append(sample)
        self.history.append(sample)
        self.total += 1
        self.shed += int(shed)
        self.errors += int(not result.ok and not shed)

    def on_routing(self, record: ConsumerRecord[bytes, bytes]) -> None:
        if record.value is None or record.key != self.model.encode():
            return
        table = serde.decode(control_pb2.RoutingTable, record.value)
        if table.epoch <= self.routing_epoch:
            return
        self.routing_epoch = table.epoch
        self.weights = {r.version: r.weight_percent for r in table.routes if r.weight_percent > 0}
        self.timeline.weights.append((self.now(), dict(self.weights)))

    def on_precision(self, record: ConsumerRecord[bytes, bytes]) -> None:
        if record.value is None:
            return
        command = serde.decode(control_pb2.PrecisionCommand, record.value)
        if command.model == self.model:
            self.variants[command.version] = command.variant
            self.timeline.variants[command.version].append((self.now(), command.variant))
            self.precision_changes[command.version].append((self.now(), command.variant))

    def on_rollout(self, record: ConsumerRecord[bytes, bytes]) -> None:
        if record.value is None:
            return
        state = serde.decode(rollout_pb2.RolloutState, record.value)
        if state.model == self.model:
            self.rollouts[state.rollout_id] = state

    def window(self) -> dict[str, list[RequestSample]]:
        cutoff = self.now() - self.window_s
        while self.samples and self.samples[0].at < cutoff:
            self.samples.popleft()
        by_version: dict[str, list[RequestSample]] = defaultdict(list)
        for s in self.samples:
            by_version[s.version].append(s)
        return by_version

    def workers(self, version: str) -> int:
        """Workers that answered ``version``'s requests in the live window."""
        return len({s.worker for s in self.window().get(version, []) if s.worker})

    def snapshot(self) -> None:
        """Record the current per-version p99 (and workers) on the timeline."""
        for version, samples in self.window().items():
            self.workers_seen[version].append((self.now(), self.workers(version)))
            ok = [s.latency_ms for s in samples if s.ok]
            if ok:
                self.timeline.p99[version].append((self.now(), float(np.percentile(ok, 99))))
            self.timeline.variants[version].append((self.now(), samples[-1].variant))

    def table(self, title: str) -> Table:
        window = self.window()
        generating = any(s.ttft_ms > 0 for samples in window.values() for s in samples)
        caption = "p99 of the requests answered OK (admitted)"
        if generating:
            caption += "; TTFT/TPOT p99 of the generations answered OK"
        table = Table(title=title, caption=caption)
        columns = ("version", "weight", "req/s", "p50 ms", "p99 ms", "errors", "shed", "variant")
        ttft_tpot = ("TTFT p99 ms", "TPOT p99 ms") if generating else ()
        for col in (*columns, "workers", *ttft_tpot):
            table.add_column(col, justify="right")
        versions = sorted(set(window) | set(self.weights))
        for version in versions:
            samples = window.get(version, [])
            ok = [s.latency_ms for s in samples if s.ok]
            ttft = [s.ttft_ms for s in samples if s.ok and s.ttft_ms > 0]
            tpot = [s.tpot_ms for s in samples if s.ok and s.tpot_ms > 0]
            timings = (_p99_cell(ttft, ".0f"), _p99_cell(tpot, ".1f")) if generating else ()
            rate = len(samples) / self.window_s
            err = (sum(not s.ok and not s.shed for s in samples) / len(samples)) if samples else 0.0
            shed = (sum(s.shed for s in samples) / len(samples)) if samples else 0.0
            variant = samples[-1].variant if samples else self.variants.get(version, "-")
            table.add_row(
                version,
                f"{self.weights.get(version, 0.0):.0f}%",
                f"{rate:.1f}",
                f"{np.percentile(ok, 50):.0f}" if ok else "-",
                f"{np.percentile(ok, 99):.0f}" if ok else "-",
                f"{100 * err:.1f}%",
                f"{100 * shed:.1f}%",
                variant,
                str(self.workers(version)),
                *timings,
            )
        return table


PIPE_WIDTH = 132
"""Columns of the demo's tables when its output is not a terminal (a log, CI)."""


def demo_console() -> Console:
    """A console for the demo's tables: the terminal's width, or a log's ``PIPE_WIDTH``
    (Rich would take 80 and cut the per-version table's headings)."""
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def _p99_cell(values: list[float], spec: str) -> str:
    return format(float(np.percentile(values, 99)), spec) if values else "-"
