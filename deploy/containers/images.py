"""The project's images, built here: a Debian base from the apt mirror, then the CPU image.

No public registry is reachable from this kind of machine, so the base is made with
``debootstrap`` from the Debian mirror the machine's apt already uses and imported into
podman; the CPU image is then built ``FROM`` it (``BASE_IMAGE`` build argument) with pip's
CA bundle as a build secret. Both are rebuilt only when missing; podman's layer cache keeps
the dependency layer until the dependencies listed in ``pyproject.toml`` change.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from graylane.deploy.containers.podman import (
    ContainerToolError,
    Podman,
    containers_dir,
    say,
)
from graylane.deploy.kafka.layout import REPO_ROOT, file_lock

__all__ = [
    "BASE_PACKAGES",
    "BASE_SUITE",
    "DOCKERFILE",
    "BuiltImage",
    "base_image",
    "build_cpu_image",
    "debian_mirror",
    "pip_ca_bundle",
    "project_version",
]

BASE_SUITE = "bookworm"  # Debian 12: Python 3.11, which the project supports
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DOCKERFILE = REPO_ROOT / "deploy" / "docker" / "Dockerfile"
_APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


@dataclass(frozen=True, kw_only=True)
class BuiltImage:
    """An image in podman's local store: its tag, its digest and how long the build took."""

    ref: str
    digest: str
    seconds: float

    @property
    def pinned(self) -> str:
        """``name@sha256:...``: the reference a manifest should use once built."""
        return f"{self.ref.rsplit(':', 1)[0]}@{self.digest}"


def debian_mirror(sources: tuple[Path, ...] = _APT_SOURCES) -> str:
    """The main Debian mirror in the machine's apt sources (one-line or deb822 format)."""
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            files.extend(sorted(p for p in src.iterdir() if p.suffix in (".list", ".sources")))
        elif src.is_file():
            files.append(src)
    for path in files:
        text = path.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.findall(r"^URIs:\s*(\S+)", stanza, flags=re.M)
            suites = re.findall(r"^Suites:\s*(.+)$", stanza, flags=re.M)
            if uris and suites and BASE_SUITE in suites[0].split():
                return str(uris[0])
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb":
                rest = [p for p in parts[1:] if not p.startswith("[")]
                if len(rest) >= 2 and rest[1] == BASE_SUITE:
                    return rest[0]
    raise ContainerToolError(f"no Debian {BASE_SUITE} mirror found in the apt sources")


def pip_ca_bundle() -> Path | None:
    """The CA bundle this machine's pip uses (``$PIP_CERT`` or ``pip config``), if any."""
    found = os.environ.get("PIP_CERT")
    if not found:
        res = subprocess.run(
            ["python3", "-m", "pip", "config", "get", "global.cert"],
            capture_output=True,
            text=True,
            check=False,
        )
        found = res.stdout.strip().strip("'\"") if res.returncode == 0 else ""
    return Path(found) if found and Path(found).is_file() else None


def project_version() -> str:
    text = (REPO_ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, flags=re.M)
    if not match:
        raise ContainerToolError("no version in pyproject.toml")
    return match.group(1)


def _base_ref() -> str:
    key = hashlib.sha256(" ".join((BASE_SUITE, *BASE_PACKAGES)).encode()).hexdigest()[:8]
    return f"localhost/graylane-base:{BASE_SUITE}-{key}"


def base_image(podman: Podman) -> str:
    """The Debian base image (made with debootstrap when missing); returns its reference."""
    ref = _base_ref()
    if podman.image_exists(ref):
        return ref
    work = containers_dir()
    with file_lock(work / ".base.lock"):
        if podman.image_exists(ref):
            return ref
        mirror = debian_mirror()
        say(f"base: debootstrap {BASE_SUITE} ({', '.join(BASE_PACKAGES)}) from {mirror}")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=work, prefix="rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            cmd = [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                BASE_SUITE,
                str(rootfs),
                mirror,
            ]
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
            )
            assert proc.stdout is not None
            lines: list[str] = []
            for line in proc.stdout:
                lines.append(line.rstrip())
                if line.startswith("I: ") and (len(lines) % 40 == 0 or "core" in line):
                    say(f"base:   {line.strip()}")
            if proc.wait() != 0:
                tail = "\n".join(lines[-20:])
                raise ContainerToolError(f"debootstrap failed:\n{tail}")
            shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            say(f"base: debootstrap done in {time.monotonic() - t0:.0f}s; importing as {ref}")
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            imp = subprocess.run(
                [
                    "podman",
                    "import",
                    "--change",
                    "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "-",
                    ref,
                ],
                stdin=tar.stdout,
                env=podman.env(),
                capture_output=True,
                text=True,
                check=False,
            )
            tar.wait()
            if imp.returncode != 0 or tar.returncode != 0:
                raise ContainerToolError(f"podman import failed: {imp.stderr[-2000:]}")
        say(f"base: {ref} ready in {time.monotonic() - t0:.0f}s")
    return ref


DEPS_CACHE = "localhost/graylane-build-cache:deps"
"""The CPU image's dependency stage, tagged so that pruning old builds keeps it."""


def build_cpu_image(
    podman: Podman, *, base: str | None = None, tag: str | None = None
) -> BuiltImage:
    """Build deploy/docker/Dockerfile FROM ``base`` (the local Debian one by default)."""
    base = base or base_image(podman)
    version = project_version()
    ref = tag or f"localhost/graylane:{version}"
    git_sha = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    args = [
        "build",
        "--network",
        "host",
        "--layers",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        f"VERSION={version}",
        "--build-arg",
        f"GIT_SHA={git_sha or 'unknown'}",
        "--build-arg",
        f"BUILD_DATE={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        "-f",
        str(DOCKERFILE),
    ]
    ca = pip_ca_bundle()
    if ca is not None:
        args[1:1] = ["--secret", f"id=cacert,src={ca}"]
    t0 = time.monotonic()
    with file_lock(containers_dir() / ".build.lock"):
        # The deps stage tagged on its own, so that pruning keeps it: it is the slow one
        # (every third-party wheel), and is reused until the dependency lists change.
        podman.run([*args, "--target", "deps", "-t", DEPS_CACHE, str(REPO_ROOT)], stream=True)
        podman.run([*args, "-t", ref, str(REPO_ROOT)], stream=True)
        podman.prune_dangling()
    seconds = time.monotonic() - t0
    digest = podman.image_digest(ref)
    say(f"image: {ref} built in {seconds:.0f}s, {digest}")
    return BuiltImage(ref=ref, digest=digest, seconds=seconds)
