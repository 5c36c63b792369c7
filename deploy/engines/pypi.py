"""Pinned files from PyPI, through pip itself, kept in the cache and checked by sha256."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from graylane.deploy.engines.layout import (
    EngineSetupError,
    PinnedDistribution,
    downloads_dir,
    file_lock,
    say,
    sha256_file,
    verify_sha256,
)

__all__ = ["download", "download_command", "downloaded_path", "is_downloaded"]


def downloaded_path(dist: PinnedDistribution) -> Path:
    return downloads_dir() / dist.filename


def is_downloaded(dist: PinnedDistribution) -> bool:
    """True when the file is in the cache with its pinned digest (the file is hashed)."""
    path = downloaded_path(dist)
    return path.is_file() and sha256_file(path) == dist.sha256


def download_command(dist: PinnedDistribution, dest: Path) -> list[str]:
    """``pip download`` of exactly this file: no dependencies; an sdist for sources."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off"]
    if dist.source:
        name = dist.requirement.split("==", 1)[0]
        cmd += ["--no-binary", name]
    return [*cmd, "--dest", str(dest), dist.requirement]


def download(dist: PinnedDistribution) -> Path:
    """The cached file, downloaded with pip when missing. A digest other than the pinned
    one is an error, never a file used."""
    path = downloaded_path(dist)
    if path.is_file():
        return verify_sha256(path, dist.sha256)
    with file_lock(downloads_dir() / f".{dist.filename}.lock", f"downloading {dist.filename}"):
        if path.is_file():
            return verify_sha256(path, dist.sha256)
        return _download_locked(dist, path)


def _download_locked(dist: PinnedDistribution, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".pip-", dir=path.parent))
    try:
        cmd = download_command(dist, staging)
        say(f"download: {dist.requirement} ({'sdist' if dist.source else 'wheel'}) through pip")
        t0 = time.monotonic()
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        lines = proc.stdout.splitlines()
        if proc.returncode != 0:
            tail = "\n".join(lines[-30:])
            raise EngineSetupError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}")
        got = staging / dist.filename
        if not got.is_file():
            found = ", ".join(sorted(p.name for p in staging.iterdir())) or "nothing"
            raise EngineSetupError(f"pip saved {found}, not {dist.filename}")
        verify_sha256(got, dist.sha256)
        got.rename(path)
        say(
            f"download: {dist.filename}, {path.stat().st_size / 1e6:.1f} MB, sha256 verified, "
            f"in {time.monotonic() - t0:.1f} s"
        )
        return path
    finally:
        shutil.rmtree(staging, ignore_errors=True)
