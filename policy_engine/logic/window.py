"""Sliding-window statistics of batch telemetry, per (model, version, variant).

A :class:`SlidingWindow` keeps *panes*: tumbling sub-buckets of ``step_ms``
keyed by ``completed_at_ms // step_ms``. Adding a sample touches one pane
(constant work: a few counters and one histogram merge of bounded size); a
window is the merge of the last ``window_ms / step_ms`` panes, summed per key
incrementally as the window slides (:class:`_SlotSums`: two merges per read, not
one per pane; a tick reads every version of every model).

Choices worth knowing:

- **Whole panes only.** The window read at ``now_ms`` is
  ``[end - window_ms, end)`` with ``end = (now_ms // step_ms) * step_ms``; the
  pane still filling is left out, so a read does not drift while the current
  step's batches arrive, and the same samples always give the same stats.
- **Throughput** divides by the part of the window since the key was first
  seen (a version that started 4 s ago is not diluted over 10 s).
- **Shadow batches** (``shadow_count == request_count > 0``) are kept in a
  separate :class:`Lane`: they never mix into a version's live stats, and the
  rollout controller reads them to judge a candidate under shadow traffic.
  A batch mixing live and shadow requests cannot be split (one histogram), so
  it counts as live; workers batch shadow requests apart.
- **Late samples** older than the retained panes are dropped and counted
  (``dropped_late``); ``evict`` moves that horizon.
- **Shed** requests (answered SHED by admission control, never run) are
  counted apart from ``requests``; a sample of sheds alone counts no batch.
- **Device load** is the mean of the batches' ``device_load``; **lag** is the
  sum over workers of each worker's latest reported lag in the window.
- **Generations** (batches carrying generation telemetry) add their TTFT, TPOT,
  inter-token p99, prefill and output-length histograms, token counts and how
  many ended by the model's own choice (EOS or a stop) to :class:`GenerationStats`;
  the KV-cache occupancy is the mean of each worker's latest report, the waiting
  sequences their sum (like lag). Windows without generations have none.
- **Service time** (the model's part of latency, without queueing) of a
  batch is its wall time from start to completion (``compute_ms`` when that
  is larger or the start is unknown); every request of the batch is counted
  at it. Windows keep its histogram (``service``) for the load-aware gates,
  and the busy time (each batch's service time once) per request served
  (``service_per_request_ms``) for the QoS controller's contention factor.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from graylane.histogram import DEFAULT_GROWTH, DEFAULT_MIN_MS, LatencyHistogram

__all__ = [
    "ALL_VARIANTS",
    "DEFAULT_STEP_MS",
    "DEFAULT_WINDOW_MS",
    "GenerationSample",
    "GenerationStats",
    "Lane",
    "SlidingWindow",
    "TelemetrySample",
    "WindowKey",
    "WindowStats",
    "invalid_sample",
]


class Lane(Enum):
    """Which traffic a stat describes: live requests or shadow copies."""

    LIVE = "live"
    SHADOW = "shadow"


@dataclass(frozen=True, kw_only=True)
class GenerationSample:
    """The generation part of one batch's telemetry (its OK answers)."""

    generations: int
    ttft: LatencyHistogram = field(default_factory=LatencyHistogram)
    tpot: LatencyHistogram = field(default_factory=LatencyHistogram)
    inter_token_p99: LatencyHistogram = field(default_factory=LatencyHistogram)
    prefill: LatencyHistogram = field(default_factory=LatencyHistogram)
    output_tokens: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Generated tokens per answer (token counts in the latency scheme)."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ended_by_model: int = 0
    """Answers that ended on the model's end-of-sequence token or a stop (not on a
    length limit or a cancel)."""
    kv_cache_occupancy: float = 0.0
    waiting_sequences: int = 0

    def histograms(self) -> tuple[tuple[str, LatencyHistogram], ...]:
        return (
            ("ttft", self.ttft),
            ("tpot", self.tpot),
            ("inter-token p99", self.inter_token_p99),
            ("prefill", self.prefill),
            ("output tokens", self.output_tokens),
        )


@dataclass(frozen=True, kw_only=True)
class GenerationStats:
    """Generations of one version over one window: what gates and QoS judge them on."""

    generations: int
    ttft: LatencyHistogram = field(hash=False, repr=False)
    tpot: LatencyHistogram = field(hash=False, repr=False)
    inter_token_p99: LatencyHistogram = field(hash=False, repr=False)
    prefill: LatencyHistogram = field(hash=False, repr=False)
    output_tokens: LatencyHistogram = field(hash=False, repr=False)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ended_by_model: int = 0
    kv_cache_occupancy: float = 0.0
    """Mean over the workers' latest reports, 0..1."""
    waiting_sequences: int = 0
    """Sum over the workers' latest reports."""

    @property
    def ttft_p99_ms(self) -> float:
        return self.ttft.quantile(0.99)

    @property
    def tpot_p99_ms(self) -> float:
        return self.tpot.quantile(0.99)

    @property
    def ttft_p50_ms(self) -> float:
        return self.ttft.quantile(0.50)

    @property
    def tpot_p50_ms(self) -> float:
        return self.tpot.quantile(0.50)

    @property
    def inter_token_p99_ms(self) -> float:
        """The p99 over requests of each request's inter-token p99."""
        return self.inter_token_p99.quantile(0.99)

    @property
    def mean_output_tokens(self) -> float:
        return self.generated_tokens / self.generations if self.generations else 0.0

    @property
    def eos_rate(self) -> float:
        """Share of the generations that ended by the model's choice (EOS or a stop)."""
        return self.ended_by_model / self.generations if self.generations else 0.0


@dataclass(frozen=True, kw_only=True)
class TelemetrySample:
    """The part of one ``BatchTelemetry`` record the policy engine needs."""

    model: str
    version: str
    variant: str
    worker_id: str
    completed_at_ms: int
    request_count: int
    error_count: int
    latency: LatencyHistogram
    queue_wait: LatencyHistogram = field(default_factory=LatencyHistogram)
    queue_wait_mean_ms: float = 0.0
    compute_ms: float = 0.0
    device_load: float = 0.0
    shadow_count: int = 0
    lag: int = 0
    started_at_ms: int = 0
    batch_size: int = 0
    batch_id: tuple[str, int, int] | None = None
    """(worker, partition, first offset): a re-sent batch carries the same id."""
    shed_count: int = 0
    """Requests the worker shed (answered SHED, not run) since its previous batch."""
    generation: GenerationSample | None = None
    """GENERATE batches: their generations' timings, tokens and endings."""

    def __post_init__(self) -> None:
        counts = (self.request_count, self.error_count, self.shadow_count, self.shed_count)
        if min(counts) < 0:
            raise ValueError("telemetry counts must not be negative")
        if self.error_count > self.request_count:
            raise ValueError(
                f"{self.error_count} errors out of {self.request_count} requests is impossible"
            )
        if self.shadow_count > self.request_count:
            raise ValueError(
                f"{self.shadow_count} shadow requests out of {self.request_count} is impossible"
            )

    @property
    def key(self) -> WindowKey:
        return WindowKey(self.model, self.version, self.variant)

    @property
    def is_shadow(self) -> bool:
        """Every request of the batch was a shadow copy."""
        return self.request_count > 0 and self.shadow_count == self.request_count

    @property
    def lane(self) -> Lane:
        return Lane.SHADOW if self.is_shadow else Lane.LIVE

    @property
    def service_ms(self) -> float:
        """The batch's service time (see the module docstring); 0.0 when unknown."""
        wall = self.completed_at_ms - self.started_at_ms if self.started_at_ms > 0 else 0
        return max(float(wall), self.compute_ms, 0.0)


@dataclass(frozen=True, order=True)
class WindowKey:
    model: str
    version: str
    variant: str


@dataclass(frozen=True, kw_only=True)
class WindowStats:
    """Statistics of one (model, version, variant) over one window."""

    model: str
    version: str
    variant: str
    window_start_ms: int
    window_end_ms: int
    requests: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput_rps: float
    queue_wait_mean_ms: float = 0.0
    queue_wait_p99_ms: float = 0.0
    batches: int = 0
    device_load: float = 0.0
    lag: int = 0
    workers: int = 0
    """Distinct workers that reported a batch in the window (replicas serving)."""
    service_p50_ms: float = 0.0
    service_p95_ms: float = 0.0
    service_p99_ms: float = 0.0
    service: LatencyHistogram | None = field(default=None, hash=False, repr=False)
    """Service times of the window's requests; None when no batch carried one."""
    shed: int = 0
    """Requests shed (answered SHED, never run) in the window: not in ``requests``."""
    shed_rps: float = 0.0
    service_busy_ms: float = 0.0
    """Sum of the window's batch service times (each batch once): the workers' busy time."""
    service_requests: int = 0
    """Requests of the batches that carried a service time (``service_busy_ms``'s)."""
    step_offered_rps: float = 0.0
    """Offered load (served + shed) of the newest step alone: the window's average
    lags a jump in load by up to the window's length. A step whose telemetry is
    still in flight reads low, never high."""
    generation: GenerationStats | None = field(default=None, hash=False, repr=False)
    """Generations in the window (TTFT, TPOT, lengths, endings); None without any."""

    @property
    def service_per_request_ms(self) -> float:
        """Busy milliseconds per request served (0.0 when unknown)."""
        if self.service_requests <= 0 or self.service_busy_ms <= 0.0:
            return 0.0
        return self.service_busy_ms / self.service_requests

    @property
    def offered_rps(self) -> float:
        """Requests/s that arrived: served (``throughput_rps``) plus shed."""
        return self.throughput_rps + self.shed_rps

    @property
    def shed_fraction(self) -> float:
        """Share of the arrived requests that were shed."""
        arrived = self.requests + self.shed
        return self.shed / arrived if arrived else 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def key(self) -> WindowKey:
        return WindowKey(self.model, self.version, self.variant)

    @property
    def duration_ms(self) -> int:
        return self.window_end_ms - self.window_start_ms


DEFAULT_WINDOW_MS = 10_000
DEFAULT_STEP_MS = 2_000
ALL_VARIANTS = "*"
"""The ``variant`` of stats merged over more than one variant of a version."""


MAX_IDS_PER_PANE = 100_000
"""Batch ids remembered per pane (bounds memory; ids age out with their pane)."""


class _Pane:
    """Mutable running totals of one key over one step."""

    __slots__ = (
        "batch_ids",
        "batches",
        "device_load_sum",
        "errors",
        "generation",
        "lag_by_worker",
        "latency",
        "queue",
        "queue_fallback_count",
        "queue_fallback_sum",
        "requests",
        "service",
        "service_busy_ms",
        "service_requests",
        "shed",
    )

    def __init__(self, min_ms: float, growth: float) -> None:
        self.requests = 0
        self.errors = 0
        self.shed = 0
        self.batches = 0
        self.latency = LatencyHistogram(min_ms, growth)
        self.queue = LatencyHistogram(min_ms, growth)
        self.service = LatencyHistogram(min_ms, growth)
        self.service_busy_ms = 0.0
        self.service_requests = 0
        # Workers that send only a mean queue wait, without a histogram.
        self.queue_fallback_sum = 0.0
        self.queue_fallback_count = 0
        self.device_load_sum = 0.0
        self.lag_by_worker: dict[str, tuple[int, int]] = {}
        self.batch_ids: set[tuple[str, int, int]] = set()
        self.generation: _GenerationPane | None = None

    def add(self, s: TelemetrySample) -> None:
        self.requests += s.request_count
        self.errors += s.error_count
        self.shed += s.shed_count
        if s.request_count == 0:  # sheds alone (nothing ran): no batch, no latency
            _keep_latest_lag(self.lag_by_worker, s.worker_id, (s.completed_at_ms, s.lag))
            return
        self.batches += 1
        if s.batch_id is not None and len(self.batch_ids) < MAX_IDS_PER_PANE:
            self.batch_ids.add(s.batch_id)
        self.latency.update(s.latency)
        if s.queue_wait.count:
            self.queue.update(s.queue_wait)
        elif s.request_count:
            self.queue_fallback_sum += s.queue_wait_mean_ms * s.request_count
            self.queue_fallback_count += s.request_count
        service_ms = s.service_ms
        if service_ms > 0.0:
            self.service.record(service_ms, s.request_count)
            self.service_busy_ms += service_ms
            self.service_requests += s.request_count
        self.device_load_sum += s.device_load
        _keep_latest_lag(self.lag_by_worker, s.worker_id, (s.completed_at_ms, s.lag))
        if s.generation is not None:
            if self.generation is None:
                self.generation = _GenerationPane(self.latency.min_ms, self.latency.growth)
            self.generation.add(s.generation, s.worker_id, s.completed_at_ms)

    def absorb(self, other: _Pane) -> None:
        """Add ``other``'s totals into this one (batch ids aside: a sum is not a pane)."""
        self.requests += other.requests
        self.errors += other.errors
        self.shed += other.shed
        self.batches += other.batches
        self.latency.update(other.latency)
        self.queue.update(other.queue)
        self.service.update(other.service)
        self.service_busy_ms += other.service_busy_ms
        self.service_requests += other.service_requests
        self.queue_fallback_sum += other.queue_fallback_sum
        self.queue_fallback_count += other.queue_fallback_count
        self.device_load_sum += other.device_load_sum
        for worker, report in other.lag_by_worker.items():
            _keep_latest_lag(self.lag_by_worker, worker, report)
        if other.generation is not None:
            if self.generation is None:
                self.generation = _GenerationPane(self.latency.min_ms, self.latency.growth)
            self.generation.absorb(other.generation)

    def copy(self) -> _Pane:
        """A new pane with these totals (batch ids aside)."""
        clone = _Pane.__new__(_Pane)
        clone.requests, clone.errors, clone.shed = self.requests, self.errors, self.shed
        clone.batches = self.batches
        clone.latency, clone.queue = self.latency.copy(), self.queue.copy()
        clone.service = self.service.copy()
        clone.service_busy_ms, clone.service_requests = self.service_busy_ms, self.service_requests
        clone.queue_fallback_sum = self.queue_fallback_sum
        clone.queue_fallback_count = self.queue_fallback_count
        clone.device_load_sum = self.device_load_sum
        clone.lag_by_worker = dict(self.lag_by_worker)
        clone.batch_ids = set()
        clone.generation = None
        if self.generation is not None:
            clone.generation = _GenerationPane(self.latency.min_ms, self.latency.growth)
            clone.generation.absorb(self.generation)
        return clone

    def plus(self, other: _Pane) -> _Pane:
        """A new pane holding both totals; neither input changes."""
        total = self.copy()
        total.absorb(other)
        return total


class _SlotSums:
    """Sums of one slot's panes for sliding windows, without merging every pane per read.

    Two stacks (the classic sliding-window aggregation): ``suffix[i]`` holds the panes
    ``[front_start + i, front_end)`` merged, ``back`` the panes ``[front_end, back_end)``.
    A window ``[first, end)`` with ``front_start <= first < front_end <= end`` is
    ``suffix[first - front_start] + back`` once ``back`` has taken the panes up to
    ``end``: one pane merged per step and two sums per read, where merging the window's
    panes costs one per pane. The front is rebuilt (one merge per pane) when the window
    has left it. A sample that lands in a pane already summed goes into ``back`` when
    the pane lies there; in the front, the sums are dropped and rebuilt at the next read.

    Telemetry arrives late by the time workers take to publish it and the engine takes to
    read it, so the newest ``settle`` panes of a build start in ``back``, not in the
    front: a sample up to ``settle`` panes late then lands in ``back`` (one sample added)
    instead of dropping the sums (a rebuild of the whole front, which an engine reading a
    step behind would otherwise pay at every read).
    """

    __slots__ = ("back", "back_end", "front_end", "front_start", "suffix")

    def __init__(
        self, panes: dict[int, _Pane], first: int, end: int, scheme: _Pane, settle: int = 0
    ) -> None:
        front_end = max(first + 1, end - settle)
        self.front_start = first
        self.front_end = front_end
        self.back_end = end
        self.back = scheme.plus(scheme)  # empty
        for index in range(front_end, end):
            pane = panes.get(index)
            if pane is not None:
                self.back.absorb(pane)
        suffix: list[_Pane] = [scheme] * (front_end - first)
        running = scheme
        for index in range(front_end - 1, first - 1, -1):
            pane = panes.get(index)
            if pane is not None:
                running = pane.plus(running)
            suffix[index - first] = running
        self.suffix = suffix

    def window(self, panes: dict[int, _Pane], first: int, end: int) -> _Pane:
        """The panes ``[first, end)`` merged; the caller has checked that the sums cover
        ``first`` (``front_start <= first < front_end``) and that ``end >= back_end``."""
        for index in range(self.back_end, end):
            pane = panes.get(index)
            if pane is not None:
                self.back.absorb(pane)
        self.back_end = end
        return self.suffix[first - self.front_start].plus(self.back)


_QUANTILES = (0.50, 0.95, 0.99)

WINDOW_SUMS_MIN_PANES = 4
"""Reads spanning fewer panes (a step's increment) merge their panes directly."""


class _GenerationPane:
    """Running totals of one key's generations over one step."""

    __slots__ = (
        "ended_by_model",
        "generated_tokens",
        "generations",
        "histograms",
        "load_by_worker",
        "prompt_tokens",
    )

    def __init__(self, min_ms: float, growth: float) -> None:
        self.generations = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.ended_by_model = 0
        self.histograms = tuple(LatencyHistogram(min_ms, growth) for _ in range(5))
        """ttft, tpot, inter-token p99, prefill, output tokens."""
        self.load_by_worker: dict[str, tuple[int, float, int]] = {}
        """Worker -> (completed at, KV-cache occupancy, waiting sequences), the latest."""

    def add(self, g: GenerationSample, worker: str, at_ms: int) -> None:
        self.generations += g.generations
        self.prompt_tokens += g.prompt_tokens
        self.generated_tokens += g.generated_tokens
        self.ended_by_model += g.ended_by_model
        for into, (_, hist) in zip(self.histograms, g.histograms(), strict=True):
            if hist.count:
                into.update(hist)
        report = (at_ms, g.kv_cache_occupancy, g.waiting_sequences)
        current = self.load_by_worker.get(worker)
        if current is None or report > current:
            self.load_by_worker[worker] = report

    def absorb(self, other: _GenerationPane) -> None:
        self.generations += other.generations
        self.prompt_tokens += other.prompt_tokens
        self.generated_tokens += other.generated_tokens
        self.ended_by_model += other.ended_by_model
        for into, hist in zip(self.histograms, other.histograms, strict=True):
            if hist.count:
                into.update(hist)
        for worker, report in other.load_by_worker.items():
            current = self.load_by_worker.get(worker)
            if current is None or report > current:
                self.load_by_worker[worker] = report


def _generation_stats(pane: _GenerationPane | None) -> GenerationStats | None:
    """The stats of a window's generations summed into one pane of its own."""
    if pane is None:
        return None
    merged = pane.histograms
    latest = pane.load_by_worker
    return GenerationStats(
        generations=pane.generations,
        ttft=merged[0],
        tpot=merged[1],
        inter_token_p99=merged[2],
        prefill=merged[3],
        output_tokens=merged[4],
        prompt_tokens=pane.prompt_tokens,
        generated_tokens=pane.generated_tokens,
        ended_by_model=pane.ended_by_model,
        kv_cache_occupancy=(
            sum(kv for _, kv, _ in latest.values()) / len(latest) if latest else 0.0
        ),
        waiting_sequences=sum(w for _, _, w in latest.values()),
    )


def _keep_latest_lag(
    into: dict[str, tuple[int, int]], worker: str, report: tuple[int, int]
) -> None:
    # Latest report wins; a tie takes the larger lag so the order of arrival does not matter.
    current = into.get(worker)
    if current is None or report > current:
        into[worker] = report


class SlidingWindow:
    """Pane-based sliding windows over telemetry samples."""

    def __init__(
        self,
        window_ms: int = DEFAULT_WINDOW_MS,
        step_ms: int = DEFAULT_STEP_MS,
        *,
        min_ms: float = DEFAULT_MIN_MS,
        growth: float = DEFAULT_GROWTH,
    ) -> None:
        if step_ms <= 0 or window_ms <= 0:
            raise ValueError("window and step must be positive")
        if window_ms % step_ms:
            raise ValueError(f"window {window_ms} ms is not a multiple of step {step_ms} ms")
        self.window_ms = window_ms
        self.step_ms = step_ms
        self.panes_per_window = window_ms // step_ms
        self._settle = self.panes_per_window // 4
        """Panes at the newest end of a window whose late samples keep its sums (see
        :class:`_SlotSums`): a quarter of the window."""
        self._min_ms = min_ms
        self._growth = growth
        self.scheme = LatencyHistogram(min_ms, growth)
        """An empty histogram of the window's bucket scheme: a sample's must match it."""
        self._panes: dict[tuple[Lane, WindowKey], dict[int, _Pane]] = {}
        self._first_pane: dict[tuple[Lane, WindowKey], int] = {}
        self._by_version: dict[tuple[Lane, str, str], set[WindowKey]] = {}
        """The keys (variants) of each (lane, model, version): no scan of every slot."""
        self._revision: dict[tuple[Lane, WindowKey], int] = {}
        self._changes = 0
        """A slot's revision is the count of changes at its last change: never reused."""
        self._memo: dict[tuple[object, ...], tuple[tuple[int, ...], WindowStats | None]] = {}
        self._memo_end: int | None = None
        """Stats already summarized, by slots, span and end, while the newest end read is
        this one: a tick reads a version several times (gates, QoS, scale) and merges its
        panes once."""
        self._sums: dict[tuple[Lane, WindowKey], _SlotSums] = {}
        """Per slot, its panes summed for whole-window reads (see :class:`_SlotSums`)."""
        self._zero = _Pane(min_ms, growth)
        self._horizon: int | None = None
        self._lateness: deque[tuple[int, int]] = deque(maxlen=self.panes_per_window)
        """Per step of arrival (its pane index on the engine's clock), the largest lateness
        (ms) of the samples that arrived in it: the last window's worth of steps."""
        self.dropped_late = 0
        self.duplicates = 0

    def note_arrival(self, completed_at_ms: int, received_ms: int) -> None:
        """A sample completed at ``completed_at_ms`` (its worker's clock) reached the engine
        at ``received_ms`` (the engine's): how late telemetry arrives (see
        :meth:`settled_ms`)."""
        late = max(0, received_ms - completed_at_ms)
        index = received_ms // self.step_ms
        if self._lateness and self._lateness[-1][0] == index:
            if late > self._lateness[-1][1]:
                self._lateness[-1] = (index, late)
        elif not self._lateness or index > self._lateness[-1][0]:
            self._lateness.append((index, late))

    def settled_ms(self, now_ms: int) -> int:
        """The newest time whose telemetry has arrived, as far as the engine can tell:
        ``now_ms`` less the typical lateness (the median, over the last window's steps, of
        each step's latest arrival), at most half the window. A step read at this time has
        its samples, where one read at ``now_ms`` misses those still on their way: what
        the sequential gates consume as an increment (:meth:`step_stats_by_version`).
        Clocks that disagree read as lateness too, and are bounded alike."""
        if not self._lateness:
            return now_ms
        lates = sorted(late for _, late in self._lateness)
        typical = lates[(len(lates) - 1) // 2]
        return now_ms - min(typical, self.window_ms // 2)

    def window_bounds(self, now_ms: int) -> tuple[int, int]:
        """``(start, end)`` of the window read at ``now_ms`` (end exclusive)."""
        end = (now_ms // self.step_ms) * self.step_ms
        return end - self.window_ms, end

    def add(self, sample: TelemetrySample) -> bool:
        """Count one batch; False when it is older than the retained panes or a
        duplicate (same batch id) of one already counted, e.g. after a rewind."""
        pane_index = sample.completed_at_ms // self.step_ms
        if self._horizon is not None and pane_index < self._horizon:
            self.dropped_late += 1
            return False
        slot = (sample.lane, sample.key)
        if sample.batch_id is not None and any(
            sample.batch_id in p.batch_ids
            for lane in Lane
            for p in self._panes.get((lane, sample.key), {}).values()
        ):
            self.duplicates += 1
            return False
        panes = self._panes.setdefault(slot, {})
        pane = panes.get(pane_index)
        if pane is None:
            pane = panes[pane_index] = _Pane(self._min_ms, self._growth)
        pane.add(sample)
        sums = self._sums.get(slot)
        if sums is not None and pane_index < sums.back_end:
            if pane_index >= sums.front_end:
                sums.back.add(sample)  # a late sample in a pane already summed
            else:
                del self._sums[slot]
        self._by_version.setdefault((slot[0], sample.key.model, sample.key.version), set()).add(
            sample.key
        )
        self._touch(slot)
        first = self._first_pane.get(slot)
        if first is None or pane_index < first:
            self._first_pane[slot] = pane_index
        return True

    def add_many(self, samples: Iterable[TelemetrySample]) -> int:
        return sum(1 for s in samples if self.add(s))

    def keys(self, lane: Lane = Lane.LIVE) -> frozenset[WindowKey]:
        """Keys with at least one retained pane in ``lane``."""
        return frozenset(key for (ln, key) in self._panes if ln is lane)

    def evict(self, now_ms: int) -> int:
        """Drop panes that no window at ``now_ms`` or later can read; returns how many."""
        horizon = now_ms // self.step_ms - self.panes_per_window
        if self._horizon is None or horizon > self._horizon:
            self._horizon = horizon
        removed = 0
        for slot in list(self._panes):
            panes = self._panes[slot]
            old = [i for i in panes if i < horizon]
            for index in old:
                del panes[index]
            removed += len(old)
            if old:
                self._touch(slot)
            if not panes:
                del self._panes[slot]
                self._sums.pop(slot, None)
                self._first_pane.pop(slot, None)
                self._revision.pop(slot, None)
                lane, key = slot
                variants = self._by_version.get((lane, key.model, key.version))
                if variants is not None:
                    variants.discard(key)
                    if not variants:
                        del self._by_version[(lane, key.model, key.version)]
        return removed

    def _touch(self, slot: tuple[Lane, WindowKey]) -> None:
        self._changes += 1
        self._revision[slot] = self._changes

    def stats(self, key: WindowKey, now_ms: int, lane: Lane = Lane.LIVE) -> WindowStats | None:
        """Stats of ``key`` over the window at ``now_ms``; None without a batch in it."""
        return self._stats_of([(lane, key)], key.model, key.version, now_ms)

    def step_stats_by_version(
        self, model: str, version: str, now_ms: int, lane: Lane = Lane.LIVE
    ) -> WindowStats | None:
        """Like :meth:`stats_by_version`, over the newest whole step only.

        Consecutive steps never overlap: the increments the sequential gates consume.
        """
        return self.stats_by_version(model, version, now_ms, lane, span_ms=self.step_ms)

    def stats_by_version(
        self,
        model: str,
        version: str,
        now_ms: int,
        lane: Lane = Lane.LIVE,
        *,
        span_ms: int | None = None,
    ) -> WindowStats | None:
        """Stats of every variant of (model, version) together.

        ``variant`` is the variant's name when only one had batches in the
        window, else :data:`ALL_VARIANTS`.
        """
        slots = [(lane, key) for key in self._by_version.get((lane, model, version), ())]
        return self._stats_of(
            sorted(slots, key=lambda s: s[1]), model, version, now_ms, span_ms=span_ms
        )

    def _stats_of(
        self,
        slots: list[tuple[Lane, WindowKey]],
        model: str,
        version: str,
        now_ms: int,
        *,
        span_ms: int | None = None,
    ) -> WindowStats | None:
        start_ms, end_ms = self.window_bounds(now_ms)
        if span_ms is not None:
            start_ms = end_ms - span_ms
        first_index, end_index = start_ms // self.step_ms, end_ms // self.step_ms
        # Reads end at the newest step and, for the sequential gates' increments, at the
        # newest settled one: entries of both stay until the newest end moves on.
        if self._memo_end is None or end_index > self._memo_end:
            self._memo.clear()
            self._memo_end = end_index
        memo_key = (tuple(slots), first_index, end_index, model, version)
        revisions = tuple(self._revision.get(slot, 0) for slot in slots)
        known = self._memo.get(memo_key)
        if known is not None and known[0] == revisions:
            return known[1]
        stats = self._summarized(slots, model, version, start_ms, end_ms, first_index, end_index)
        self._memo[memo_key] = (revisions, stats)
        return stats

    def _summarized(
        self,
        slots: list[tuple[Lane, WindowKey]],
        model: str,
        version: str,
        start_ms: int,
        end_ms: int,
        first_index: int,
        end_index: int,
    ) -> WindowStats | None:
        panes: list[_Pane] = []
        newest: list[_Pane] = []
        variants: set[str] = set()
        first_seen: int | None = None
        owned = False  # whether panes[0] is a sum of this read's own (safe to hand out)
        for slot in slots:
            held = self._panes.get(slot, {})
            found = [p for i, p in sorted(held.items()) if first_index <= i < end_index]
            if not found:
                continue
            if end_index - first_index >= WINDOW_SUMS_MIN_PANES:
                panes.append(self._window_sum(slot, held, first_index, end_index))
                owned = True
            else:
                panes.extend(found)
            last = held.get(end_index - 1)
            if last is not None:
                newest.append(last)
            variants.add(slot[1].variant)
            seen = self._first_pane[slot]
            first_seen = seen if first_seen is None else min(first_seen, seen)
        if not panes or first_seen is None:
            return None
        effective_start = max(start_ms, first_seen * self.step_ms)
        variant = next(iter(variants)) if len(variants) == 1 else ALL_VARIANTS
        if len(panes) == 1 and owned:
            total = panes[0]
        else:
            total = _Pane(self._min_ms, self._growth)
            for pane in panes:
                total.absorb(pane)
        return _summarize(
            total,
            model=model,
            version=version,
            variant=variant,
            start_ms=start_ms,
            end_ms=end_ms,
            seconds=(end_ms - effective_start) / 1000.0,
            min_ms=self._min_ms,
            growth=self._growth,
            step_offered_rps=sum(p.requests + p.shed for p in newest) * 1000.0 / self.step_ms,
        )

    def _window_sum(
        self, slot: tuple[Lane, WindowKey], held: dict[int, _Pane], first: int, end: int
    ) -> _Pane:
        sums = self._sums.get(slot)
        if (
            sums is None
            or not sums.front_start <= first < sums.front_end
            or end < sums.back_end
            or (self._horizon is not None and first < self._horizon)
        ):
            sums = self._sums[slot] = _SlotSums(held, first, end, self._zero, self._settle)
        return sums.window(held, first, end)


def _summarize(
    total: _Pane,
    *,
    model: str,
    version: str,
    variant: str,
    start_ms: int,
    end_ms: int,
    seconds: float,
    min_ms: float,
    growth: float,
    step_offered_rps: float = 0.0,
) -> WindowStats:
    """The stats of ``total``: a window's panes summed into a pane of its own, whose
    histograms the stats keep."""
    latency, queue, service = total.latency, total.queue, total.service
    requests, shed, batches = total.requests, total.shed, total.batches
    fallback_sum, fallback_count = total.queue_fallback_sum, total.queue_fallback_count
    queue_n = queue.count + fallback_count
    lag_by_worker = total.lag_by_worker
    p50, p95, p99 = latency.quantiles(_QUANTILES)
    service_p50, service_p95, service_p99 = service.quantiles(_QUANTILES)
    return WindowStats(
        model=model,
        version=version,
        variant=variant,
        window_start_ms=start_ms,
        window_end_ms=end_ms,
        requests=requests,
        errors=total.errors,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        mean_ms=latency.mean_ms,
        throughput_rps=requests / seconds if seconds > 0 else 0.0,
        queue_wait_mean_ms=(queue.sum_ms + fallback_sum) / queue_n if queue_n else 0.0,
        queue_wait_p99_ms=queue.quantile(0.99),
        batches=batches,
        device_load=total.device_load_sum / batches if batches else 0.0,
        lag=sum(lag for _, lag in lag_by_worker.values()),
        workers=len(lag_by_worker),
        service_p50_ms=service_p50,
        service_p95_ms=service_p95,
        service_p99_ms=service_p99,
        service=service if service.count else None,
        shed=shed,
        shed_rps=shed / seconds if seconds > 0 else 0.0,
        service_busy_ms=total.service_busy_ms,
        service_requests=total.service_requests,
        step_offered_rps=step_offered_rps,
        generation=_generation_stats(total.generation),
    )


def invalid_sample(sample: TelemetrySample, scheme: LatencyHistogram | None = None) -> str | None:
    """Why a decoded telemetry sample cannot enter the window, or ``None``.

    ``scheme``: the window's bucket scheme, which the sample's non-empty
    histograms must share (else merging them into the window would fail).
    """
    if scheme is not None:
        for name, h in (("latency", sample.latency), ("queue wait", sample.queue_wait)):
            if h.count and not h.same_scheme(scheme):
                return f"{name} histogram scheme ({h.min_ms}, {h.growth}) is not the window's"
    g = sample.generation
    if g is not None:
        for name, h in g.histograms():
            if scheme is not None and h.count and not h.same_scheme(scheme):
                return f"{name} histogram scheme ({h.min_ms}, {h.growth}) is not the window's"
        counts = (
            g.generations,
            g.prompt_tokens,
            g.generated_tokens,
            g.ended_by_model,
            g.waiting_sequences,
        )
        if min(counts) < 0 or g.ended_by_model > g.generations:
            return f"impossible generation counts in telemetry: {counts}"
        if not (math.isfinite(g.kv_cache_occupancy) and 0.0 <= g.kv_cache_occupancy <= 1.0):
            return f"KV-cache occupancy {g.kv_cache_occupancy} is outside 0..1"
    if not (sample.model and sample.version and sample.variant):
        return "telemetry without model, version or variant"
    if sample.completed_at_ms <= 0:
        return "telemetry without a completion time"
    if sample.error_count > sample.request_count:
        return f"{sample.error_count} errors for {sample.request_count} requests"
    numbers = (sample.compute_ms, sample.device_load, sample.queue_wait_mean_ms)
    if not all(math.isfinite(x) and x >= 0 for x in numbers):
        return f"non-finite or negative timing in telemetry: {numbers}"
    return None
