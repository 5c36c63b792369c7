"""Signed artifacts: the builder signs each published artifact, a worker verifies it.

Signing uses the OpenSSF ``model-signing`` library with an elliptic-curve (P-256) key
pair, so it works offline: no Sigstore, no network. The signature covers every file of
the artifact folder (the manifest included) and lies beside them as
:data:`SIGNATURE_FILE`, a Sigstore bundle. A verifier holds one or more trusted public
keys; an artifact verifies when its signature was made by one of them and every file
still matches it (no file altered, added or removed).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from graylane.errors import GraylaneError

__all__ = [
    "SIGNATURE_FILE",
    "ArtifactSignatureError",
    "KeyPair",
    "RefusedArtifact",
    "SignatureFailure",
    "TrustedKeyError",
    "check_public_key",
    "generate_key_pair",
    "require_trusted_keys",
    "sign_artifact",
    "verify_signature",
]

SIGNATURE_FILE = "model.sig"
"""The signature bundle inside an artifact folder (itself not covered by the signature)."""


class SignatureFailure(Enum):
    """Why an artifact's signature does not verify (the metric's ``reason`` label)."""

    UNSIGNED = "unsigned"
    """The folder holds no signature."""
    UNTRUSTED_KEY = "untrusted_key"
    """Signed, but by a key this verifier does not trust."""
    TAMPERED = "tampered"
    """Signed by a trusted key, but a file was altered, added or removed since."""
    MALFORMED = "malformed"
    """The signature file cannot be read as a signature bundle."""


class ArtifactSignatureError(GraylaneError):
    """An artifact's signature does not verify against the trusted keys."""

    def __init__(self, message: str, reason: SignatureFailure, folder: Path) -> None:
        super().__init__(message)
        self.reason = reason
        self.folder = folder


class TrustedKeyError(GraylaneError):
    """A configured trusted key cannot be read (a configuration error, not an artifact's)."""


@dataclass(frozen=True)
class RefusedArtifact:
    """An artifact a worker did not load because its signature did not verify."""

    artifact: str
    reason: SignatureFailure
    message: str


@dataclass(frozen=True)
class KeyPair:
    private_key: Path
    public_key: Path


def generate_key_pair(private_key: Path, public_key: Path | None = None) -> KeyPair:
    """Write a new P-256 key pair as PEM: the private key (mode 0600) and its public key.

    ``public_key`` defaults to the private key's path with ``.pub``. Existing files
    are not overwritten.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = public_key or private_key.with_suffix(".pub")
    for path in (private_key, public):
        if path.exists():
            raise FileExistsError(f"{path} already exists; not overwriting a key")
    key = ec.generate_private_key(ec.SECP256R1())
    private_key.parent.mkdir(parents=True, exist_ok=True)
    public.parent.mkdir(parents=True, exist_ok=True)
    private_key.touch(mode=0o600)
    private_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return KeyPair(private_key, public)


def sign_artifact(folder: Path, private_key: Path) -> Path:
    """Sign every file of ``folder`` with ``private_key``; returns the signature's path."""
    import model_signing

    # model-signing's Config constructors carry no annotations.
    hashing = model_signing.hashing.Config().set_ignored_paths(  # type: ignore[no-untyped-call]
        paths=[SIGNATURE_FILE], ignore_git_paths=False
    )
    signature = folder / SIGNATURE_FILE
    model_signing.signing.Config().use_elliptic_key_signer(  # type: ignore[no-untyped-call]
        private_key=private_key
    ).set_hashing_config(hashing).sign(folder, signature)
    return signature


_KEY_MISMATCH = "Key mismatch"
_SIGNATURE_MISMATCH = "Signature mismatch"
_DIFF_FILE = re.compile(r"Hash mismatch for '([^']+)'")
_DIFF_SET = re.compile(r"(Extra|Missing) files (?:found )?in model '[^']*': ([^'\"\]]+)")


def verify_signature(folder: Path, trusted_keys: Sequence[Path]) -> Path:
    """Check ``folder``'s signature against ``trusted_keys``; returns the key that signed it.

    Raises :class:`ArtifactSignatureError` with the reason and, for a tampered
    artifact, the files that differ from what was signed.
    """
    import model_signing

    if not trusted_keys:
        raise ValueError("verify_signature needs at least one trusted key")
    for key in trusted_keys:
        check_public_key(key)
    signature = folder / SIGNATURE_FILE
    if not signature.is_file():
        raise ArtifactSignatureError(
            f"{folder}: unsigned (no {SIGNATURE_FILE}); refusing it",
            SignatureFailure.UNSIGNED,
            folder,
        )
    for key in trusted_keys:
        try:
            verifier = model_signing.verifying.Config()  # type: ignore[no-untyped-call]
            verifier.use_elliptic_key_verifier(public_key=key).verify(folder, signature)
        except ValueError as exc:
            text = str(exc)
            if text.startswith(_KEY_MISMATCH):
                continue  # signed by another key; try the next trusted one
            if text.startswith(_SIGNATURE_MISMATCH):
                raise ArtifactSignatureError(
                    f"{folder}: signed by {key}, but {_describe_diff(text)} since it was "
                    "signed; refusing it",
                    SignatureFailure.TAMPERED,
                    folder,
                ) from None
            raise _malformed(folder, signature, exc) from None
        except Exception as exc:  # the bundle is not JSON, not a bundle, ...
            raise _malformed(folder, signature, exc) from None
        return key
    names = ", ".join(str(k) for k in trusted_keys)
    raise ArtifactSignatureError(
        f"{signature}: signed by a key that is not trusted (trusted: {names}); refusing it",
        SignatureFailure.UNTRUSTED_KEY,
        folder,
    )


def check_public_key(path: Path) -> None:
    """Raise :class:`TrustedKeyError` unless ``path`` holds a PEM public key."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise TrustedKeyError(f"trusted key {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise TrustedKeyError(f"trusted key {path}: not a PEM public key") from None


def require_trusted_keys(keys: Sequence[Path], looked_in: str) -> tuple[Path, ...]:
    """``keys``, each a readable PEM public key, for a process told to verify signatures.

    Fails closed: with no key at all (a key folder left empty, a Secret not mounted)
    or one that cannot be read, raises :class:`TrustedKeyError` saying where it looked,
    so the process refuses to start instead of serving artifacts unchecked.
    """
    if not keys:
        raise TrustedKeyError(
            "signatures are required (--require-signatures or "
            "GRAYLANE_REQUIRE_SIGNATURES) but no trusted public key was found "
            f"(looked in: {looked_in or 'nothing configured'}); provide the builder's "
            "public key (*.pub) through GRAYLANE_TRUSTED_KEYS or --trust-key"
        )
    for key in keys:
        check_public_key(key)
    return tuple(keys)


def _malformed(folder: Path, signature: Path, exc: Exception) -> ArtifactSignatureError:
    return ArtifactSignatureError(
        f"{signature}: not a readable signature ({type(exc).__name__}: {exc}); refusing it",
        SignatureFailure.MALFORMED,
        folder,
    )


def _describe_diff(text: str) -> str:
    parts = [f"{name} was altered" for name in _DIFF_FILE.findall(text)]
    for kind, names in _DIFF_SET.findall(text):
        verb = "added" if kind == "Extra" else "removed"
        parts.append(f"{names.strip()} {'was' if ',' not in names else 'were'} {verb}")
    return "; ".join(parts) or "its files changed"
