"""Worker admission's cost per fetched cycle: plain deadline shedding against priority shedding.

Run from the repository root: ``python -m scripts.bench_admission``. Each row is one
overloaded cycle (deadlines 20-200 ms out, a batch of n rows priced 5 + 0.5 n ms,
priorities drawn evenly); both planners run side by side on the same cycle, and the
table prints their mean time per cycle and the ratio.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from graylane.engine_worker.admission import Candidate, admit, admit_by_priority
from graylane.services.gateway.admission import Priority

NOW = 1_000_000
SECONDS_EACH = 0.5


def _estimate(_position: int, n: int) -> float:
    return 5.0 + 0.5 * n


def _per_cycle_ms(run: Callable[..., object], *args: object) -> float:
    started, count = time.perf_counter(), 0
    while time.perf_counter() - started < SECONDS_EACH:
        run(*args)
        count += 1
    return (time.perf_counter() - started) / count * 1e3


def main() -> None:
    rng = random.Random(0)
    header = ("records", "batches", "shed", "admit ms", "priority ms", "ratio")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (8, 8, 6, 10, 12, 7), strict=True)))
    for rows, count in ((8, 4), (32, 4), (64, 4), (64, 8)):
        batches = [
            [
                Candidate(b * rows + i, NOW + rng.randint(20, 200), rng.choice(list(Priority)))
                for i in range(rows)
            ]
            for b in range(count)
        ]
        plain = _per_cycle_ms(admit, batches, NOW, _estimate)
        ranked = _per_cycle_ms(admit_by_priority, batches, NOW, _estimate)
        shed = len(admit_by_priority(batches, NOW, _estimate).shed)
        print(
            f"{rows * count:>8} {count:>8} {shed:>6} {plain:>10.3f} {ranked:>12.3f}"
            f" {ranked / plain:>6.0f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
