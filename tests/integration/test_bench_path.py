"""``graylane bench path`` with a small queue on the local broker: every drain runs, and
the last line holds the figures the path's cost is judged by."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from graylane.app.bench.path_cost import (
    Drain,
    DrainFigures,
    EngineFigures,
    cpu_seconds,
    mean_batch,
)
from tests.conftest import ROOT

KEYS = (
    "path_rps",
    "engine_rps_b1",
    "engine_rps_bmax",
    "kafka_two_hop_rps",
    "router_cpu_us_per_req",
    "worker_cpu_us_per_req",
    "broker_cpu_us_per_req",
    "mean_batch",
)


def test_cpu_seconds_reads_a_proc_stat_line() -> None:
    # a process name with a space and a parenthesis, as /proc writes it
    fields = ["S"] + ["0"] * 10 + ["250", "50"] + ["0"] * 30
    line = "4242 (python (x) y) " + " ".join(fields)
    assert cpu_seconds(line) == pytest.approx(300 / os.sysconf("SC_CLK_TCK"))


def test_figures_per_request() -> None:
    drain = DrainFigures(Drain.PATH, 2000, 4.0, {"worker": 2.0}, (32, 32, 16))
    assert drain.rps == 500.0
    assert drain.cpu_us_per_req("worker") == pytest.approx(1000.0)
    assert drain.cpu_us_per_req("broker") is None
    assert mean_batch(drain.batches) == pytest.approx(80 / 3)
    assert mean_batch(()) == 0.0
    engine = EngineFigures({1: 0.5, 8: 2.0, 32: 6.4})
    assert engine.rps(32) == pytest.approx(5000.0)
    assert engine.us_per_req(24.0) == pytest.approx(200.0)  # nearest measured: 32
    assert engine.us_per_req(1.2) == pytest.approx(500.0)


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_path_prints_its_figures(kafka_bootstrap: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "graylane.app.cli.main",
            "bench",
            "path",
            "--queue",
            "300",
            "--max-batch",
            "8",
            "--engine-seconds",
            "0.2",
        ],
        cwd=ROOT,
        env={**os.environ, "GRAYLANE_BOOTSTRAP_SERVERS": kafka_bootstrap},
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    for key in KEYS:
        assert key in figures, key
    for key in ("path_rps", "engine_rps_b1", "engine_rps_bmax", "kafka_two_hop_rps"):
        assert figures[key] > 0, key
    assert figures["router_alone_rps"] > 0 and figures["worker_alone_rps"] > 0
    assert figures["kafka_two_hop_rps_aiokafka"] > 0
    assert figures["router_cpu_us_per_req"] > 0 and figures["worker_cpu_us_per_req"] > 0
    assert figures["broker_cpu_us_per_req"] is None or figures["broker_cpu_us_per_req"] >= 0
    # every request was served in some batch of at most the cap
    assert 1 <= figures["mean_batch"] <= 8
    sizes = {int(k): n for k, n in figures["batch_sizes"].items()}
    assert max(sizes) <= 8 and sum(k * n for k, n in sizes.items()) >= 300  # at least once
    # progress while it ran, and the table before the JSON
    assert any("drained" in line or "req/s" in line for line in lines[:-1])
    assert any(line.startswith("router+worker") for line in lines[:-1])
