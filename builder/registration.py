"""Record published artifacts in the model registry."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from graylane.artifacts.manifest import Manifest
from graylane.artifacts.naming import SemVer
from graylane.artifacts.verify import manifest_sha256
from graylane.registry import (
    ArtifactInfo,
    ArtifactRecord,
    DuplicateVersion,
    Registry,
    UnknownVersion,
    ValidationSummary,
    VersionStatus,
)

__all__ = ["artifact_record", "register_build"]


def artifact_record(manifest: Manifest, folder: Path) -> ArtifactRecord:
    """The registry's view of a published artifact."""
    validation = manifest.validation
    summary = None
    if validation is not None:
        metrics = validation.metrics
        summary = ValidationSummary(
            passed=validation.passed,
            max_abs=None if metrics is None else metrics.max_abs,
            mean_rel=None if metrics is None else metrics.mean_rel,
            cosine=None if metrics is None else metrics.cosine,
            top1_agreement=None if metrics is None else metrics.top1_agreement,
            token_agreement=None if metrics is None else metrics.token_agreement,
            rows=None if metrics is None else metrics.rows,
            failures=validation.failures + ((validation.error,) if validation.error else ()),
        )
    return ArtifactRecord(
        name=manifest.name,
        path=str(folder),
        manifest_sha256=manifest_sha256(folder),
        servable=manifest.servable,
        forced=manifest.forced,
        gpu_compute_capability=None
        if manifest.target is None
        else manifest.target.compute_capability,
        validation=summary,
    )


def register_build(
    registry: Registry,
    model: str,
    version: SemVer,
    source_sha256: str,
    published: Sequence[tuple[Manifest, Path]],
    *,
    replace: bool,
) -> list[ArtifactInfo]:
    """Ensure the model and version exist, then add every artifact.

    An existing version with another source digest is refused (versions are
    immutable) unless ``replace`` (a forced build) is set.
    """
    registry.register_model(model)
    try:
        existing = registry.get_version(model, version)
    except UnknownVersion:
        registry.register_version(model, version, source_sha256)
    else:
        if existing.source_sha256 != source_sha256 and not replace:
            raise DuplicateVersion(
                f"{model} {version} is registered with source sha256 "
                f"{existing.source_sha256[:12]}…, this build's source is {source_sha256[:12]}…; "
                "bump the version (or --force to overwrite)"
            )
    infos = [
        registry.add_artifact(artifact_record(manifest, folder), replace=replace)
        for manifest, folder in published
    ]
    registry.set_version_status(model, version, VersionStatus.BUILT)
    return infos
