"""Engine images: llama.cpp's ``llama-server`` FROM the project's Debian base.

The server is the one the project's set-up built on this machine (``make engines``, cached
under ``$GRAYLANE_CACHE_DIR``, ``~/.cache/graylane`` by default). The image carries it and
the shared libraries it links beyond the C library, the very files ``ldd`` resolved here
(so it runs against what it was built and tested with), runs as the service user with no
shell, package manager or interpreter, and holds no model: a pod mounts the GGUF file
read-only from its host (``deploy/k8s/local-llamacpp``). The Debian base is cached like
the CPU image's; podman's layer cache keeps the image until the server or a library changes.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from graylane.deploy.containers.images import BuiltImage, base_image
from graylane.deploy.containers.podman import ContainerToolError, Podman, containers_dir, say
from graylane.deploy.engines.layout import LLAMA_CPP_VERSION, SMOLLM2, binary_path, model_dir
from graylane.deploy.kafka.layout import REPO_ROOT, file_lock

__all__ = [
    "C_LIBRARY",
    "DOCKERFILE_LLAMACPP",
    "LlamaCppCache",
    "build_llamacpp_image",
    "linked_libraries",
    "llamacpp_cache",
    "stage_llamacpp",
]

DOCKERFILE_LLAMACPP = REPO_ROOT / "deploy" / "docker" / "Dockerfile.llamacpp"
C_LIBRARY = frozenset(
    {
        "linux-vdso.so.1",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
        "libc.so.6",
        "libm.so.6",
        "libpthread.so.0",
        "libdl.so.2",
        "librt.so.1",
    }
)
"""The C library's own objects: the base image provides them (and must be as new)."""


@dataclass(frozen=True, kw_only=True)
class LlamaCppCache:
    """Where the set-up left llama.cpp's binaries and SmolLM2's GGUF files."""

    version: str
    bin_dir: Path
    models_dir: Path

    @property
    def server(self) -> Path:
        return self.bin_dir / "llama-server"

    def model(self, precision: str) -> Path:
        """SmolLM2-135M-Instruct in one GGUF type (``q4_1`` -> ``...Q4_1.gguf``)."""
        return self.models_dir / f"SmolLM2-135M-Instruct.{precision.upper()}.gguf"


def llamacpp_cache() -> LlamaCppCache:
    """The set-up's cache of llama.cpp and the SmolLM2 model files
    (:mod:`graylane.deploy.engines.layout`)."""
    return LlamaCppCache(
        version=LLAMA_CPP_VERSION,
        bin_dir=binary_path("llama-server").parent,
        models_dir=model_dir(SMOLLM2),
    )


def linked_libraries(ldd_output: str) -> dict[str, Path]:
    """The shared libraries ``ldd`` resolved (soname -> file), the C library's left out.

    Raises :class:`ContainerToolError` for a library ``ldd`` could not find: the image
    would not run.
    """
    found: dict[str, Path] = {}
    missing: list[str] = []
    for line in ldd_output.splitlines():
        line = line.strip()
        if not line or "statically linked" in line:
            continue
        name, arrow, rest = line.partition(" => ")
        soname = Path(name.split()[0]).name
        if soname in C_LIBRARY:
            continue
        if not arrow:  # "/lib64/ld-linux-x86-64.so.2 (0x...)": the loader, by path
            continue
        target = rest.split(" (", 1)[0].strip()
        if target == "not found" or not target:
            missing.append(soname)
        else:
            found[soname] = Path(target)
    if missing:
        raise ContainerToolError(f"ldd found no {', '.join(missing)} for llama-server")
    return found


def stage_llamacpp(cache: LlamaCppCache, into: Path) -> dict[str, Path]:
    """The build context: ``bin/llama-server`` and ``lib/`` (its libraries, by soname).

    Returns the libraries staged (none for a statically linked server).
    """
    if not cache.server.is_file():
        raise ContainerToolError(
            f"no llama-server at {cache.server}: build it first with `make engines`"
        )
    res = subprocess.run(
        ["ldd", str(cache.server)], capture_output=True, text=True, check=False, timeout=60
    )
    # ldd exits 1 for a static binary ("not a dynamic executable"): nothing to carry.
    libraries = linked_libraries(res.stdout) if res.returncode == 0 else {}
    (into / "bin").mkdir(parents=True)
    (into / "lib").mkdir()
    shutil.copy2(cache.server, into / "bin" / "llama-server")
    for soname, path in libraries.items():
        shutil.copy2(path.resolve(), into / "lib" / soname)
    return libraries


def build_llamacpp_image(
    podman: Podman,
    *,
    base: str | None = None,
    tag: str | None = None,
    cache: LlamaCppCache | None = None,
) -> BuiltImage:
    """Build ``localhost/graylane-llamacpp:<version>`` FROM ``base`` (the local Debian one)."""
    cache = cache or llamacpp_cache()
    base = base or base_image(podman)
    ref = tag or f"localhost/graylane-llamacpp:{cache.version}"
    t0 = time.monotonic()
    work = containers_dir()
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="llamacpp-") as tmp:
        context = Path(tmp) / "context"
        libraries = stage_llamacpp(cache, context)
        say(f"llamacpp: {cache.server} with {', '.join(libraries) or 'no shared libraries'}")
        args = [
            "build",
            "--layers",
            "--build-arg",
            f"BASE_IMAGE={base}",
            "--build-arg",
            f"LLAMA_CPP_VERSION={cache.version}",
            "-f",
            str(DOCKERFILE_LLAMACPP),
            "-t",
            ref,
            str(context),
        ]
        with file_lock(work / ".build.lock"):
            podman.run(args, stream=True)
            podman.prune_dangling()
    seconds = time.monotonic() - t0
    digest = podman.image_digest(ref)
    say(f"image: {ref} built in {seconds:.0f}s, {digest}")
    return BuiltImage(ref=ref, digest=digest, seconds=seconds)
