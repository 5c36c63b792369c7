"""Which build of Graylane this process runs: its version, git commit and build time.

Every service logs it on each line, exports it in ``graylane_build_info`` and the policy
engine names it on each decision it audits, so a record can always be traced to the code
that made it. Where it comes from, in order:

1. the image: ``GRAYLANE_GIT_SHA`` and ``GRAYLANE_BUILD_TIME`` (the Dockerfiles set them
   from the ``GIT_SHA`` and ``BUILD_DATE`` build arguments);
2. the checkout the code runs from: ``git rev-parse HEAD`` (``-dirty`` appended when
   tracked files differ from it) and, as the build time, the commit's own time (a
   checkout is never built: the commit is the build);
3. neither (an installed wheel outside a checkout, no git): ``unknown``.

Room: the library. May import the library; no service.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

__all__ = ["UNKNOWN", "BuildSource", "RunningBuild", "read_build", "running_build"]

UNKNOWN = "unknown"
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
_GIT_TIMEOUT_S = 5.0


class BuildSource(Enum):
    IMAGE = "image"
    """From the image's build arguments."""
    CHECKOUT = "checkout"
    """From the git checkout the code runs from."""
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True)
class RunningBuild:
    git_sha: str = UNKNOWN
    build_time: str = UNKNOWN
    """ISO 8601, UTC (``2026-12-05T16:40:00Z``)."""
    source: BuildSource = BuildSource.UNKNOWN

    def describe(self) -> str:
        return f"commit {self.git_sha}, built {self.build_time} ({self.source.value})"


def _utc(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _from_checkout(root: Path) -> RunningBuild | None:
    if not (root / ".git").exists():
        return None
    sha = _git(root, "rev-parse", "HEAD")
    if not sha:
        return None
    when = _git(root, "show", "-s", "--format=%ct", "HEAD")
    # tracked files only: a checkout's untracked caches and build outputs do not count
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return RunningBuild(
        git_sha=sha + ("-dirty" if dirty else ""),
        build_time=_utc(int(when)) if when and when.isdigit() else UNKNOWN,
        source=BuildSource.CHECKOUT,
    )


def read_build(env: Mapping[str, str], root: Path = _PACKAGE_ROOT) -> RunningBuild:
    """The build as ``env`` (the image's variables) or the checkout at ``root`` say."""
    sha = env.get("GRAYLANE_GIT_SHA", "").strip()
    when = env.get("GRAYLANE_BUILD_TIME", "").strip()
    if sha and sha != UNKNOWN:
        return RunningBuild(git_sha=sha, build_time=when or UNKNOWN, source=BuildSource.IMAGE)
    return _from_checkout(root) or RunningBuild()


@functools.cache
def running_build() -> RunningBuild:
    """This process's build, read once."""
    return read_build(os.environ)
