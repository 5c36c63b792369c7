"""Artifact names and semantic versions.

An artifact name reads ``<model>-<backend><backend_version>-<precision>-<strategy>:<semver>``,
for example ``demo-gpt-onnxruntime1.32.0-int8-ptq:1.0.0``. Model names may contain
dashes, so a name is parsed from the right: the backend is one of a closed set
(``onnxruntime``, ``tensorrt``) immediately followed by its version, the precision is
one of a closed set, and the strategy has no dash.

Model and version names must also fit the topic layout
(``<p>.requests.<model>.<version>``, split on dots), so :func:`validate_model_name`
and :func:`validate_version_name` are the one rule for the registry, artifact
names and :mod:`graylane.topics`.

Pure module: no I/O, checked with ``mypy --strict``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from graylane.errors import GraylaneError

__all__ = [
    "MODEL_NAME_MAX",
    "ONNX_PRECISIONS",
    "VERSION_NAME_MAX",
    "ArtifactName",
    "Backend",
    "NamingError",
    "Precision",
    "SemVer",
    "artifact_dir_name",
    "parse_artifact_name",
    "parse_semver",
    "validate_model_name",
    "validate_strategy",
    "validate_version_name",
]


class NamingError(GraylaneError, ValueError):
    """A name, version or tag does not follow the artifact naming convention."""


class Backend(Enum):
    """Runtime that loads or compiles a variant: a library the worker runs in process
    (ONNX Runtime, TensorRT), or an engine server it calls over HTTP (see
    :mod:`graylane.engine.server`)."""

    ONNXRUNTIME = "onnxruntime"
    TENSORRT = "tensorrt"
    LLAMACPP = "llamacpp"
    """llama.cpp's ``llama-server`` (GGUF files)."""
    VLLM = "vllm"
    TRTLLM = "trtllm"
    """TensorRT-LLM's ``trtllm-serve``."""
    SGLANG = "sglang"

    @property
    def is_engine_server(self) -> bool:
        """Served by an OpenAI-compatible engine server, not loaded by the worker."""
        return self not in (Backend.ONNXRUNTIME, Backend.TENSORRT)


class Precision(Enum):
    """Numeric precision of a variant; the value is the spelling used in names and specs.

    The builder's ONNX variants (:data:`ONNX_PRECISIONS`) are ``fp32``, ``fp16``, ``int8``
    (Q/DQ, calibrated), ``int8-dynamic`` (dynamic activations), and the weight-only ones a
    decoder's ladder uses: ``int8-weight-only`` and ``int4`` (ONNX Runtime's
    ``MatMulNBits``: 8- or 4-bit blockwise weights, activations in float or int8 per
    block). ``int4`` also names what engine servers load (AWQ/GPTQ checkpoints); the rest
    name only what engine servers load: ``bf16`` and ``fp8`` engines (TensorRT-LLM,
    vLLM), and llama.cpp's GGUF quantization types by their own names (``q4_1``, ``q2_k``,
    ...).
    """

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    INT8_DYNAMIC = "int8-dynamic"
    INT8_WEIGHT_ONLY = "int8-weight-only"
    BF16 = "bf16"
    FP8 = "fp8"
    INT4 = "int4"
    F16 = "f16"
    Q8_0 = "q8_0"
    Q6_K = "q6_k"
    Q5_K_M = "q5_k_m"
    Q5_K_S = "q5_k_s"
    Q5_1 = "q5_1"
    Q5_0 = "q5_0"
    Q4_K_M = "q4_k_m"
    Q4_K_S = "q4_k_s"
    Q4_1 = "q4_1"
    Q4_0 = "q4_0"
    Q3_K_L = "q3_k_l"
    Q3_K_M = "q3_k_m"
    Q3_K_S = "q3_k_s"
    Q2_K = "q2_k"

    @property
    def builds_onnx(self) -> bool:
        """One of the builder's ONNX variants (the rest name what engine servers load)."""
        return self in ONNX_PRECISIONS

    @property
    def weight_only(self) -> bool:
        """Quantized weights only (``MatMulNBits``): no calibration, activations untouched."""
        return self in (Precision.INT8_WEIGHT_ONLY, Precision.INT4)


ONNX_PRECISIONS = (
    Precision.FP32,
    Precision.FP16,
    Precision.INT8_WEIGHT_ONLY,
    Precision.INT8,
    Precision.INT8_DYNAMIC,
    Precision.INT4,
)
"""The variants the builder makes from an ONNX source, in quality order."""


MODEL_NAME_MAX = 100
VERSION_NAME_MAX = 64
# No dots in a model: topic names put the version after the model, dot-separated.
_MODEL_RE = re.compile(r"[a-z0-9]+(?:[_-][a-z0-9]+)*")
# What Kafka allows in a topic name (no '+': semver build metadata cannot name a topic).
_VERSION_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_STRATEGY_RE = re.compile(r"[a-z0-9]+(?:[._][a-z0-9]+)*")
_BACKEND_VERSION_RE = re.compile(r"[0-9]+(?:\.[0-9]+)*")
_IDENT = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER_RE = re.compile(
    r"(?P<major>0|[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)\.(?P<patch>0|[1-9][0-9]*)"
    rf"(?:-(?P<pre>{_IDENT}(?:\.{_IDENT})*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)
_BACKENDS = "|".join(re.escape(b.value) for b in Backend)
# Longest precision first so "int8-dynamic" is never read as "int8" + strategy.
_PRECISIONS = "|".join(
    re.escape(p.value) for p in sorted(Precision, key=lambda p: len(p.value), reverse=True)
)
# The model group is greedy, so the rightmost backend token wins: a model may itself
# contain something that looks like "-tensorrt1".
_NAME_RE = re.compile(
    rf"(?P<model>.+)-(?P<backend>{_BACKENDS})(?P<backend_version>[0-9]+(?:\.[0-9]+)*)"
    rf"-(?P<precision>{_PRECISIONS})-(?P<strategy>[^-:]+):(?P<version>.+)"
)


@dataclass(frozen=True)
class SemVer:
    """A semantic version (semver.org 2.0.0).

    Equality is structural (build metadata included); ordering follows semver
    precedence, which ignores build metadata. So two versions differing only in
    build metadata are neither ``<`` nor ``>`` each other, yet not ``==``.
    """

    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        # A release sorts after every prerelease of the same core version.
        release = 1 if not self.prerelease else 0
        idents = tuple(
            (0, int(part), "") if part.isdigit() else (1, 0, part) for part in self.prerelease
        )
        return (self.major, self.minor, self.patch, release, idents)

    def __lt__(self, other: SemVer) -> bool:
        return self._key() < other._key()

    def __le__(self, other: SemVer) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: SemVer) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: SemVer) -> bool:
        return self._key() >= other._key()

    def same_precedence(self, other: SemVer) -> bool:
        """True when neither version takes precedence (build metadata ignored)."""
        return self._key() == other._key()


def parse_semver(text: str) -> SemVer:
    """Parse ``MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]``."""
    match = _SEMVER_RE.fullmatch(text)
    if match is None:
        raise NamingError(
            f"{text!r} is not a semantic version: use MAJOR.MINOR.PATCH such as '1.2.0' "
            "(optionally '-rc.1' and '+build.5'; no leading zeros, no 'v' prefix)"
        )
    pre = match.group("pre")
    build = match.group("build")
    return SemVer(
        major=int(match.group("major")),
        minor=int(match.group("minor")),
        patch=int(match.group("patch")),
        prerelease=tuple(pre.split(".")) if pre else (),
        build=tuple(build.split(".")) if build else (),
    )


def validate_model_name(model: str) -> str:
    """Return ``model`` if it is lowercase words joined by single ``-`` or ``_``.

    At most :data:`MODEL_NAME_MAX` characters and no dots, so every registered
    model has its topics.
    """
    if len(model) > MODEL_NAME_MAX or not _MODEL_RE.fullmatch(model):
        raise NamingError(
            f"model name {model!r} is not valid: use lowercase letters and digits, "
            f"separated by single '-' or '_' (no dots), at most {MODEL_NAME_MAX} characters, "
            "e.g. 'demo-gpt'"
        )
    return model


def validate_version_name(version: str) -> str:
    """Return ``version`` if it can name a version topic: 1-64 letters, digits, '.', '_', '-'."""
    if len(version) > VERSION_NAME_MAX or not _VERSION_NAME_RE.fullmatch(version):
        raise NamingError(
            f"version {version!r} must be 1-{VERSION_NAME_MAX} letters, digits, '.', '_' or '-' "
            "(no '+' build metadata: it cannot name a topic)"
        )
    return version


def validate_strategy(strategy: str) -> str:
    """Return ``strategy`` if it is lowercase words joined by ``_`` or ``.`` (no dash)."""
    if not _STRATEGY_RE.fullmatch(strategy):
        raise NamingError(
            f"strategy tag {strategy!r} is not valid: use lowercase letters and digits, "
            "optionally separated by '_' or '.', no '-' (e.g. 'ptq', 'default')"
        )
    return strategy


def _validate_backend_version(version: str) -> str:
    if not _BACKEND_VERSION_RE.fullmatch(version):
        raise NamingError(
            f"backend version {version!r} is not valid: use dot-separated numbers, e.g. '10.13.0'"
        )
    return version


@dataclass(frozen=True)
class ArtifactName:
    """The parts of an artifact name; ``str()`` gives the canonical spelling."""

    model: str
    backend: Backend
    backend_version: str
    precision: Precision
    strategy: str
    version: SemVer

    def __post_init__(self) -> None:
        validate_model_name(self.model)
        validate_strategy(self.strategy)
        _validate_backend_version(self.backend_version)

    def __str__(self) -> str:
        return (
            f"{self.model}-{self.backend.value}{self.backend_version}"
            f"-{self.precision.value}-{self.strategy}:{self.version}"
        )

    @classmethod
    def parse(cls, text: str) -> ArtifactName:
        """Parse a canonical artifact name; see :func:`parse_artifact_name`."""
        return parse_artifact_name(text)


def parse_artifact_name(text: str) -> ArtifactName:
    """Parse ``<model>-<backend><backend_version>-<precision>-<strategy>:<semver>``."""
    match = _NAME_RE.fullmatch(text)
    if match is None:
        raise NamingError(
            f"{text!r} is not an artifact name: expected "
            "'<model>-<backend><backend_version>-<precision>-<strategy>:<semver>' with backend "
            f"in {[b.value for b in Backend]} and precision in {[p.value for p in Precision]}, "
            "e.g. 'demo-gpt-onnxruntime1.32.0-int8-ptq:1.0.0'"
        )
    return ArtifactName(
        model=match.group("model"),
        backend=Backend(match.group("backend")),
        backend_version=match.group("backend_version"),
        precision=Precision(match.group("precision")),
        strategy=match.group("strategy"),
        version=parse_semver(match.group("version")),
    )


def artifact_dir_name(name: ArtifactName, compute_capability: str | None = None) -> str:
    """A filesystem-safe folder name for an artifact.

    ``:`` becomes ``@``; an engine compiled for one GPU architecture gets a
    ``~sm<major><minor>`` suffix so engines for several architectures can sit side
    by side under the same artifact name.
    """
    folder = str(name).replace(":", "@")
    if compute_capability is not None:
        folder += "~sm" + compute_capability.replace(".", "")
    return folder
