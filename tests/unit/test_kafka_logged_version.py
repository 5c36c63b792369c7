"""The broker's version, read from its log even after log4j rolled it (pure files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.deploy.kafka.layout import server_log
from graylane.deploy.kafka.process import logged_version

LINE = "[2026-12-06 03:00:00,000] INFO Kafka version: {} (AppInfoParser)\n"


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRAYLANE_LOCAL_DIR", str(tmp_path))
    path = server_log()
    path.parent.mkdir(parents=True)
    return path


def test_the_version_is_read_from_the_log_or_the_files_it_rolled_into(log: Path) -> None:
    assert logged_version() is None  # no log yet
    log.write_text("noise\n" + LINE.format("3.9.0") + "noise\n")
    assert logged_version() == "3.9.0"
    # A restart: the new version is logged past the old log's end.
    since = log.stat().st_size
    with log.open("a") as fh:
        fh.write(LINE.format("4.0.1"))
    assert logged_version(since) == "4.0.1"
    # log4j rolls the log at 10 MB: the startup lines move to server.log.1, older ones on.
    log.rename(log.with_name("server.log.2"))
    log.with_name("server.log.1").write_text(LINE.format("4.0.1") + "x" * 100 + "\n")
    log.write_text("after the roll\n")
    assert logged_version() == "4.0.1"
    # It rolled during a start that began at byte 5 of the old log.
    assert logged_version(since=5_000) is None  # past the end of server.log.1 as well
    assert logged_version(since=len(LINE.format("4.0.1"))) is None  # before the roll's end
    log.with_name("server.log.1").write_text("x" * 50 + LINE.format("4.1.0"))
    assert logged_version(since=40) == "4.1.0"
