"""ORM rows to frozen registry records, and the registry's argument normalisation."""

from __future__ import annotations

from datetime import UTC, datetime

from graylane.artifacts.naming import NamingError, SemVer, parse_artifact_name, parse_semver
from graylane.registry.records import (
    ArtifactInfo,
    RegistryError,
    ValidationSummary,
    VersionInfo,
    VersionStatus,
)
from graylane.registry.schema import ArtifactRow, ModelVersionRow, ValidationResultRow

__all__ = ["artifact_info", "to_semver", "utc", "validation_summary", "version_info"]


def to_semver(version: SemVer | str) -> SemVer:
    """A SemVer from a SemVer or its text; a bad text is a :class:`RegistryError`."""
    try:
        return version if isinstance(version, SemVer) else parse_semver(version)
    except NamingError as exc:
        raise RegistryError(str(exc)) from None


def utc(moment: datetime) -> datetime:
    """`moment` with its UTC zone."""
    # SQLite hands timestamps back without a zone; they were written in UTC.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def version_info(row: ModelVersionRow, model: str) -> VersionInfo:
    return VersionInfo(
        model=model,
        version=parse_semver(row.version),
        source_sha256=row.source_sha256,
        status=VersionStatus(row.status),
        created_at=utc(row.created_at),
    )


def validation_summary(row: ValidationResultRow | None) -> ValidationSummary | None:
    if row is None:
        return None
    return ValidationSummary(
        passed=row.passed,
        max_abs=row.max_abs,
        mean_rel=row.mean_rel,
        cosine=row.cosine,
        top1_agreement=row.top1_agreement,
        token_agreement=row.token_agreement,
        rows=row.rows,
        failures=tuple(line for line in row.failures.splitlines() if line),
    )


def artifact_info(row: ArtifactRow) -> ArtifactInfo:
    return ArtifactInfo(
        name=parse_artifact_name(row.name),
        target=row.target,
        path=row.path,
        manifest_sha256=row.manifest_sha256,
        servable=row.servable,
        forced=row.forced,
        gpu_compute_capability=row.gpu_compute_capability,
        validation=validation_summary(row.validation),
        created_at=utc(row.created_at),
    )
