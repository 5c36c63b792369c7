"""Artifact digests, and verifying an artifact against its manifest before anything loads it.

Shared by the builder (which writes artifacts), the registry and the worker
(which refuse a tampered one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from graylane.artifacts.manifest import (
    MANIFEST_FILE,
    FileDigest,
    Manifest,
    ManifestError,
    read_manifest,
)
from graylane.errors import GraylaneError

__all__ = [
    "TamperedArtifactError",
    "digest_files",
    "manifest_sha256",
    "sha256_bytes",
    "sha256_file",
    "verify_artifact",
]


_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class TamperedArtifactError(GraylaneError):
    """A file of an artifact is missing or does not match the digest in its manifest."""

    def __init__(self, message: str, file: str) -> None:
        super().__init__(message)
        self.file = file


def digest_files(folder: Path, names: Sequence[str]) -> tuple[FileDigest, ...]:
    return tuple(
        FileDigest(path=n, sha256=sha256_file(folder / n), bytes=(folder / n).stat().st_size)
        for n in names
    )


def manifest_sha256(folder: Path) -> str:
    return hashlib.sha256((folder / MANIFEST_FILE).read_bytes()).hexdigest()


def verify_artifact(folder: Path | str, expected_manifest_sha256: str | None = None) -> Manifest:
    """Check every file of an artifact against its manifest; returns the manifest.

    An engine-server artifact lists no file: its manifest (checked against
    ``expected_manifest_sha256``, and by its signature where keys are trusted) is all of it.
    Raises :class:`TamperedArtifactError` naming the first file that is missing,
    altered, or (for the manifest itself) differs from ``expected_manifest_sha256``.
    """
    path = Path(folder)
    if expected_manifest_sha256 is not None:
        if not (path / MANIFEST_FILE).is_file():
            raise TamperedArtifactError(f"{path / MANIFEST_FILE}: missing", MANIFEST_FILE)
        actual = manifest_sha256(path)
        if actual != expected_manifest_sha256:
            raise TamperedArtifactError(
                f"{path / MANIFEST_FILE}: sha256 {actual} differs from the registered "
                f"{expected_manifest_sha256}",
                MANIFEST_FILE,
            )
    try:
        manifest = read_manifest(path)
    except ManifestError as exc:
        raise TamperedArtifactError(f"{path / MANIFEST_FILE}: {exc}", MANIFEST_FILE) from None
    served = manifest.backend.is_engine_server
    if served != (manifest.endpoint is not None):
        raise TamperedArtifactError(
            f"{path / MANIFEST_FILE}: a {manifest.backend.value} artifact "
            + ("names no endpoint" if served else "cannot name an engine endpoint"),
            MANIFEST_FILE,
        )
    if not manifest.files and not served:  # an endpoint's artifact is its manifest alone
        raise TamperedArtifactError(f"{path / MANIFEST_FILE}: lists no files", MANIFEST_FILE)
    for entry in manifest.files:
        relative = PurePosixPath(entry.path)
        if relative.is_absolute() or ".." in relative.parts:
            raise TamperedArtifactError(
                f"{path / MANIFEST_FILE}: file entry {entry.path!r} points outside the artifact",
                entry.path,
            )
        file_path = path / relative
        if not file_path.is_file():
            raise TamperedArtifactError(
                f"{file_path}: listed in the manifest but missing", entry.path
            )
        actual = sha256_file(file_path)
        if actual != entry.sha256:
            raise TamperedArtifactError(
                f"{file_path}: sha256 {actual} does not match the manifest's {entry.sha256}; "
                "the file was altered after the build",
                entry.path,
            )
    return manifest
