"""``graylane bench policy-scale`` at a small size, end to end on the local broker: the real
policy-engine process judges synthetic telemetry, and every injected regression is rolled
back and measured (the figures themselves are the bench's to report, not asserted here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

REPORT = (
    "max_models_one_instance",
    "cpu_us_per_record",
    "tick_ms_p99_at_max",
    "decision_latency_ms_p99_at_max",
    "instances_scaling",
)


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_quick_policy_scale_bench_rolls_back_every_injected_regression(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    plot = tmp_path / "policy-scale.png"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "graylane.app.cli.main",
            "bench",
            "policy-scale",
            "--sizes",
            "8",
            "--instances",
            "1,2",
            "--measure-s",
            "6",
            "--regressions",
            "2",
            "--window-ms",
            "4000",
            "--plot",
            str(plot),
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
    report = json.loads(lines[-1])
    assert all(k in report for k in REPORT), report
    sizes = report["sizes"]
    assert [(s["instances"], s["models"]) for s in sizes] == [(1, 8), (2, 8)]
    for s in sizes:
        assert s["missed"] == 0, s  # every regression rolled back, none lost
        assert s["decision_ms_p99"] is not None and s["detection_ms_p99"] is not None, s
        assert s["records_per_s"] > 0 and s["cpu_us_per_record"] > 0, s
    # Two sharded instances, one killed (-9) after each size: its models are decided by
    # the survivor from the step they were at, no model by two instances in one
    # generation, and a regression injected into a moved model is rolled back.
    assert sizes[0]["takeover"] is None
    takeover = sizes[1]["takeover"]
    assert takeover is not None and takeover["clean"], takeover
    assert takeover["lost"] == 0 and takeover["double_deciders"] == 0, takeover
    assert takeover["models_moved"] > 0 and takeover["missed_after"] == 0, takeover
    assert report["instances_scaling"]["2"]["takeover_clean"] is True, report
    assert any(line.lstrip().startswith("inst") for line in lines), "no table"
    assert plot.stat().st_size > 0
