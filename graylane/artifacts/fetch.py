"""Fetching a version's artifacts from an artifact store into a local folder, verified.

A pod's init container runs this (``graylane artifacts fetch``) to fill the worker's
artifact folder: for each servable artifact the registry lists for a version, the
artifact's folder is copied from the store (any fsspec URL: ``file://``, a plain path,
``s3://`` when its backend is installed) under its store-relative location, checked
against its manifest's sha256 and the registry's record of that manifest, and, with
trusted keys, its signature. Everything is staged in a temporary folder inside the
destination and renamed into place only when every artifact verified: a failure
leaves nothing half-copied.

A pod that runs one backend fetches only its artifacts (``backends``: a CPU worker needs
no TensorRT engine, often the largest files of a version). What was left out on purpose
is written to :data:`FETCH_RECORD` in the destination, so that the worker's loader skips
those artifacts by name (and says why) while any other missing artifact stays an error.
A GPU pod whose init container sees the pod's GPU (``gpu``: its compute capability and
TensorRT version) fetches, per precision, only the engine the worker would load on it
(:func:`~graylane.artifacts.compatibility.select_engine`, the loader's own choice), read
from each candidate's manifest in the store (checked against the registry's sha256 first).
A variant an engine server serves has nothing to fetch but its manifest (and signature):
the model file stays with the server; the manifest is fetched and verified all the same,
since the worker's loader reads the endpoint from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from graylane.artifacts.compatibility import select_engine
from graylane.artifacts.manifest import MANIFEST_FILE, Manifest, ManifestError, manifest_from_dict
from graylane.artifacts.naming import Backend
from graylane.artifacts.signing import (
    ArtifactSignatureError,
    TrustedKeyError,
    require_trusted_keys,
    verify_signature,
)
from graylane.artifacts.verify import TamperedArtifactError, verify_artifact
from graylane.engine.errors import IncompatibleEngineError
from graylane.errors import GraylaneError
from graylane.registry.records import ArtifactInfo, RegistryError
from graylane.registry.repository import open_registry

__all__ = [
    "FETCH_RECORD",
    "ArtifactFetchError",
    "FetchGpu",
    "FetchRecord",
    "FetchedArtifact",
    "fetch_artifacts",
    "fetch_version",
    "store_relative",
]

_CHUNK = 1 << 20
_STAGING_PREFIX = ".fetch-"
FETCH_RECORD = "fetch-record.json"
"""The file, in a fetch's destination, naming the artifacts it left out on purpose."""


class ArtifactFetchError(GraylaneError):
    """A version's artifacts could not be fetched, or one of them did not verify."""


@dataclass(frozen=True)
class FetchedArtifact:
    name: str
    location: PurePosixPath
    """Store-relative location; the artifact now lies at ``into / location``."""
    files: int
    signer: Path | None
    """The trusted key its signature verified against (``None``: not checked)."""
    endpoint: str | None = None
    """An engine server's variant: the URL its manifest names (the files are the manifest)."""


@dataclass(frozen=True)
class FetchGpu:
    """The GPU an init container sees: the one its pod's worker will run on."""

    compute_capability: str
    """``major.minor``, e.g. ``9.0``."""
    tensorrt_version: str

    def __str__(self) -> str:
        return f"compute capability {self.compute_capability}, TensorRT {self.tensorrt_version}"


@dataclass(frozen=True)
class FetchRecord:
    """What one fetch of a model version left out on purpose, and why."""

    model: str
    version: str
    left_out: Mapping[str, str] = field(default_factory=dict)
    """Registered location -> why that artifact was not fetched (a location, not a name:
    engines of one name for several GPUs lie apart)."""

    def write(self, into: Path) -> None:
        doc = {"model": self.model, "version": self.version, "left_out": dict(self.left_out)}
        staged = into / (FETCH_RECORD + ".tmp")
        staged.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        os.replace(staged, into / FETCH_RECORD)

    @classmethod
    def read(cls, folder: Path, model: str, version: str) -> FetchRecord | None:
        """The record a fetch of ``model`` ``version`` left in ``folder``; None: there is none
        (the folder was not filled by a fetch, or by one of another version)."""
        try:
            doc = json.loads((folder / FETCH_RECORD).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ArtifactFetchError(f"{folder / FETCH_RECORD}: unreadable ({exc})") from None
        if not isinstance(doc, dict) or (doc.get("model"), doc.get("version")) != (model, version):
            return None
        left_out = doc.get("left_out")
        if not isinstance(left_out, dict):
            raise ArtifactFetchError(f"{folder / FETCH_RECORD}: 'left_out' is not a mapping")
        return cls(model, version, {str(k): str(v) for k, v in left_out.items()})


def store_relative(location: str) -> PurePosixPath:
    """An artifact's registered location as a safe store-relative path.

    Absolute locations (registered before locations were store-relative) and ones
    climbing out of the store (``..``) cannot travel and are refused.
    """
    path = PurePosixPath(location)
    if path.is_absolute() or not path.parts:
        raise ArtifactFetchError(
            f"artifact location {location!r} is not store-relative; re-register it "
            "relative to the artifact store to fetch it"
        )
    if any(part in ("..", ".") for part in path.parts):
        raise ArtifactFetchError(f"artifact location {location!r} leaves the artifact store")
    return path


def fetch_version(
    db_url: str,
    model: str,
    version: str,
    *,
    store: str,
    into: Path,
    trusted_keys: Sequence[Path] = (),
    backends: Collection[Backend] = (),
    gpu: FetchGpu | None = None,
    require_signatures: bool = False,
    keys_from: str = "",
) -> list[FetchedArtifact]:
    """Fetch every servable artifact the registry lists for ``model`` ``version``.

    ``backends``: only the artifacts of these backends (none given: all); ``gpu``: of the
    TensorRT engines, only the one per precision the worker loads on this GPU. What is
    left out is named in the destination's :class:`FetchRecord`. ``require_signatures``
    fails closed: with no readable trusted key nothing is fetched (``keys_from`` names
    where the keys were looked for, in the error).
    """
    if require_signatures:
        try:
            trusted_keys = require_trusted_keys(trusted_keys, keys_from)
        except TrustedKeyError as exc:
            raise ArtifactFetchError(str(exc)) from None
    registry = open_registry(db_url, read_only=True)
    try:
        artifacts = registry.list_artifacts(model, version)
    except RegistryError as exc:
        raise ArtifactFetchError(f"{model} {version}: {exc}") from None
    finally:
        registry.engine.dispose()
    servable = [a for a in artifacts if a.servable]
    if not servable:
        raise ArtifactFetchError(
            f"{model} {version}: no servable artifact registered"
            + (f" ({len(artifacts)} not servable)" if artifacts else "")
        )
    wanted = set(backends) or set(Backend)
    chosen = [a for a in servable if a.backend in wanted]
    if not chosen:
        names = ", ".join(sorted(b.value for b in wanted))
        raise ArtifactFetchError(
            f"{model} {version}: no servable artifact for {names} "
            f"(registered: {', '.join(sorted(str(a.name) for a in servable))})"
        )
    left_out = {
        a.path: f"a {a.backend.value} artifact; this pod fetched only "
        + ", ".join(sorted(b.value for b in wanted))
        for a in servable
        if a.backend not in wanted
    }
    if gpu is not None:
        engines = [a for a in chosen if a.backend is Backend.TENSORRT]
        other_gpus = _engines_not_for(gpu, engines, store)
        left_out |= other_gpus
        chosen = [a for a in chosen if a.path not in other_gpus]
    fetched = fetch_artifacts(chosen, store=store, into=into, trusted_keys=trusted_keys)
    FetchRecord(model, version, left_out).write(into)
    return fetched


def fetch_artifacts(
    artifacts: Sequence[ArtifactInfo],
    *,
    store: str,
    into: Path,
    trusted_keys: Sequence[Path] = (),
) -> list[FetchedArtifact]:
    """Copy, verify, then rename into place; on any failure nothing is left in ``into``."""
    locations = [(art, store_relative(art.path)) for art in artifacts]
    into.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=into))
    try:
        fetched: list[FetchedArtifact] = []
        for art, location in locations:
            folder = staging / location
            count = _copy_folder(store, location, folder)
            manifest, signer = _verify(art, folder, trusted_keys)
            endpoint = None if manifest.endpoint is None else manifest.endpoint.url
            fetched.append(FetchedArtifact(str(art.name), location, count, signer, endpoint))
        for item in fetched:
            dest = into / item.location
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.exists():
                shutil.rmtree(dest)  # a re-run (a restarted init container) replaces it
            os.replace(staging / item.location, dest)
        return fetched
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _engines_not_for(gpu: FetchGpu, engines: Sequence[ArtifactInfo], store: str) -> dict[str, str]:
    """The engines the worker would not load on ``gpu``, by location, with why: per
    precision, all but the loader's own choice (all of them when none fits this GPU)."""
    by_precision: dict[str, list[tuple[ArtifactInfo, Manifest]]] = {}
    for art in engines:
        manifest = _store_manifest(store, art)
        by_precision.setdefault(art.precision.value, []).append((art, manifest))
    not_here: dict[str, str] = {}
    for group in by_precision.values():
        try:
            chosen = select_engine(
                [m for _, m in group], gpu.compute_capability, gpu.tensorrt_version
            )
        except IncompatibleEngineError as exc:
            not_here |= {art.path: str(exc) for art, _ in group}
            continue
        not_here |= {
            art.path: f"a TensorRT engine for another GPU (this one: {gpu})"
            for art, manifest in group
            if manifest is not chosen
        }
    return not_here


def _store_manifest(store: str, art: ArtifactInfo) -> Manifest:
    """An artifact's manifest read from the store, refused unless the registry's sha256
    of it matches (it is only read to choose; what is fetched is verified in full)."""
    location = store_relative(art.path)
    fs, root = _store_fs(store)
    source = f"{root.rstrip('/')}/{location}/{MANIFEST_FILE}"
    try:
        with fs.open(source, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ArtifactFetchError(f"reading {source} from {store!r}: {exc}") from None
    if hashlib.sha256(data).hexdigest() != art.manifest_sha256:
        raise ArtifactFetchError(f"refused {art.name}: its manifest is not the registered one")
    try:
        return manifest_from_dict(json.loads(data))
    except (ValueError, ManifestError) as exc:
        raise ArtifactFetchError(f"refused {art.name}: unreadable manifest ({exc})") from None


def _verify(
    art: ArtifactInfo, folder: Path, trusted_keys: Sequence[Path]
) -> tuple[Manifest, Path | None]:
    """(its manifest, the trusted key that signed it, ``None``: not checked)."""
    try:
        manifest = verify_artifact(folder, art.manifest_sha256)
        return manifest, verify_signature(folder, trusted_keys) if trusted_keys else None
    except (TamperedArtifactError, ArtifactSignatureError, TrustedKeyError) as exc:
        raise ArtifactFetchError(f"refused {art.name}: {exc}") from None


def _copy_folder(store: str, location: PurePosixPath, dest: Path) -> int:
    """Copy every file under ``store``/``location`` into ``dest``; returns how many."""
    fs, root = _store_fs(store)
    source = f"{root.rstrip('/')}/{location}"
    try:
        if not fs.isdir(source):
            raise ArtifactFetchError(f"{fs.unstrip_protocol(source)}: no such artifact folder")
        files = sorted(fs.find(source))
        for remote in files:
            target = dest / _key_below(remote, source)
            target.parent.mkdir(parents=True, exist_ok=True)
            with fs.open(remote, "rb") as src, target.open("wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
    except OSError as exc:
        raise ArtifactFetchError(f"copying {source} from {store!r}: {exc}") from None
    return len(files)


def _key_below(key: str, folder: str) -> PurePosixPath:
    """A store key listed under ``folder``, relative to it; refused when it is not plainly
    below it. An object store lists keys as written: one named ``a/../../x`` or
    ``/etc/x`` would otherwise be written outside the fetch's destination."""
    path, root = PurePosixPath(key), PurePosixPath(folder)
    try:
        relative = path.relative_to(root)
    except ValueError:
        raise ArtifactFetchError(f"store key {key!r} is not inside {folder!r}") from None
    if not relative.parts or ".." in path.parts:
        raise ArtifactFetchError(f"store key {key!r} climbs out of {folder!r}; refused")
    return relative


def _store_fs(store: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``store`` and the store's root path in it."""
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(store)
    except (ImportError, ValueError) as exc:
        raise ArtifactFetchError(f"artifact store {store!r}: {exc}") from None
    return fs, str(root)
