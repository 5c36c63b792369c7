"""Signed artifacts: offline key pairs, signing on publish, and every way a signature fails."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from graylane.app.cli.build import EXIT_ERROR, EXIT_OK, register
from graylane.artifacts.manifest import BuildHost, FileDigest, Manifest
from graylane.artifacts.naming import ArtifactName, Backend, Precision, SemVer
from graylane.artifacts.signing import (
    SIGNATURE_FILE,
    ArtifactSignatureError,
    KeyPair,
    RefusedArtifact,
    SignatureFailure,
    TrustedKeyError,
    generate_key_pair,
    sign_artifact,
    verify_signature,
)
from graylane.builder.store import ArtifactStore
from graylane.engine.signature import IOSignature
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.observer import WorkerObserver
from graylane.settings import Settings, SettingsError


@pytest.fixture
def keys(tmp_path: Path) -> KeyPair:
    return generate_key_pair(tmp_path / "keys" / "builder.pem")


@pytest.fixture
def other_keys(tmp_path: Path) -> KeyPair:
    return generate_key_pair(tmp_path / "keys" / "other.pem")


def _artifact(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(bytes(range(256)) * 64)
    (folder / "manifest.json").write_text('{"name": "demo"}\n')
    return folder


def test_a_key_pair_is_pem_private_only_to_its_owner_and_never_overwritten(
    keys: KeyPair,
) -> None:
    assert keys.public_key == keys.private_key.with_suffix(".pub")
    assert keys.private_key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert keys.public_key.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert stat.S_IMODE(keys.private_key.stat().st_mode) == 0o600
    before = keys.private_key.read_bytes()
    with pytest.raises(FileExistsError, match=r"builder\.pem"):
        generate_key_pair(keys.private_key)
    assert keys.private_key.read_bytes() == before


def test_a_signed_artifact_verifies_against_the_key_that_signed_it(
    tmp_path: Path, keys: KeyPair, other_keys: KeyPair
) -> None:
    folder = _artifact(tmp_path / "art")
    signature = sign_artifact(folder, keys.private_key)
    assert signature == folder / SIGNATURE_FILE and signature.stat().st_size > 0
    assert verify_signature(folder, [keys.public_key]) == keys.public_key
    # any one trusted key suffices; the one that signed is reported
    assert verify_signature(folder, [other_keys.public_key, keys.public_key]) == keys.public_key


def _refusal(folder: Path, trusted: list[Path]) -> ArtifactSignatureError:
    with pytest.raises(ArtifactSignatureError) as caught:
        verify_signature(folder, trusted)
    return caught.value


def test_one_altered_byte_is_refused_naming_the_file(tmp_path: Path, keys: KeyPair) -> None:
    folder = _artifact(tmp_path / "art")
    sign_artifact(folder, keys.private_key)
    model = folder / "model.onnx"
    data = bytearray(model.read_bytes())
    data[1000] ^= 0x01
    model.write_bytes(bytes(data))
    error = _refusal(folder, [keys.public_key])
    assert error.reason is SignatureFailure.TAMPERED
    assert error.folder == folder
    assert "model.onnx was altered" in str(error) and str(folder) in str(error)


def test_an_added_or_removed_file_is_refused_naming_it(tmp_path: Path, keys: KeyPair) -> None:
    folder = _artifact(tmp_path / "art")
    sign_artifact(folder, keys.private_key)
    (folder / "tokenizer.json").write_text("{}")
    error = _refusal(folder, [keys.public_key])
    assert error.reason is SignatureFailure.TAMPERED
    assert "tokenizer.json was added" in str(error)
    (folder / "tokenizer.json").unlink()
    (folder / "manifest.json").unlink()
    error = _refusal(folder, [keys.public_key])
    assert error.reason is SignatureFailure.TAMPERED
    assert "manifest.json was removed" in str(error)


def test_a_signature_by_another_key_is_refused(
    tmp_path: Path, keys: KeyPair, other_keys: KeyPair
) -> None:
    folder = _artifact(tmp_path / "art")
    sign_artifact(folder, other_keys.private_key)
    error = _refusal(folder, [keys.public_key])
    assert error.reason is SignatureFailure.UNTRUSTED_KEY
    assert "not trusted" in str(error) and str(keys.public_key) in str(error)


def test_an_unsigned_or_garbled_signature_is_refused(tmp_path: Path, keys: KeyPair) -> None:
    folder = _artifact(tmp_path / "art")
    error = _refusal(folder, [keys.public_key])
    assert error.reason is SignatureFailure.UNSIGNED
    assert f"no {SIGNATURE_FILE}" in str(error)
    (folder / SIGNATURE_FILE).write_text("not a bundle")
    error = _refusal(folder, [keys.public_key])
    assert error.reason is SignatureFailure.MALFORMED
    with pytest.raises(ValueError, match="at least one trusted key"):
        verify_signature(folder, [])


def test_an_unreadable_trusted_key_is_a_configuration_error(tmp_path: Path, keys: KeyPair) -> None:
    folder = _artifact(tmp_path / "art")
    sign_artifact(folder, keys.private_key)
    with pytest.raises(TrustedKeyError, match=r"missing\.pub"):
        verify_signature(folder, [tmp_path / "missing.pub"])
    with pytest.raises(TrustedKeyError, match="not a PEM public key"):
        verify_signature(folder, [keys.private_key])  # the private key, by mistake


NAME = ArtifactName("demo", Backend.ONNXRUNTIME, "1.23", Precision.FP32, "demo", SemVer(1, 0, 0))


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


def _publish(store: ArtifactStore, source: Path) -> Path:
    return store.publish(NAME, [source], _manifest)


def test_the_store_signs_what_it_publishes_only_with_a_key(tmp_path: Path, keys: KeyPair) -> None:
    source = tmp_path / "model.onnx"
    source.write_bytes(b"\x08\x07" * 100)
    signed = _publish(ArtifactStore(tmp_path / "signed", signing_key=keys.private_key), source)
    assert (signed / SIGNATURE_FILE).is_file()
    assert verify_signature(signed, [keys.public_key]) == keys.public_key
    unsigned = _publish(ArtifactStore(tmp_path / "unsigned"), source)
    assert not (unsigned / SIGNATURE_FILE).exists()
    assert not list((tmp_path / "signed" / ".staging").iterdir())


def test_settings_read_the_signing_and_trusted_keys(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pub", tmp_path / "b.pub"
    settings = Settings.from_env(
        {"GRAYLANE_SIGNING_KEY": "/k/b.pem", "GRAYLANE_TRUSTED_KEYS": f"{a}:{b}"}
    )
    assert settings.signing_key == Path("/k/b.pem")
    assert settings.trusted_keys == (a, b)
    assert Settings.from_env({}).trusted_keys == () and Settings.from_env({}).signing_key is None


def test_a_trusted_keys_folder_stands_for_its_public_keys(tmp_path: Path) -> None:
    keys = tmp_path / "artifact-keys"
    keys.mkdir()
    (keys / "b.pub").write_text("b")
    (keys / "a.pub").write_text("a")
    (keys / "notes.txt").write_text("not a key")
    single = tmp_path / "c.pem"
    env = {"GRAYLANE_TRUSTED_KEYS": f"{keys}:{single}"}
    assert Settings.from_env(env).trusted_keys == (keys / "a.pub", keys / "b.pub", single)
    (tmp_path / "empty").mkdir()  # an optional key Secret that is absent
    assert Settings.from_env({"GRAYLANE_TRUSTED_KEYS": str(tmp_path / "empty")}).trusted_keys == ()
    missing = tmp_path / "missing.pub"  # a named file stays, to be refused when read
    assert Settings.from_env({"GRAYLANE_TRUSTED_KEYS": str(missing)}).trusted_keys == (missing,)


def test_refused_artifacts_are_counted_by_reason() -> None:
    refused = (
        RefusedArtifact("m-onnx-fp16-demo@1.0.0", SignatureFailure.UNSIGNED, "unsigned"),
        RefusedArtifact("m-onnx-int8-demo@1.0.0", SignatureFailure.TAMPERED, "altered"),
        RefusedArtifact("m-onnx-int8-dynamic-demo@1.0.0", SignatureFailure.TAMPERED, "added"),
    )
    observer = WorkerObserver(
        WorkerConfig(model="m", version="1.0.0", initial_variant="fp32", refused_artifacts=refused)
    )

    def count(reason: str) -> float | None:
        return observer.registry.get_sample_value(
            "graylane_artifact_verification_failures_total",
            {"model": "m", "version": "1.0.0", "reason": reason},
        )

    assert count("unsigned") == 1.0
    assert count("tampered") == 2.0
    assert count("untrusted_key") is None
    # an artifact altered after start is refused by the engine reload: counted too
    observer.count_refused(
        (RefusedArtifact("m-onnx-fp16-demo@1.0.0", SignatureFailure.TAMPERED, "altered"),)
    )
    assert count("tampered") == 3.0
    assert count("unsigned") == 1.0


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="graylane")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_generates_keys_and_verify_artifact_checks_the_signature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private = tmp_path / "k" / "signing.pem"
    args = _cli(["keys", "generate", str(private)])
    assert args.handler(args) == EXIT_OK
    assert private.is_file() and private.with_suffix(".pub").is_file()
    assert args.handler(args) == EXIT_ERROR  # never overwrites
    source = tmp_path / "model.onnx"
    source.write_bytes(b"\x01\x02" * 50)
    folder = _publish(ArtifactStore(tmp_path / "store", signing_key=private), source)
    capsys.readouterr()
    args = _cli(["verify-artifact", str(folder), "--trust-key", str(private.with_suffix(".pub"))])
    assert args.handler(args) == EXIT_OK
    assert "signed by" in capsys.readouterr().out
    (folder / SIGNATURE_FILE).unlink()
    assert args.handler(args) == EXIT_ERROR
    out = capsys.readouterr().out
    assert "REFUSED" in out and "unsigned" in out


def _serve_worker(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    argv = ["serve", "worker", "--model", "demo", "--version", "1.0.0", *flags]
    return subprocess.run(
        [sys.executable, "-m", "graylane.app.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GRAYLANE_DB_URL": "sqlite:////nonexistent/registry.db", **env},
    )


def test_a_worker_told_to_verify_with_no_key_refuses_to_start(tmp_path: Path) -> None:
    """Regression (fail open): with the key Secret absent or holding no ``*.pub`` the
    worker warned and served unsigned or re-signed artifacts."""
    empty = tmp_path / "artifact-keys"
    empty.mkdir()
    for env, flags in [
        ({"GRAYLANE_TRUSTED_KEYS": str(empty)}, ("--from-registry", "--require-signatures")),
        ({"GRAYLANE_REQUIRE_SIGNATURES": "true"}, ("--from-registry",)),
    ]:
        ran = _serve_worker(env, *flags)
        assert ran.returncode == 1, ran.stderr
        assert "worker refuses to start" in ran.stderr
        assert "no trusted public key was found" in ran.stderr
        assert "Traceback" not in ran.stderr
    assert (
        str(empty)
        in _serve_worker(
            {"GRAYLANE_TRUSTED_KEYS": str(empty), "GRAYLANE_REQUIRE_SIGNATURES": "1"},
            "--from-registry",
        ).stderr
    )
    # nothing to verify outside the registry: the flag is refused there, not ignored
    ran = _serve_worker({}, "--variant", "fp32=/x.onnx", "--require-signatures")
    assert ran.returncode == 1 and "use it with --from-registry" in ran.stderr


def test_loading_with_required_signatures_and_no_key_refuses_before_the_registry(
    tmp_path: Path,
) -> None:
    from graylane.engine_worker.loading import load_from_registry

    settings = Settings(
        db_url="sqlite:////nonexistent/registry.db",
        artifact_dir=tmp_path,
        require_signatures=True,
        trusted_keys_source=str(tmp_path / "artifact-keys"),
    )
    with pytest.raises(TrustedKeyError, match="no trusted public key") as raised:
        load_from_registry(settings, "demo", "1.0.0")
    assert str(tmp_path / "artifact-keys") in str(raised.value)
    broken = tmp_path / "broken.pub"
    broken.write_text("not a key")
    with pytest.raises(TrustedKeyError, match="not a PEM public key"):
        load_from_registry(settings.with_overrides(trusted_keys=(broken,)), "demo", "1.0.0")


def test_settings_read_require_signatures() -> None:
    assert Settings.from_env({}).require_signatures is False
    for raw, wanted in [("true", True), ("1", True), ("on", True), ("false", False), ("0", False)]:
        env = {"GRAYLANE_REQUIRE_SIGNATURES": raw}
        assert Settings.from_env(env).require_signatures is wanted
    with pytest.raises(SettingsError, match="expected true or false"):
        Settings.from_env({"GRAYLANE_REQUIRE_SIGNATURES": "maybe"})
