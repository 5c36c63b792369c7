"""``graylane bench chaos --quick`` end to end: its own broker (stopped and started again),
every service killed once, malformed records; the last line is the report (slow: ~4 min)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PHASES = ("worker_kill", "router_kill", "broker_outage", "policy_kill", "malformed")
FIELDS = ("acked", "answered", "lost", "duplicates", "recovery_s", "services_alive")


@pytest.mark.timeout(600)
def test_quick_chaos_bench_reports_every_phase(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAYLANE_KAFKA_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "graylane.app.cli.main",
            "bench",
            "chaos",
            "--quick",
            # a lighter steady load than the bench's half of capacity (about 120 req/s
            # here): the same faults and checks, at a fraction of the CPU beside the
            # other tests; hundreds of requests are still in flight through each fault
            "--max-rate",
            "50",
            "--work-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    assert set(report["phases"]) == set(PHASES)
    for name, phase in report["phases"].items():
        assert set(FIELDS) <= set(phase), name
        assert phase["acked"] >= phase["answered"], name
        assert phase["answered"] > 0, f"{name}: no request was answered at all"
        # Whatever the fault, no acknowledged request goes unanswered, results flow again,
        # and every service is alive when the phase ends (a killed one was restarted).
        assert phase["lost"] == 0, (name, phase)
        assert phase["recovery_s"] is not None, f"{name}: results never flowed again"
        assert phase["services_alive"], (name, report["dead_at_phase_end"])
    # The restarted policy engine went on from the step the killed one stood at, and decided.
    assert report["rollout_resumed_same_step"] is True, (
        report["policy_before"],
        report["policy_after"],
    )
    assert report["policy_decides_again_s"] is not None
    # After the outage the same client instance was acknowledged again (no new client).
    assert report["same_client_recovered"] is True, report["client_resumed_after_outage_s"]
    assert report["capacity_rps"] > 0 and 0 < report["rate_rps"] <= report["capacity_rps"]
    assert "phase" in done.stdout and "broker_outage" in done.stdout  # the table
    # the broker, its data and the services are gone
    assert not (tmp_path / "broker" / "kafka" / "data").exists()
