"""``graylane artifacts fetch``: a version's artifacts copied from a file:// store, verified
against their manifests and signatures, and nothing left behind when one is refused."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from graylane.app.cli.main import main
from graylane.artifacts.fetch import (
    FETCH_RECORD,
    ArtifactFetchError,
    FetchGpu,
    FetchRecord,
    fetch_version,
    store_relative,
)
from graylane.artifacts.manifest import (
    MANIFEST_FILE,
    BuildHost,
    EngineTarget,
    FileDigest,
    Manifest,
)
from graylane.artifacts.naming import ArtifactName, Backend, Precision, SemVer, artifact_dir_name
from graylane.artifacts.signing import SIGNATURE_FILE, KeyPair, generate_key_pair
from graylane.artifacts.verify import manifest_sha256
from graylane.builder.store import ArtifactStore
from graylane.engine.signature import IOSignature
from graylane.engine.tensorrt import gpu_compute_capability, tensorrt_version
from graylane.registry.records import ArtifactRecord
from graylane.registry.repository import open_registry

MODEL = "demo"
NAME = ArtifactName(MODEL, Backend.ONNXRUNTIME, "1.23", Precision.FP32, "demo", SemVer(1, 0, 0))


def _manifest(files: tuple[FileDigest, ...]) -> Manifest:
    return Manifest(
        name=NAME,
        files=files,
        io=IOSignature((), ()),
        profiles=(),
        build_host=BuildHost("h", "cpu", None, "3.11", "1.23", "1.32.0", None),
        build_duration_s=1.0,
        source_onnx_sha256="0" * 64,
        source_git_commit=None,
        created_at="2026-01-01T00:00:00+00:00",
        servable=True,
    )


@pytest.fixture
def keys(tmp_path: Path) -> KeyPair:
    return generate_key_pair(tmp_path / "keys" / "signing.pem")


def _setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signing_key: Path | None) -> Path:
    """A store with one published artifact of demo 1.0.0, registered store-relative."""
    source = tmp_path / "model.onnx"
    source.write_bytes(bytes(range(256)) * 8)
    store = ArtifactStore(tmp_path / "store", signing_key=signing_key)
    folder = store.publish(NAME, [source], _manifest)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = open_registry(url)
    registry.register_model(MODEL)
    registry.register_version(MODEL, "1.0.0", "a" * 64)
    registry.add_artifact(
        ArtifactRecord(
            name=NAME,
            path=folder.name,
            manifest_sha256=manifest_sha256(folder),
            servable=True,
        )
    )
    registry.engine.dispose()
    monkeypatch.setenv("GRAYLANE_DB_URL", url)
    monkeypatch.delenv("GRAYLANE_TRUSTED_KEYS", raising=False)
    return folder


def _fetch(tmp_path: Path, *extra: str, version: str = "1.0.0") -> int:
    store = f"file://{tmp_path / 'store'}"
    argv = ["artifacts", "fetch", "--model", MODEL, "--version", version]
    return main([*argv, "--store", store, "--into", str(tmp_path / "into"), *extra])


def _left_in(tmp_path: Path) -> list[Path]:
    into = tmp_path / "into"
    return sorted(into.rglob("*")) if into.exists() else []


def test_a_signed_version_is_fetched_under_its_location_and_verified(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keys: KeyPair,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = _setup(tmp_path, monkeypatch, keys.private_key)
    assert _fetch(tmp_path, "--trust-key", str(keys.public_key)) == 0
    fetched = tmp_path / "into" / folder.name
    assert sorted(p.name for p in fetched.iterdir()) == sorted(p.name for p in folder.iterdir())
    assert (fetched / "model.onnx").read_bytes() == (folder / "model.onnx").read_bytes()
    assert (fetched / SIGNATURE_FILE).is_file() and (fetched / MANIFEST_FILE).is_file()
    assert f"signed by {keys.public_key}" in capsys.readouterr().out
    assert not [p for p in (tmp_path / "into").iterdir() if p.name.startswith(".")]
    # A re-run (a restarted init container) replaces what is there.
    assert _fetch(tmp_path, "--trust-key", str(keys.public_key)) == 0


def test_trusted_keys_come_from_the_settings_when_not_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: KeyPair
) -> None:
    folder = _setup(tmp_path, monkeypatch, None)
    monkeypatch.setenv("GRAYLANE_TRUSTED_KEYS", str(keys.public_key))
    assert _fetch(tmp_path) == 1
    assert _left_in(tmp_path) == []
    monkeypatch.delenv("GRAYLANE_TRUSTED_KEYS")
    assert _fetch(tmp_path) == 0
    assert (tmp_path / "into" / folder.name / "model.onnx").is_file()


def test_a_tampered_byte_is_refused_and_nothing_is_left(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keys: KeyPair,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = _setup(tmp_path, monkeypatch, keys.private_key)
    model = folder / "model.onnx"
    data = bytearray(model.read_bytes())
    data[100] ^= 0x01
    model.write_bytes(bytes(data))
    assert _fetch(tmp_path) == 1  # the sha256 check alone refuses it
    out = capsys.readouterr().out
    assert "refused" in out and "model.onnx" in out
    assert _left_in(tmp_path) == []


def test_an_unsigned_artifact_is_refused_with_a_trusted_key(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keys: KeyPair,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _setup(tmp_path, monkeypatch, None)
    assert _fetch(tmp_path, "--trust-key", str(keys.public_key)) == 1
    out = capsys.readouterr().out
    assert "refused" in out and "unsigned" in out.lower()
    assert _left_in(tmp_path) == []


def test_an_unknown_version_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _setup(tmp_path, monkeypatch, None)
    assert _fetch(tmp_path, version="9.9.9") == 1
    out = capsys.readouterr().out
    assert "error:" in out and "9.9.9" in out
    assert _left_in(tmp_path) == []


def test_a_missing_store_folder_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _setup(tmp_path, monkeypatch, None)
    (tmp_path / "elsewhere").mkdir()
    folder.rename(tmp_path / "elsewhere" / folder.name)
    assert _fetch(tmp_path) == 1
    assert "no such artifact folder" in capsys.readouterr().out
    assert _left_in(tmp_path) == []


def test_required_signatures_with_no_key_refuse_to_fetch_anything(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keys: KeyPair,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Regression (fail open): a fetch whose key Secret was absent or held no ``*.pub``
    warned and fetched unsigned artifacts; told to verify, it now refuses to start."""
    folder = _setup(tmp_path, monkeypatch, None)  # unsigned: served unchecked when open
    empty = tmp_path / "artifact-keys"
    empty.mkdir()  # the Secret's folder, mounted with no key in it
    monkeypatch.setenv("GRAYLANE_TRUSTED_KEYS", str(empty))
    assert _fetch(tmp_path, "--require-signatures") == 1
    out = capsys.readouterr().out
    assert "signatures are required" in out and "no trusted public key" in out
    assert str(empty) in out  # where it looked
    assert _left_in(tmp_path) == []
    monkeypatch.setenv("GRAYLANE_REQUIRE_SIGNATURES", "true")  # the setting, same refusal
    assert _fetch(tmp_path) == 1
    assert "no trusted public key" in capsys.readouterr().out
    assert _left_in(tmp_path) == []
    (empty / "notes.txt").write_text("no key")
    (empty / "broken.pub").write_text("not a key")  # a key that cannot be read: refused too
    assert _fetch(tmp_path) == 1
    assert "not a PEM public key" in capsys.readouterr().out
    monkeypatch.setenv("GRAYLANE_REQUIRE_SIGNATURES", "false")  # opened on purpose
    (empty / "broken.pub").unlink()
    assert _fetch(tmp_path) == 0
    assert (tmp_path / "into" / folder.name / "model.onnx").is_file()


def test_required_signatures_fetch_what_a_trusted_key_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: KeyPair
) -> None:
    folder = _setup(tmp_path, monkeypatch, keys.private_key)
    monkeypatch.setenv("GRAYLANE_TRUSTED_KEYS", str(keys.public_key.parent))
    assert _fetch(tmp_path, "--require-signatures") == 0
    assert (tmp_path / "into" / folder.name / SIGNATURE_FILE).is_file()


@pytest.mark.parametrize("key", ["../../../../outside", "x/../../../../../outside"])
def test_a_store_key_that_climbs_out_is_refused(tmp_path: Path, key: str) -> None:
    """Regression: the keys an object store lists were joined to the destination as
    written, so a key holding ``..`` wrote outside the fetch's folder."""
    import fsspec

    from graylane.artifacts.fetch import fetch_artifacts

    name = f"graylane-test-{tmp_path.name}"
    fs, _ = fsspec.core.url_to_fs(f"memory://{name}")
    for stored in ("art/model.onnx", f"art/{key}"):
        with fs.open(f"/{name}/{stored}", "wb") as f:
            f.write(b"x")
    into = tmp_path / "deep" / "er" / "into"
    art = ArtifactRecord(name=NAME, path="art", manifest_sha256="0" * 64, servable=True)
    try:
        with pytest.raises(ArtifactFetchError, match="climbs out"):
            fetch_artifacts([art], store=f"memory://{name}", into=into)  # type: ignore[list-item]
        assert not list(tmp_path.rglob("outside"))
        assert not [p for p in into.rglob("*")]
    finally:
        fs.rm(f"/{name}", recursive=True)


@pytest.mark.parametrize("location", ["/models/x", "../x", "a/../../x", ""])
def test_locations_that_cannot_travel_are_refused(location: str) -> None:
    with pytest.raises(ArtifactFetchError):
        store_relative(location)


def _engine_name(precision: Precision, trt: str = "10.7.0") -> ArtifactName:
    return ArtifactName(MODEL, Backend.TENSORRT, trt, precision, "demo", SemVer(1, 0, 0))


def _engine(tmp_path: Path, precision: Precision, cc: str, trt: str = "10.7.0") -> ArtifactName:
    """A TensorRT engine of demo 1.0.0 for one GPU, published and registered (bytes only:
    fetching copies and verifies files, it never runs them)."""
    name = _engine_name(precision, trt)
    plan = tmp_path / f"engine-{cc}.plan"
    plan.write_bytes(cc.encode() * 512)
    store = ArtifactStore(tmp_path / "store")

    def manifest(files: tuple[FileDigest, ...]) -> Manifest:
        return replace(_manifest(files), name=name, target=EngineTarget(cc, trt))

    folder = store.publish(name, [plan], manifest, compute_capability=cc)
    registry = open_registry(os.environ["GRAYLANE_DB_URL"])
    registry.add_artifact(
        ArtifactRecord(
            name=name,
            path=folder.name,
            manifest_sha256=manifest_sha256(folder),
            servable=True,
            gpu_compute_capability=cc,
        )
    )
    registry.engine.dispose()
    return name


def test_a_gpu_pod_fetches_only_the_engine_its_gpu_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    onnx = _setup(tmp_path, monkeypatch, None)
    _engine(tmp_path, Precision.FP16, "9.0")
    _engine(tmp_path, Precision.FP16, "8.9")
    _engine(tmp_path, Precision.INT8, "8.9")  # no int8 engine for an H100
    url, into = os.environ["GRAYLANE_DB_URL"], tmp_path / "into"
    h100 = FetchGpu("9.0", "10.7.0")
    store = f"file://{tmp_path / 'store'}"
    fetched = fetch_version(url, MODEL, "1.0.0", store=store, into=into, gpu=h100)
    assert sorted(f.location.name for f in fetched) == sorted(
        [onnx.name, artifact_dir_name(_engine_name(Precision.FP16), "9.0")]
    )
    assert sorted(p.name for p in into.iterdir()) == sorted(
        [FETCH_RECORD, *(f.location.name for f in fetched)]
    )
    record = FetchRecord.read(into, MODEL, "1.0.0")
    assert record is not None
    assert record.left_out[artifact_dir_name(_engine_name(Precision.FP16), "8.9")].startswith(
        "a TensorRT engine for another GPU (this one: compute capability 9.0, TensorRT 10.7.0)"
    )
    int8 = artifact_dir_name(_engine_name(Precision.INT8), "8.9")
    assert "no TensorRT engine fits" in record.left_out[int8]
    assert len(record.left_out) == 2
    # the loader's own choice on the other GPU: its fp16 and int8 engines
    l4 = fetch_version(
        url, MODEL, "1.0.0", store=store, into=tmp_path / "l4", gpu=FetchGpu("8.9", "10.7.0")
    )
    assert len([f for f in l4 if f.location.name.endswith("sm89")]) == 2


def test_a_gpu_pod_refuses_a_manifest_the_registry_does_not_know(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _setup(tmp_path, monkeypatch, None)
    name = _engine(tmp_path, Precision.FP16, "9.0")
    manifest = tmp_path / "store" / artifact_dir_name(name, "9.0") / MANIFEST_FILE
    manifest.write_text(manifest.read_text().replace("9.0", "8.9"))
    with pytest.raises(ArtifactFetchError, match="its manifest is not the registered one"):
        fetch_version(
            os.environ["GRAYLANE_DB_URL"],
            MODEL,
            "1.0.0",
            store=f"file://{tmp_path / 'store'}",
            into=tmp_path / "into",
            gpu=FetchGpu("9.0", "10.7.0"),
        )
    assert _left_in(tmp_path) == []


def test_this_gpu_without_a_gpu_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _setup(tmp_path, monkeypatch, None)
    if tensorrt_version() is not None and gpu_compute_capability() is not None:
        pytest.skip("this host has a GPU with TensorRT")
    assert _fetch(tmp_path, "--this-gpu") == 1
    assert "no GPU with TensorRT is visible" in capsys.readouterr().out
    assert _left_in(tmp_path) == []
