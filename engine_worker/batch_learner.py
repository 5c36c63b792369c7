"""Adaptive batch size and queue delay, learned from the worker's own batches.

Pure logic: the worker reports each forward batch it ran (rows, padded length,
engine milliseconds); the learner keeps a smoothed cost per row for every batch
size it has seen and chooses the cap and the wait (a Triton-style
``max_queue_delay`` that adapts) that maximise throughput within the latency
budget. A larger batch is chosen only when it is measurably cheaper per row, so
an engine that does not gain from batching converges to batch 1 with no wait.

Cost is normalised by the padded length (ms per row per token), so batches
from different sequence buckets inform the same estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class LearnerConfigError(ValueError):
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
    smoothing: float = 0.2
    """Weight of a new sample in the moving average of a size's cost."""
    min_gain: float = 0.1
    """A larger size must serve at least this much more per second to be chosen."""
    min_samples: int = 3
    """Samples a size needs before its estimate is trusted."""
    explore_every: int = 32
    """Every n-th batch may run up to ``max_batch_size`` (without waiting) to keep measuring."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise LearnerConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0 or self.latency_budget_ms < 0:
            raise LearnerConfigError("max_wait_ms and latency_budget_ms must be >= 0")
        if not 0 < self.smoothing <= 1:
            raise LearnerConfigError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if self.min_gain < 0 or self.min_samples < 1 or self.explore_every < 1:
            raise LearnerConfigError("min_gain >= 0, min_samples >= 1, explore_every >= 1")


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """What the fetch loop and the planner use for the next cycle."""

    max_batch: int
    """Rows per planned batch."""
    wait_ms: float
    """How long to wait after the first record for the batch to fill."""
    exploring: bool = False


@dataclass(slots=True)
class _SizeStats:
    cost: float = 0.0
    """Smoothed ms per row per padded token."""
    samples: int = 0


@dataclass
class BatchLearner:
    """Learns the throughput-optimal batch cap and wait from observed batches."""

    config: LearnerConfig
    reference_len: int = 64
    """Padded length at which estimates are reported in ms (and the budget is checked)."""
    _stats: dict[int, _SizeStats] = field(default_factory=dict)
    _batches: int = 0

    def observe(self, size: int, compute_ms: float, padded_len: int) -> None:
        """Record one forward batch of ``size`` rows padded to ``padded_len`` tokens."""
        if size < 1 or padded_len < 1 or compute_ms < 0:
            return
        size = min(size, self.config.max_batch_size)
        per_row = compute_ms / (size * padded_len)
        stats = self._stats.setdefault(size, _SizeStats())
        if stats.samples == 0:
            stats.cost = per_row
        else:
            a = self.config.smoothing
            stats.cost = (1 - a) * stats.cost + a * per_row
        stats.samples += 1
        self._batches += 1

    def batch_ms(self, size: int) -> float | None:
        """Estimated engine ms for one batch of ``size`` rows at the reference length."""
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
        """Estimated engine ms per row in batches of ``size`` at the reference length."""
        total = self.batch_ms(size)
        return None if total is None else total / size

    def best_size(self) -> int:
        """The size with the highest throughput within the budget (1 until one is known)."""
        budget = self.config.latency_budget_ms
        best, best_rps = 1, 0.0
        for size in sorted(self._stats):
            total = self.batch_ms(size)
            if total is None or total <= 0:
                continue
            if budget and size > 1 and total > budget:
                continue
            rps = size / total
            if best_rps == 0.0 or rps > best_rps * (1 + self.config.min_gain):
                best, best_rps = size, rps
        return best

    def candidates(self) -> tuple[int, ...]:
        """Sizes the learner measures: 1, 2, 4, ... and the cap."""
        sizes, n = [], 1
        while n < self.config.max_batch_size:
            sizes.append(n)
            n *= 2
        sizes.append(self.config.max_batch_size)
        return tuple(sizes)

    def choose(self) -> BatchChoice:
        """Cap and wait for the next cycle.

        While a candidate size is unmeasured, and on every ``explore_every``-th
        batch (in rotation), the cap is that candidate with no wait: taking what
        is already queued costs nothing and keeps every estimate fresh.
        Otherwise the cap is :meth:`best_size`, and the wait is positive only
        when that is above 1: at most the configured wait, the budget's slack,
        and one row's unbatched time (waiting longer loses to serving it alone).
        """
        cfg = self.config
        sizes = self.candidates()
        for size in sizes:
            if self.batch_ms(size) is None:
                return BatchChoice(size, 0.0, exploring=True)
        if self._batches % cfg.explore_every == 0:
            turn = self._batches // cfg.explore_every
            return BatchChoice(sizes[turn % len(sizes)], 0.0, exploring=True)
        best = self.best_size()
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
