"""What the registry hands out and takes in: frozen records, version statuses, typed errors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from graylane.artifacts.naming import ArtifactName, Backend, Precision, SemVer
from graylane.errors import ErrorCode, GraylaneError
from graylane.registry.schema import ANY_TARGET

__all__ = [
    "ArtifactInfo",
    "ArtifactRecord",
    "DuplicateArtifact",
    "DuplicateVersion",
    "EndpointSummary",
    "ModelNotRegistered",
    "RegisteredModel",
    "RegistryError",
    "RungQuality",
    "UnknownArtifact",
    "UnknownVersion",
    "ValidationSummary",
    "VersionInfo",
    "VersionStatus",
    "target_for",
]


class RegistryError(GraylaneError):
    """The registry cannot do what was asked."""

    code = ErrorCode.BAD_REQUEST


class ModelNotRegistered(RegistryError):
    """No model of that name is registered."""

    code = ErrorCode.UNKNOWN_MODEL


class UnknownVersion(RegistryError):
    """The model has no such version."""

    code = ErrorCode.UNKNOWN_VERSION


class DuplicateVersion(RegistryError):
    """The version is already registered; versions are immutable."""

    code = ErrorCode.ALREADY_EXISTS


class UnknownArtifact(RegistryError):
    """No artifact matches the request."""


class DuplicateArtifact(RegistryError):
    """An artifact of that name (and GPU target) is already registered."""


class VersionStatus(Enum):
    REGISTERED = "registered"
    BUILT = "built"
    FAILED = "failed"
    RETIRED = "retired"


@dataclass(frozen=True)
class RegisteredModel:
    """A model as the registry knows it: its name, description and stable version."""

    name: str
    description: str
    created_at: datetime
    stable_version: SemVer | None


@dataclass(frozen=True)
class VersionInfo:
    model: str
    version: SemVer
    source_sha256: str
    status: VersionStatus
    created_at: datetime


@dataclass(frozen=True)
class StableRevision:
    """Revision ``revision`` of a model's stable version: ``version``, made stable at ``set_at``."""

    model: str
    revision: int
    version: SemVer
    set_at: datetime


@dataclass(frozen=True)
class ValidationSummary:
    passed: bool
    max_abs: float | None = None
    mean_rel: float | None = None
    cosine: float | None = None
    top1_agreement: float | None = None
    token_agreement: float | None = None
    rows: int | None = None
    failures: tuple[str, ...] = ()


@dataclass(frozen=True)
class EndpointSummary:
    """Where an engine-server variant is served (the engine and its version are the
    artifact name's backend and backend version)."""

    url: str
    model_sha256: str | None = None
    """Digest of the model file the engine loaded; ``None``: not known to the build."""
    ladder_rank: int = 0
    """Place on the version's QoS ladder, 0 the best."""


@dataclass(frozen=True, kw_only=True)
class RungQuality:
    """One precision rung of a version scored on an evaluation set, beside the reference
    rung scored on the same items in the same run (normally the version's top rung).

    The rung's *quality cost* is :attr:`quality_drop`: the reference's score minus the
    rung's (mean item score, 0..1; positive: the rung answers worse).
    """

    precision: Precision
    set_name: str
    set_sha256: str
    items: int
    score: float
    ci_low: float
    ci_high: float
    """The score's 95 % interval."""
    reference_precision: Precision
    reference_score: float
    recorded_at: datetime | None = None
    """When the registry stored it (None on the way in)."""

    def __post_init__(self) -> None:
        figures = (self.score, self.ci_low, self.ci_high, self.reference_score)
        if not all(0.0 <= f <= 1.0 for f in figures):
            raise RegistryError(f"rung quality of {self.precision.value}: scores lie in 0..1")
        if not self.ci_low <= self.score <= self.ci_high:
            raise RegistryError(
                f"rung quality of {self.precision.value}: the score is outside its interval"
            )
        if self.items <= 0 or not self.set_sha256:
            raise RegistryError(
                f"rung quality of {self.precision.value}: no items or no set digest"
            )

    @property
    def quality_drop(self) -> float:
        """Reference score minus this rung's (0 for the reference itself)."""
        return self.reference_score - self.score


@dataclass(frozen=True)
class ArtifactRecord:
    """What the builder registers for one published artifact."""

    name: ArtifactName
    path: str
    manifest_sha256: str
    servable: bool
    forced: bool = False
    gpu_compute_capability: str | None = None
    validation: ValidationSummary | None = None
    endpoint: EndpointSummary | None = None
    """Engine-server variants only: the artifact is a manifest naming this endpoint."""


@dataclass(frozen=True)
class ArtifactInfo:
    name: ArtifactName
    target: str
    path: str
    manifest_sha256: str
    servable: bool
    forced: bool
    gpu_compute_capability: str | None
    validation: ValidationSummary | None
    created_at: datetime
    endpoint: EndpointSummary | None = None

    @property
    def precision(self) -> Precision:
        return self.name.precision

    @property
    def backend(self) -> Backend:
        return self.name.backend


def target_for(compute_capability: str | None) -> str:
    """``any`` for portable artifacts, ``sm<major><minor>`` for compiled engines."""
    return ANY_TARGET if compute_capability is None else "sm" + compute_capability.replace(".", "")
