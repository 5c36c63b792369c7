"""Build ``llama-server`` and ``llama-quantize`` once per machine from the pinned sources.

The sources are the llama.cpp tree vendored in the ``llama-cpp-python`` sdist (fetched by
pip, checked by sha256). The build runs in a temporary folder under the cache, under a file
lock, and the finished ``bin/`` moves into place in one rename; a stamp (``build.json``)
records the sdist digest, the CMake flags and the targets, so a change of any of them builds
again and anything else reuses the binaries. A failed build exits loudly with the tail of
its log (kept as ``llama.cpp-<version>.build-failed.log`` in the cache).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from graylane.deploy.engines.layout import (
    BUILD_TARGETS,
    CMAKE_FLAGS,
    LLAMA_CPP_VERSION,
    REQUIRED_CPU_FLAGS,
    SDIST,
    SOURCE_PREFIX,
    SOURCE_SKIP,
    EngineSetupError,
    binary_path,
    build_lock_file,
    cache_root,
    engine_dir,
    file_lock,
    say,
)
from graylane.deploy.engines.pypi import download

__all__ = [
    "STAMP_NAME",
    "build",
    "build_commands",
    "check_cpu",
    "is_built",
    "missing_cpu_flags",
    "read_stamp",
    "wanted_stamp",
]

STAMP_NAME = "build.json"
PROGRESS_EVERY_S = 10.0
_PERCENT_RE = re.compile(r"^\[\s*(\d+)%\]")  # Unix Makefiles
_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")  # Ninja
_COMPILER_RE = re.compile(r"The CXX compiler identification is (.+)$")


def wanted_stamp() -> dict[str, Any]:
    """What a reusable build must have been built from."""
    return {
        "llama_cpp_python": LLAMA_CPP_VERSION,
        "sdist_sha256": SDIST.sha256,
        "cmake_flags": list(CMAKE_FLAGS),
        "targets": list(BUILD_TARGETS),
    }


def read_stamp() -> dict[str, Any] | None:
    try:
        data = json.loads((engine_dir() / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_built() -> bool:
    """True when the cached binaries were built from the pinned sources with these flags."""
    stamp = read_stamp()
    if stamp is None or any(stamp.get(k) != v for k, v in wanted_stamp().items()):
        return False
    return all(os.access(binary_path(t), os.X_OK) for t in BUILD_TARGETS)


def missing_cpu_flags(cpuinfo: str) -> list[str]:
    """The instruction sets the build needs that a ``/proc/cpuinfo`` text does not list."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
            break
    return [f for f in REQUIRED_CPU_FLAGS if f not in flags]


def check_cpu() -> None:
    """Refuse, with a reason, a CPU the portable x86-64 build cannot run on."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        raise EngineSetupError(
            f"the llama.cpp build is set up for x86-64 with AVX2 (flags {CMAKE_FLAGS}); "
            f"this machine is {machine}"
        )
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return  # not Linux: let the binary speak for itself
    missing = missing_cpu_flags(cpuinfo)
    if missing:
        raise EngineSetupError(
            f"this CPU lacks {', '.join(missing)}: the portable llama.cpp build needs "
            f"{', '.join(REQUIRED_CPU_FLAGS)} (x86-64 from Haswell / Zen on)"
        )


def build_commands(source: Path, build_dir: Path, jobs: int) -> tuple[list[str], list[str]]:
    """The CMake configure and build command lines."""
    cmake = shutil.which("cmake") or "cmake"
    configure = [cmake, "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS]
    compile_ = [cmake, "--build", str(build_dir), "--target", *BUILD_TARGETS, "-j", str(jobs)]
    return configure, compile_


def build(force: bool = False) -> Path:
    """The engine folder with ``bin/llama-server`` and ``bin/llama-quantize``, built first
    when the cache has no build of the pinned sources with these flags."""
    if not force and is_built():
        return engine_dir()
    with file_lock(build_lock_file(), f"building llama.cpp {LLAMA_CPP_VERSION}"):
        if not force and is_built():  # another process built it while we waited
            return engine_dir()
        return _build_locked()


def _build_locked() -> Path:
    check_cpu()
    for tool in ("cmake", "make", "c++"):
        if shutil.which(tool) is None:
            raise EngineSetupError(
                f"`{tool}` is needed once to build llama.cpp "
                "(Debian: apt-get install -y cmake make g++)"
            )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    prefix = f".llama.cpp-{LLAMA_CPP_VERSION}.tmp-"
    for stale in root.glob(f"{prefix}*"):  # left by a build that was killed (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    sdist = download(SDIST)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    failed_log = root / f"llama.cpp-{LLAMA_CPP_VERSION}.build-failed.log"
    out = staging / "out"
    (out / "bin").mkdir(parents=True)
    log_path = out / "build.log"
    t0 = time.monotonic()
    try:
        with open(log_path, "w") as log:
            source = _extract(sdist, staging / "src")
            jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
            configure, compile_ = build_commands(source, staging / "build", jobs)
            say(f"build: configuring ({' '.join(CMAKE_FLAGS)})")
            configure_lines = _run_logged(configure, log, "configure", t0)
            say(
                f"build: compiling {' and '.join(BUILD_TARGETS)} with {jobs} jobs "
                "(about 8 minutes on 2 cores; only the first set-up on a machine does this)"
            )
            _run_logged(compile_, log, "build", t0)
        for target in BUILD_TARGETS:
            shutil.copy2(staging / "build" / "bin" / target, out / "bin" / target)
        shutil.copyfile(source / "LICENSE", out / "LICENSE")
        reported = _smoke_test(out / "bin" / "llama-server")
        seconds = time.monotonic() - t0
        stamp = {
            **wanted_stamp(),
            "compiler": _first_match(_COMPILER_RE, configure_lines),
            "reported_version": reported,
            "jobs": jobs,
            "build_seconds": round(seconds, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (out / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
        _swap_into_place(out, engine_dir(), staging)
        failed_log.unlink(missing_ok=True)
        say(f"build: done in {_mmss(seconds)}; binaries in {engine_dir() / 'bin'}")
        return engine_dir()
    except BaseException as exc:
        if not log_path.exists():
            raise
        shutil.copyfile(log_path, failed_log)
        if isinstance(exc, EngineSetupError):
            raise EngineSetupError(f"{exc}\n(the whole log: {failed_log})") from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _extract(sdist: Path, dest: Path) -> Path:
    """llama.cpp's tree from the sdist, without what the build never reads."""
    say(f"build: extracting {SOURCE_PREFIX} from {sdist.name}")
    skip = tuple(SOURCE_PREFIX + s for s in SOURCE_SKIP)
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(SOURCE_PREFIX) or member.name.startswith(skip):
                continue
            member.name = member.name[len(SOURCE_PREFIX) :]
            if member.islnk():
                member.linkname = member.linkname.removeprefix(SOURCE_PREFIX)
            if member.name:
                members.append(member)
        if not members:
            raise EngineSetupError(f"{sdist} has no {SOURCE_PREFIX}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # Python < 3.11.4
            tar.extractall(dest, members=members)
    if not (dest / "CMakeLists.txt").is_file():
        raise EngineSetupError(f"{sdist}: no CMakeLists.txt under {SOURCE_PREFIX}")
    return dest


def _run_logged(cmd: Sequence[str], log: IO[str], step: str, t0: float) -> list[str]:
    """Run ``cmd``, every line into ``log``; a progress line every few seconds. Raises
    with the log's tail on a non-zero exit."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group: an interrupt stops every compiler
    )
    if proc.stdout is None:
        raise EngineSetupError(f"{step}: no output pipe")
    lines: list[str] = []
    progress = _Progress(step, t0)
    try:
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            lines.append(line)
            log.write(raw)
            progress.line(line)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        progress.close()
    rc = proc.wait()
    log.flush()
    if rc != 0:
        tail = "\n".join(lines[-40:])
        raise EngineSetupError(f"llama.cpp {step} failed (exit {rc}): `{' '.join(cmd)}`\n{tail}")
    return lines


class _Progress:
    """Says how far a step is every ``PROGRESS_EVERY_S``: on its output lines, and from a
    ticker while it is silent (one large translation unit can take a minute)."""

    def __init__(self, step: str, t0: float) -> None:
        self._step, self._t0 = step, t0
        self._percent: int | None = None
        self._what = ""
        self._last_said = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name=f"{step}-progress", daemon=True)
        self._ticker.start()

    def line(self, line: str) -> None:
        percent = _percent(line)
        if percent is None:
            return
        with self._lock:
            self._percent, self._what = percent, line.split("]", 1)[-1].strip()
            if time.monotonic() - self._last_said >= PROGRESS_EVERY_S:
                self._say()

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            with self._lock:
                if time.monotonic() - self._last_said >= PROGRESS_EVERY_S:
                    self._say()

    def _say(self) -> None:
        self._last_said = time.monotonic()
        elapsed = _mmss(self._last_said - self._t0)
        done = f"{self._percent:3d}%" if self._percent is not None else "...."
        say(f"{self._step}: {done} after {elapsed}  {self._what[:90]}")

    def close(self) -> None:
        self._done.set()
        self._ticker.join()


def _percent(line: str) -> int | None:
    m = _PERCENT_RE.match(line)
    if m:
        return int(m.group(1))
    m = _NINJA_RE.match(line)
    if m and int(m.group(2)):
        return 100 * int(m.group(1)) // int(m.group(2))
    return None


def _smoke_test(server: Path) -> str:
    """``llama-server --version``: the binary starts on this CPU (no illegal instruction)."""
    proc = subprocess.run(
        [str(server), "--version"], capture_output=True, text=True, errors="replace", timeout=60
    )
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise EngineSetupError(f"{server} --version failed (exit {proc.returncode}):\n{text}")
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _swap_into_place(out: Path, final: Path, staging: Path) -> None:
    """``out`` becomes ``final`` in one rename; an older build is moved aside first."""
    if final.exists():
        final.rename(staging / "previous")
    out.rename(final)


def _first_match(pattern: re.Pattern[str], lines: Iterable[str]) -> str:
    for line in lines:
        m = pattern.search(line)
        if m:
            return m.group(1).strip()
    return ""


def _mmss(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"
