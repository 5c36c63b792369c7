"""``graylane bench admission``: both planners timed on the same cycles, one JSON line."""

from __future__ import annotations

import json

import pytest

from graylane.app.bench.admission import SHAPES, AdmissionBenchConfig, main, measure


def test_every_cycle_shape_is_timed_for_both_planners() -> None:
    rows = measure(AdmissionBenchConfig(seconds_each=0.001))
    assert [(r.records, r.batches) for r in rows] == [(n * b, b) for n, b in SHAPES]
    for row in rows:
        assert row.admit_ms > 0 and row.priority_ms > 0
        assert 0 < row.shed < row.records  # overloaded cycles: some shed, not all


def test_the_same_seed_draws_the_same_cycles() -> None:
    first = [r.shed for r in measure(AdmissionBenchConfig(seconds_each=0.001, seed=3))]
    again = [r.shed for r in measure(AdmissionBenchConfig(seconds_each=0.001, seed=3))]
    assert first == again


def test_the_last_line_is_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(AdmissionBenchConfig(seconds_each=0.001)) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == [
        "records",
        "batches",
        "shed",
        "admit",
        "ms",
        "priority",
        "ms",
        "ratio",
    ]
    cycles = json.loads(lines[-1])["cycles"]
    assert len(cycles) == len(SHAPES) == len(lines) - 2
    assert all(c["ratio"] == pytest.approx(c["priority_ms"] / c["admit_ms"]) for c in cycles)
