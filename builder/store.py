"""The artifact store: one folder per artifact, holding model files and ``manifest.json``.

Layout under the store root::

    <model>-<backend><ver>-<precision>-<strategy>@<semver>[~sm<cc>]/
        model.onnx | engine.plan  (+ model.onnx.data for large models)
        manifest.json
        model.sig                 (when the store signs: see graylane.artifacts.signing)
    .cache/calibration/<key>.json      int8 tensor ranges
    .cache/tensorrt/engines/<key>.plan compiled engines by build key
    .cache/tensorrt/timing/<...>.cache TensorRT timing caches
    .cache/sources/                    generated source models

Artifacts are published atomically: files are staged in a sibling folder and
renamed into place, so a reader never sees half an artifact.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from graylane.artifacts.manifest import (
    MANIFEST_FILE,
    FileDigest,
    Manifest,
    ManifestError,
    read_manifest,
    write_manifest,
)
from graylane.artifacts.naming import ArtifactName, artifact_dir_name
from graylane.artifacts.signing import sign_artifact
from graylane.artifacts.verify import (
    digest_files,
)
from graylane.errors import GraylaneError

__all__ = [
    "ArtifactExistsError",
    "ArtifactStore",
    "CacheKind",
    "StoreError",
]


class StoreError(GraylaneError):
    """The artifact store cannot complete an operation."""


class ArtifactExistsError(StoreError):
    """An artifact with this name is already published (versions are immutable)."""


class CacheKind(Enum):
    CALIBRATION = "calibration"
    TENSORRT_ENGINES = "tensorrt/engines"
    TENSORRT_TIMING = "tensorrt/timing"
    SOURCES = "sources"


@dataclass(frozen=True)
class ArtifactStore:
    root: Path
    signing_key: Path | None = None
    """Sign each published artifact with this private key (``None``: unsigned)."""

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
        ``replace`` an existing artifact of the same name is an error. With a
        :attr:`signing_key` the staged folder is signed before it is renamed into place.
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
            if self.signing_key is not None:
                sign_artifact(staging, self.signing_key)  # signed before anyone can see it
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
