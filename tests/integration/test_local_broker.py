"""The real local Kafka broker (deploy/kafka/kafka.py): start/stop idempotence, status, probe.

These tests leave the shared broker RUNNING (other Kafka tests share it); the stop/start cycle
test runs a broker of its own (own local dir and ports) and never stops the shared one.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from graylane.deploy.kafka import broker as kafka_broker
from graylane.deploy.kafka import kafka as kt
from graylane.deploy.kafka import layout as kafka_layout
from graylane.deploy.kafka import process as kafka_process
from tests.support.brokers import PrivateBroker

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "deploy" / "kafka" / "kafka.py"

pytestmark = pytest.mark.kafka


def _cli(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def broker() -> str:
    """Start the shared broker if needed (already running is fine); it keeps running."""
    return kafka_broker.start()


@pytest.fixture
def own_broker_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point the tool (and its CLI subprocesses) at a private local dir and free ports."""
    for name, value in PrivateBroker.under(tmp_path).variables.items():
        monkeypatch.setenv(name, value)
    try:
        yield tmp_path
    finally:
        kafka_broker.stop()  # the private broker, found through the private local dir


def test_start_again_is_a_noop(broker: str, capsys: pytest.CaptureFixture[str]) -> None:
    pid = kafka_process.running_pid()
    assert pid is not None
    assert kafka_broker.start() == broker
    assert "already running" in capsys.readouterr().out
    assert kafka_process.running_pid() == pid


def test_status_reports_version(broker: str) -> None:
    ok, line = kafka_broker.status()
    assert ok, line
    assert line.startswith(f"Apache Kafka 4.0.1 running on {broker} (pid ")
    assert kafka_process.logged_version() == "4.0.1" == kafka_layout.KAFKA_VERSION
    cli = _cli("status")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert cli.stdout.strip() == line


def test_metadata_probe_answers(broker: str) -> None:
    host, port = broker.rsplit(":", 1)
    md = kt.probe(host, int(port))
    assert [(b.node_id, b.host, b.port) for b in md.brokers] == [(1, host, int(port))]
    assert md.controller_id == 1
    assert md.cluster_id


@pytest.mark.slow
def test_stop_stop_start_cycle_with_stale_pid(own_broker_env: Path) -> None:
    first = _cli("start")
    assert first.returncode == 0, first.stdout + first.stderr
    assert kafka_process.is_running()
    stopped = _cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    assert not kafka_process.is_running()

    again = _cli("stop")
    assert again.returncode == 0
    assert "not running" in again.stdout

    status = _cli("status")
    assert status.returncode == 1
    assert "not running" in status.stdout

    # A pid file left behind whose pid now belongs to a non-Kafka process.
    with subprocess.Popen(["sleep", "60"]) as impostor:
        try:
            kafka_layout.pid_file().write_text(f"{impostor.pid}\n")
            started = _cli("start")
            assert started.returncode == 0, started.stdout + started.stderr
            assert "removing stale pid file" in started.stdout
            assert "Apache Kafka 4.0.1 running on" in started.stdout
            assert impostor.poll() is None  # the impostor was not signalled
        finally:
            impostor.kill()
    assert kafka_process.is_running()
    assert kafka_process.running_pid() != impostor.pid
