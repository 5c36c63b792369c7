"""Which build a process runs: from the image's variables, else from its git checkout."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from graylane.policy_engine.messages import RecordSkipped, RecordSource, SkipReason
from graylane.policy_engine.wire import records_of, running_build_of
from graylane.running_build import BuildSource, RunningBuild, read_build
from graylane.settings import Settings
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2

ROOT = Path(__file__).resolve().parents[2]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "a.txt").write_text("one\n")
    _git(root, "add", "a.txt")
    env = ("-c", "user.name=t", "-c", "user.email=t@example.org")
    subprocess.run(
        ["git", "-C", str(root), *env, "commit", "-q", "-m", "one", "--date", "@1767225600"],
        check=True,
        env={"GIT_COMMITTER_DATE": "@1767225600", "PATH": "/usr/bin:/bin"},
    )
    return root


def test_the_image_variables_win(tmp_path: Path) -> None:
    build = read_build(
        {"GRAYLANE_GIT_SHA": "0123abc", "GRAYLANE_BUILD_TIME": "2026-12-01T10:00:00Z"},
        _repo(tmp_path),
    )
    assert build == RunningBuild(
        git_sha="0123abc", build_time="2026-12-01T10:00:00Z", source=BuildSource.IMAGE
    )


def test_a_checkout_names_its_commit_and_the_commits_time_and_says_when_it_differs(
    tmp_path: Path,
) -> None:
    root = _repo(tmp_path)
    head = _git(root, "rev-parse", "HEAD")
    clean = read_build({"GRAYLANE_GIT_SHA": "unknown"}, root)  # an image built without it
    assert clean == RunningBuild(
        git_sha=head, build_time="2026-01-01T00:00:00Z", source=BuildSource.CHECKOUT
    )
    (root / "untracked.log").write_text("caches do not count\n")
    assert read_build({}, root).git_sha == head
    (root / "a.txt").write_text("two\n")
    assert read_build({}, root).git_sha == f"{head}-dirty"


def test_no_image_and_no_checkout_is_unknown(tmp_path: Path) -> None:
    assert read_build({}, tmp_path) == RunningBuild()


def test_settings_log_and_export_the_checkouts_commit() -> None:
    settings = Settings.from_env({})
    head = _git(ROOT, "rev-parse", "HEAD")
    assert settings.git_sha.removesuffix("-dirty") == head
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", settings.build_time)
    labels = settings.build_labels()
    assert (labels.git_sha, labels.build_time) == (settings.git_sha, settings.build_time)


def test_graylane_version_prints_the_commit_and_the_build_time() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "graylane.app.cli.main", "--version"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("graylane ")
    assert lines[1].removeprefix("commit ").removesuffix("-dirty") == _git(
        ROOT, "rev-parse", "HEAD"
    )
    assert re.match(r"built \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(checkout\)", lines[2]), lines


def test_every_audit_record_names_the_build_that_decided() -> None:
    build = running_build_of(
        version="0.1.0", git_sha="0123abc", build_time="2026-12-01T10:00:00Z", instance="p-1"
    )
    skipped = RecordSkipped(
        source=RecordSource.ROLLOUTS,
        reason=SkipReason.UNDECODABLE,
        detail="not a record",
        at_ms=1,
        model="m",
    )
    (record,) = records_of([skipped], TopicLayout(prefix="t"), decided_by=build)
    audit = audit_pb2.AuditRecord.FromString(record.value)
    assert audit.decided_by == build
    (unstamped,) = records_of([skipped], TopicLayout(prefix="t"))
    assert not audit_pb2.AuditRecord.FromString(unstamped.value).HasField("decided_by")
