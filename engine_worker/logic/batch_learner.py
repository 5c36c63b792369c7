"""Adaptive batch size and queue delay, learned from the worker's own batches.

Pure logic: the worker reports each forward batch it ran (rows, padded length,
milliseconds); the learner keeps the recent cost per row of every batch size it
has seen and chooses the cap and the wait (a Triton-style ``max_queue_delay``
that adapts) that maximise throughput within the latency budget. A larger
batch is chosen only when it is measurably cheaper per row, so an engine that
does not gain from batching converges to batch 1 with no wait.

Robust to a shared, noisy machine: estimates are medians of a window of recent
samples, and sizes are compared by *paired* cost: a size explored now is
divided by the cost the size in use has right now, so a load that slows every
size alike cancels out instead of making a stale estimate look cheap.
Exploration runs one batch at a time, between batches of the size in use.

Cost is normalised by the padded length (ms per row per token), so batches
from different sequence buckets inform the same estimate.

With a queue waiting, a cycle's own cost counts too. The worker reports each
cycle's time outside its batches (fetch, decode, planning, commit:
:meth:`BatchLearner.observe_cycle`); the learner fits it as a cost per batch plus
a cost per row (least squares over recent cycles) and, when at least a batch of
rows is already queued (:meth:`BatchLearner.choose` with ``backlog``), takes the
largest size whose cost per row, that per-batch share included, is within
``min_gain`` of the cheapest: the rows are there, so a larger batch costs them no
wait, and each batch fewer saves its fixed cost. An empty queue keeps the choice
above (batch 1 with no wait when the engine does not gain from batching).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

from graylane.errors import GraylaneError

__all__ = [
    "CYCLES_MIN",
    "PAIRED_MIN",
    "PAIR_SAMPLES",
    "BatchChoice",
    "BatchLearner",
    "CycleCost",
    "LearnerConfig",
    "LearnerConfigError",
    "fit_cycle_cost",
]


class LearnerConfigError(GraylaneError, ValueError):
    """A learner configuration is malformed."""


@dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """Bounds and tuning of :class:`BatchLearner`."""

    max_batch_size: int
    """Hard cap (the worker's ``--max-batch``)."""
    max_wait_ms: float
    """Longest the learner may ever wait for a batch to fill."""
    latency_budget_ms: float = 0.0
    """Engine time one batch may take at the longest padded length; 0 = no budget."""
    window: int = 15
    """Recent samples per size whose median is its estimate."""
    min_gain: float = 0.1
    """A larger size must serve at least this much more per second to be chosen."""
    min_samples: int = 3
    """Samples a size needs before its estimate is trusted."""
    explore_every: int = 6
    """Every n-th batch is one batch of another candidate size (no wait), to keep measuring."""
    cycle_window: int = 30
    """Recent cycles the per-batch overhead is fitted over."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise LearnerConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0 or self.latency_budget_ms < 0:
            raise LearnerConfigError("max_wait_ms and latency_budget_ms must be >= 0")
        if self.window < 1:
            raise LearnerConfigError(f"window must be >= 1, got {self.window}")
        if self.min_gain < 0 or self.min_samples < 1 or self.explore_every < 1:
            raise LearnerConfigError("min_gain >= 0, min_samples >= 1, explore_every >= 1")
        if self.cycle_window < 2:
            raise LearnerConfigError(f"cycle_window must be >= 2, got {self.cycle_window}")


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """What the fetch loop and the planner use for the next cycle."""

    max_batch: int
    """Rows per planned batch (for an exploring choice: of the cycle's first batch)."""
    wait_ms: float
    """How long to wait after the first record for the batch to fill."""
    exploring: bool = False
    then: int = 0
    """Exploring: rows per batch for the rest of the cycle (0 = ``max_batch``)."""

    @property
    def steady_batch(self) -> int:
        return self.then or self.max_batch


PAIR_SAMPLES = 3
"""Latest samples of the size in use that an explored sample is divided by."""
PAIRED_MIN = 6
"""Paired samples a size needs before it may replace the size in use."""
CYCLES_MIN = 4
"""Cycles the overhead fit needs before it is used."""


@dataclass(frozen=True, slots=True)
class CycleCost:
    """A cycle's time outside its batches, fitted as ``per_batch_ms`` per batch plus
    ``per_row_ms`` per row (both >= 0)."""

    per_batch_ms: float
    per_row_ms: float


def fit_cycle_cost(cycles: Sequence[tuple[int, int, float]]) -> CycleCost:
    """Least squares of ``outside_ms = a * batches + b * rows`` over ``(batches, rows,
    outside_ms)`` samples, with ``a, b >= 0``.

    When batches and rows do not vary apart (every cycle ran the same batch size),
    the two cannot be told apart and all of it is charged per row: the fit then
    claims no saving from larger batches.
    """
    sbb = sum(float(b) * b for b, _, _ in cycles)
    srr = sum(float(r) * r for _, r, _ in cycles)
    sbr = sum(float(b) * r for b, r, _ in cycles)
    sby = sum(b * y for b, _, y in cycles)
    sry = sum(r * y for _, r, y in cycles)
    det = sbb * srr - sbr * sbr
    if srr <= 0:
        return CycleCost(0.0, 0.0)
    per_row_only = CycleCost(0.0, max(0.0, sry / srr))
    if det <= 1e-9 * sbb * srr:
        return per_row_only
    a = (sby * srr - sry * sbr) / det
    b = (sbb * sry - sbr * sby) / det
    if a < 0:
        return per_row_only
    if b < 0:
        return CycleCost(max(0.0, sby / sbb), 0.0)
    return CycleCost(a, b)


@dataclass(slots=True)
class _SizeStats:
    recent: deque[float]
    """Latest ms per row per padded token."""
    samples: int = 0

    @property
    def cost(self) -> float:
        return median(self.recent)


@dataclass
class BatchLearner:
    """Learns the throughput-optimal batch cap and wait from observed batches."""

    config: LearnerConfig
    reference_len: int = 64
    """Padded length at which estimates are reported in ms (and the budget is checked)."""
    _stats: dict[int, _SizeStats] = field(default_factory=dict)
    _relative: dict[int, deque[float]] = field(default_factory=dict)
    """Per size: its per-row cost divided by the in-use size's at the time."""
    _in_use: int = 0
    """The size exploited now (0 until every candidate is measured)."""
    _batches: int = 0
    _explored_at: int = 0
    """Batch count at the last periodic exploration."""
    _turn: int = 0
    _challenger: int = 0
    """A size that beat the one in use once; it must win again on fresh samples."""
    _cycles: deque[tuple[int, int, float]] = field(default_factory=deque)
    """Recent cycles: (batches, rows, ms outside the batches)."""

    def observe_cycle(self, batches: int, rows: int, outside_ms: float) -> None:
        """Record one cycle of ``batches`` forward batches and ``rows`` rows that took
        ``outside_ms`` outside those batches (fetch, decode, planning, commit)."""
        if batches < 1 or rows < batches or outside_ms < 0:
            return
        self._cycles.append((batches, rows, outside_ms))
        while len(self._cycles) > self.config.cycle_window:
            self._cycles.popleft()

    def cycle_cost(self) -> CycleCost | None:
        """The fitted cost of a cycle outside its batches; None until enough cycles."""
        if len(self._cycles) < CYCLES_MIN:
            return None
        return fit_cycle_cost(self._cycles)

    def queued_size(self, backlog: int, best: int) -> int:
        """With ``backlog`` rows waiting: the largest candidate size up to the backlog whose
        cost per row (engine and its own sends, plus the fitted per-batch share of the
        cycle) is within ``min_gain`` of the cheapest size's, within the budget; ``best``
        when no larger one qualifies."""
        cfg = self.config
        per_batch = (self.cycle_cost() or CycleCost(0.0, 0.0)).per_batch_ms
        costs: dict[int, float] = {}
        for size in self.candidates():
            total = self.batch_ms(size)
            if size > max(backlog, 1) or total is None or total <= 0:
                continue
            if cfg.latency_budget_ms and size > 1 and total > cfg.latency_budget_ms:
                continue
            costs[size] = (total + per_batch) / size
        if not costs:
            return best
        cheapest = min(costs.values())
        fits = [n for n, c in costs.items() if c <= cheapest * (1 + cfg.min_gain)]
        return max(best, *fits)

    def observe(self, size: int, compute_ms: float, padded_len: int) -> None:
        """Record one forward batch of ``size`` rows padded to ``padded_len`` tokens."""
        if size < 1 or padded_len < 1 or compute_ms < 0:
            return
        size = min(size, self.config.max_batch_size)
        per_row = compute_ms / (size * padded_len)
        base = self._stats.get(self._in_use)
        if size != self._in_use and base is not None and per_row > 0:
            now = median(list(base.recent)[-PAIR_SAMPLES:])
            if now > 0:
                self._window(self._relative, size).append(per_row / now)
        stats = self._stats.get(size)
        if stats is None:
            stats = self._stats[size] = _SizeStats(deque(maxlen=self.config.window))
        stats.recent.append(per_row)
        stats.samples += 1
        self._batches += 1

    def _window(self, table: dict[int, deque[float]], size: int) -> deque[float]:
        if size not in table:
            table[size] = deque(maxlen=self.config.window)
        return table[size]

    def batch_ms(self, size: int) -> float | None:
        """Estimated ms for one batch of ``size`` rows at the reference length."""
        stats = self._stats.get(size)
        if stats is None or stats.samples < self.config.min_samples:
            return None
        return stats.cost * size * self.reference_len

    def estimate_ms(self, rows: int, padded_len: int) -> float | None:
        """Predicted ms for ``rows`` rows at ``padded_len``: that size's estimate, else the
        per-row cost of the nearest measured size; None while nothing is measured."""
        trusted = [n for n, st in self._stats.items() if st.samples >= self.config.min_samples]
        if rows < 1 or not trusted:
            return None
        nearest = min(trusted, key=lambda n: (abs(n - rows), n))
        return self._stats[nearest].cost * rows * padded_len

    def per_row_ms(self, size: int) -> float | None:
        """Estimated ms per row in batches of ``size`` at the reference length."""
        total = self.batch_ms(size)
        return None if total is None else total / size

    def relative_cost(self, size: int) -> float | None:
        """Per-row cost of ``size`` relative to the size in use (1.0 for that one).

        The median of paired samples; None until there are ``min_samples`` of them.
        Before any size is in use, absolute costs compare.
        """
        if self.batch_ms(size) is None:
            return None
        if not self._in_use or self.batch_ms(self._in_use) is None:
            return self._stats[size].cost
        if size == self._in_use:
            return 1.0
        paired = self._relative.get(size)
        if paired is None or len(paired) < max(self.config.min_samples, PAIRED_MIN):
            return None
        return median(paired)

    def best_size(self) -> int:
        """The candidate size with the highest throughput within the budget (1 until one
        is known). Other sizes (a cycle's remainder) inform estimates, not the choice."""
        budget = self.config.latency_budget_ms
        best, best_rps = 1, 0.0
        for size in self.candidates():
            total = self.batch_ms(size)
            cost = self.relative_cost(size)
            if total is None or total <= 0 or cost is None or cost <= 0:
                continue
            if budget and size > 1 and total > budget:
                continue
            if size == self._in_use:
                cost *= 1 - self.config.min_gain / 2  # hysteresis: noise does not flap it
            rps = 1.0 / cost
            if best_rps == 0.0 or rps > best_rps * (1 + self.config.min_gain):
                best, best_rps = size, rps
        return best

    def _use(self, size: int) -> None:
        """Make ``size`` the size in use. Paired costs start afresh against it: rescaled
        old ones would carry the noise that made it win, and keep it."""
        if size != self._in_use:
            if not self._in_use:
                self._explored_at = self._batches  # everything was just measured
            self._in_use = size
            self._relative.clear()

    def _confirmed(self, best: int) -> int:
        """``best`` if it is in use or has now won twice in a row, else the size in use.

        A first win drops the winner's paired samples, and it is chosen only if
        it wins again on fresh ones: one lucky window (the winner's curse) changes
        nothing.
        """
        if not self._in_use:
            return best
        if self._challenger:
            if self.relative_cost(self._challenger) is None:
                return self._in_use  # still measuring it afresh
            challenger, self._challenger = self._challenger, 0
            if best == challenger:
                return best
        if best != self._in_use:
            self._challenger = best
            self._relative.pop(best, None)
        return self._in_use

    def candidates(self) -> tuple[int, ...]:
        """Sizes the learner measures: 1, 2, 4, ... and the cap."""
        sizes, n = [], 1
        while n < self.config.max_batch_size:
            sizes.append(n)
            n *= 2
        sizes.append(self.config.max_batch_size)
        return tuple(sizes)

    def choose(self, backlog: int = 0) -> BatchChoice:
        """Cap and wait for the next cycle (``backlog``: rows already waiting).

        While a candidate size is unmeasured, the cap is that candidate with no
        wait: taking what is already queued costs nothing. Once all are
        measured, every ``explore_every``-th batch one batch of another
        candidate (in rotation) runs first, then the size in use (``then``).
        Otherwise, with more than :meth:`best_size` rows waiting, the cap is
        :meth:`queued_size` with no wait (the rows are there). Else the cap is
        :meth:`best_size`, and the wait is positive only when that is above 1: at
        most the configured wait, the budget's slack, and one row's unbatched time
        (waiting longer loses to serving it alone).
        """
        cfg = self.config
        sizes = self.candidates()
        for size in sizes:
            if self.batch_ms(size) is None:
                return BatchChoice(size, 0.0, exploring=True, then=cfg.max_batch_size)
        best = self._confirmed(self.best_size())
        self._use(best)
        others = [s for s in sizes if s != best]
        if others and self._batches - self._explored_at >= cfg.explore_every:
            self._explored_at = self._batches
            self._turn += 1
            size = others[self._turn % len(others)]
            steady = self.queued_size(backlog, best) if backlog > best else best
            return BatchChoice(size, 0.0, exploring=True, then=steady)
        if backlog > best:
            queued = self.queued_size(backlog, best)
            if queued > best:
                return BatchChoice(queued, 0.0)
        if best == 1:
            return BatchChoice(1, 0.0)
        wait = cfg.max_wait_ms
        single = self.batch_ms(1)
        if single is not None:
            wait = min(wait, single)
        total = self.batch_ms(best)
        if cfg.latency_budget_ms and total is not None:
            wait = min(wait, max(0.0, cfg.latency_budget_ms - total))
        return BatchChoice(best, max(0.0, wait))
