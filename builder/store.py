"""The artifact store: one folder per artifact, holding model files and ``manifest.json``.

Layout under the store root::

    <model>-<backend><ver>-<precision>-<strategy>@<semver>[~sm<cc>]/
        model.onnx | engine.plan  (+ model.onnx.data for large models)
        manifest.json
    .cache/calibration/<key>.json      int8 tensor ranges
    .cache/tensorrt/engines/<key>.plan compiled engines by build key
    .cache/tensorrt/timing/<...>.cache TensorRT timing caches
    .cache/sources/                    generated source models

Artifacts are published atomically: files are staged in a sibling folder and
renamed into place, so a reader never sees half an artifact.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath

from builder.compatibility import (
    IncompatibleEngineError,
    NoCompatibleEngineError,
    check_engine_compatibility,
    select_engine,
)
from builder.graph import sha256_file
from builder.manifest import (
    MANIFEST_FILE,
    FileDigest,
    Manifest,
    ManifestError,
    read_manifest,
    write_manifest,
)
from builder.naming import ArtifactName, artifact_dir_name

__all__ = [
    "ArtifactExistsError",
    "ArtifactStore",
    "CacheKind",
    "IncompatibleEngineError",
    "NoCompatibleEngineError",
    "StoreError",
    "TamperedArtifactError",
    "check_engine_compatibility",
    "digest_files",
    "manifest_sha256",
    "select_engine",
    "verify_artifact",
]


class StoreError(RuntimeError):
    """The artifact store cannot complete an operation."""


class ArtifactExistsError(StoreError):
    """An artifact with this name is already published (versions are immutable)."""


class TamperedArtifactError(StoreError):
    """A file of an artifact is missing or does not match the digest in its manifest."""

    def __init__(self, message: str, file: str) -> None:
        super().__init__(message)
        self.file = file


class CacheKind(Enum):
    CALIBRATION = "calibration"
    TENSORRT_ENGINES = "tensorrt/engines"
    TENSORRT_TIMING = "tensorrt/timing"
    SOURCES = "sources"


def digest_files(folder: Path, names: Sequence[str]) -> tuple[FileDigest, ...]:
    return tuple(
        FileDigest(path=n, sha256=sha256_file(folder / n), bytes=(folder / n).stat().st_size)
        for n in names
    )


def manifest_sha256(folder: Path) -> str:
    return hashlib.sha256((folder / MANIFEST_FILE).read_bytes()).hexdigest()


@dataclass(frozen=True)
class ArtifactStore:
    root: Path

    def cache_dir(self, kind: CacheKind) -> Path:
        path = self.root / ".cache" / kind.value
        path.mkdir(parents=True, exist_ok=True)
        return path

    def folder_for(self, name: ArtifactName, compute_capability: str | None = None) -> Path:
        return self.root / artifact_dir_name(name, compute_capability)

    def exists(self, name: ArtifactName, compute_capability: str | None = None) -> bool:
        return (self.folder_for(name, compute_capability) / MANIFEST_FILE).is_file()

    def publish(
        self,
        name: ArtifactName,
        files: Sequence[Path],
        make_manifest: Callable[[tuple[FileDigest, ...]], Manifest],
        *,
        compute_capability: str | None = None,
        replace: bool = False,
    ) -> Path:
        """Copy ``files`` into the artifact's folder with a manifest; returns the folder.

        ``make_manifest`` receives the digests of the copied files. Without
        ``replace`` an existing artifact of the same name is an error.
        """
        dest = self.folder_for(name, compute_capability)
        if dest.exists() and not replace:
            raise ArtifactExistsError(
                f"artifact {name} already exists at {dest}; bump the version or pass --force"
            )
        staging_root = self.root / ".staging"
        staging_root.mkdir(parents=True, exist_ok=True)
        staging = staging_root / f"{dest.name}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            for src in files:
                shutil.copy2(src, staging / src.name)
            manifest = make_manifest(digest_files(staging, [f.name for f in files]))
            write_manifest(staging, manifest)
            if dest.exists():
                retired = staging_root / f"{dest.name}.{os.getpid()}.old"
                shutil.rmtree(retired, ignore_errors=True)
                os.replace(dest, retired)
                shutil.rmtree(retired, ignore_errors=True)
            os.replace(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return dest

    def folders(self) -> Iterator[Path]:
        """Every artifact folder (those with a manifest), sorted by name."""
        if not self.root.is_dir():
            return iter(())
        return iter(
            sorted(
                p
                for p in self.root.iterdir()
                if not p.name.startswith(".") and (p / MANIFEST_FILE).is_file()
            )
        )

    def manifests(self) -> list[tuple[Path, Manifest]]:
        """(folder, manifest) for every readable artifact; unreadable ones are skipped."""
        found: list[tuple[Path, Manifest]] = []
        for folder in self.folders():
            try:
                found.append((folder, read_manifest(folder)))
            except ManifestError:
                continue
        return found


def verify_artifact(folder: Path | str, expected_manifest_sha256: str | None = None) -> Manifest:
    """Check every file of an artifact against its manifest; returns the manifest.

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
    if not manifest.files:
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
