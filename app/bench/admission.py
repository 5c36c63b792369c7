"""``graylane bench admission``: a worker's admission cost per fetched cycle.

Plain deadline shedding (:func:`admit`) against priority shedding
(:func:`admit_by_priority`), side by side on the same overloaded cycles: deadlines
20-200 ms out, a batch of n rows priced 5 + 0.5 n ms, priorities drawn evenly. The
table prints each planner's mean time per cycle and their ratio; the last line is one
JSON object. No broker, no engine: the planners are pure.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from graylane.engine_worker.logic.admission import (
    AdmissionPlan,
    Candidate,
    admit,
    admit_by_priority,
)
from graylane.priority import Priority

__all__ = ["AdmissionBenchConfig", "AdmissionRow", "main", "measure"]

NOW_MS = 1_000_000
SHAPES: tuple[tuple[int, int], ...] = ((8, 4), (32, 4), (64, 4), (64, 8))
"""(rows per batch, batches per cycle)."""


@dataclass(frozen=True)
class AdmissionBenchConfig:
    seconds_each: float = 0.5
    """How long each planner is timed on each cycle shape."""
    seed: int = 0


@dataclass(frozen=True)
class AdmissionRow:
    records: int
    batches: int
    shed: int
    """Records priority shedding drops in this cycle."""
    admit_ms: float
    priority_ms: float

    @property
    def ratio(self) -> float:
        return self.priority_ms / self.admit_ms


def _estimate(_position: int, n: int) -> float:
    return 5.0 + 0.5 * n


Planner = Callable[..., object]


def _per_cycle_ms(plan: Planner, batches: list[list[Candidate[int]]], seconds: float) -> float:
    started, count = time.perf_counter(), 0
    while count == 0 or time.perf_counter() - started < seconds:
        plan(batches, NOW_MS, _estimate)
        count += 1
    return (time.perf_counter() - started) / count * 1e3


def measure(cfg: AdmissionBenchConfig) -> list[AdmissionRow]:
    rng = random.Random(cfg.seed)
    rows: list[AdmissionRow] = []
    for size, count in SHAPES:
        batches = [
            [
                Candidate(b * size + i, NOW_MS + rng.randint(20, 200), rng.choice(list(Priority)))
                for i in range(size)
            ]
            for b in range(count)
        ]
        plan: AdmissionPlan[int] = admit_by_priority(batches, NOW_MS, _estimate)
        rows.append(
            AdmissionRow(
                records=size * count,
                batches=count,
                shed=len(plan.shed),
                admit_ms=_per_cycle_ms(admit, batches, cfg.seconds_each),
                priority_ms=_per_cycle_ms(admit_by_priority, batches, cfg.seconds_each),
            )
        )
    return rows


def table(rows: Sequence[AdmissionRow]) -> str:
    widths = (8, 8, 6, 10, 12, 7)
    header = ("records", "batches", "shed", "admit ms", "priority ms", "ratio")
    lines = [" ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True))]
    lines += [
        f"{r.records:>8} {r.batches:>8} {r.shed:>6} {r.admit_ms:>10.3f} {r.priority_ms:>12.3f}"
        f" {r.ratio:>6.1f}x"
        for r in rows
    ]
    return "\n".join(lines)


def main(cfg: AdmissionBenchConfig) -> int:
    rows = measure(cfg)
    print(table(rows), flush=True)
    print(json.dumps({"cycles": [asdict(r) | {"ratio": r.ratio} for r in rows]}))
    return 0
