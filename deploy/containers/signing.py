"""Signed images: what ``make images`` builds is signed as podman pushes it to the local
registry, and podman pulls from there, under our policy, only what carries that signature.

How it is signed, and why this way:

* **GPG "simple signing", made and checked by podman itself.** ``podman push --sign-by
  FINGERPRINT`` signs the manifest digest it pushes, together with the reference it is
  pushed as, and stores the signature in the registry's lookaside store
  (``<registry>/lookaside/<repo>@sha256=<hex>/signature-1``; ``lookaside-staging`` and
  ``lookaside`` in a registries.d file). The sigstore form was tried first: cosign
  (``github.com/sigstore/cosign/v2/cmd/cosign`` v2.6.5) builds from the Go module proxy in
  about 8 minutes on two shared cores and its ``generate-key-pair`` works, but Debian 12's
  podman 4.3.1 is built without sigstore: ``podman push --sign-by-sigstore-private-key``
  fails and a ``sigstoreSigned`` policy refuses every image, both with "Debian-local
  change: sigstore disabled". GPG needs nothing built and is what this podman verifies.
* **The key** is an Ed25519 signing key generated with ``gpg --batch`` into a throwaway GPG
  home (``make images``: ``<GRAYLANE_LOCAL_DIR>/containers/signing``, git-ignored; tests:
  their own temporary folder), mode 0700, without a passphrase (the folder is the
  protection; it never leaves the machine and is never committed). Its public half is
  exported (``pubkey.asc``) for the policy. ``gpg-agent`` started by signing is stopped
  again (``SigningKey.close``).

How it is verified (``Trust``, written into a folder of its own for one registry):

* ``policy.json`` (``podman --signature-policy``): images of the registry's ``graylane``
  namespace must carry a ``signedBy`` GPG signature by that key whose identity is the
  repository they are pulled from (``matchRepository``: a copy of a signed image re-tagged
  under another name is refused, even with the signature copied beside it); everything
  else is accepted as before.
* ``home/.config/containers/registries.d/graylane.yaml``: the registry's lookaside store.
  podman reads ``$HOME/.config/containers/registries.d`` before the machine's
  ``/etc/containers/registries.d``, so our commands run with ``HOME`` pointing there and
  the machine's configuration is left as it is.
* The registry speaks plain HTTP on 127.0.0.1 only: ``--tls-verify=false``.

The form a cluster checks (``deploy/helm/graylane/README.md``): sigstore's policy-controller
admits images by a cosign signature stored in the registry as ``<repo>:sha256-<hex>.sig``.
``publish`` adds that one too, made with ``cosign sign --key`` (a cosign key pair made once
per clone with ``cosign generate-key-pair``, a random passphrase in a 0600 file beside it;
``--tlog-upload=false``: nothing leaves the machine) and checked with ``cosign verify
--key``. cosign is built once (``COSIGN``, cached in ``~/.cache/graylane``; 477 s on two
shared cores here, the module downloads included).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from graylane.deploy.containers.podman import ContainerToolError, Podman, containers_dir, say
from graylane.deploy.containers.tools import GoTool
from graylane.deploy.kafka.layout import file_lock
from graylane.deploy.registry import registry as local_registry

__all__ = [
    "COSIGN",
    "KEY_UID",
    "NAMESPACE",
    "SIGNATURE_REFUSED",
    "CosignKey",
    "Published",
    "SignedRegistry",
    "SigningKey",
    "Trust",
    "cosign_sign",
    "cosign_verify",
    "generate_cosign_key",
    "generate_key",
    "local_key",
    "policy_document",
    "publish",
    "write_trust",
]

COSIGN = GoTool(
    name="cosign", module="github.com/sigstore/cosign/v2/cmd/cosign", version="v2.6.5", shared=True
)
NAMESPACE = "graylane"
KEY_UID = "Graylane local image signing <images@graylane.invalid>"
SIGNATURE_REFUSED = "A signature was required, but no signature exists"
"""podman's words when the policy requires a signature that the image does not carry."""


def _gpg() -> str:
    found = shutil.which("gpg")
    if not found:
        raise ContainerToolError("gpg is needed to sign images (apt-get install gnupg)")
    return found


@dataclass(frozen=True, kw_only=True)
class SigningKey:
    """A GPG signing key in a GPG home of its own, and its exported public half."""

    home: Path
    fingerprint: str
    public: Path

    def env(self) -> dict[str, str]:
        return {"GNUPGHOME": str(self.home)}

    def push_options(self) -> list[str]:
        return ["--sign-by", self.fingerprint]

    def close(self) -> None:
        """Stop the gpg-agent that signing started for this home (none: nothing to do)."""
        if shutil.which("gpgconf"):
            subprocess.run(
                ["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"],
                capture_output=True,
                check=False,
            )


def _fingerprint(home: Path) -> str | None:
    res = subprocess.run(
        [_gpg(), "--homedir", str(home), "--with-colons", "--list-secret-keys"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in res.stdout.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    return None


def generate_key(folder: Path) -> SigningKey:
    """A fresh Ed25519 signing key in the GPG home ``folder/gnupg``; ``folder/pubkey.asc``."""
    home = folder / "gnupg"
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True, mode=0o700)
    os.chmod(folder, 0o700)
    res = subprocess.run(
        [
            _gpg(),
            "--batch",
            "--homedir",
            str(home),
            "--passphrase",
            "",
            "--quick-generate-key",
            KEY_UID,
            "ed25519",
            "sign",
            "never",
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    fingerprint = _fingerprint(home)
    if res.returncode != 0 or fingerprint is None:
        raise ContainerToolError(f"gpg --quick-generate-key failed:\n{res.stderr[-2000:]}")
    public = folder / "pubkey.asc"
    exported = subprocess.run(
        [_gpg(), "--homedir", str(home), "--armor", "--export", fingerprint],
        capture_output=True,
        check=False,
    )
    if exported.returncode != 0 or not exported.stdout:
        raise ContainerToolError(f"gpg --export failed: {exported.stderr.decode()[-2000:]}")
    public.write_bytes(exported.stdout)
    key = SigningKey(home=home, fingerprint=fingerprint, public=public)
    key.close()
    return key


def local_key() -> SigningKey:
    """This clone's signing key (``<GRAYLANE_LOCAL_DIR>/containers/signing``), made once."""
    folder = containers_dir() / "signing"
    with file_lock(containers_dir() / ".signing.lock"):
        fingerprint = _fingerprint(folder / "gnupg") if (folder / "gnupg").is_dir() else None
        public = folder / "pubkey.asc"
        if fingerprint is None or not public.is_file():
            say(f"signing: a new GPG signing key in {folder}")
            return generate_key(folder)
    return SigningKey(home=folder / "gnupg", fingerprint=fingerprint, public=public)


@dataclass(frozen=True, kw_only=True)
class CosignKey:
    """A cosign key pair (``cosign.key``, ``cosign.pub``) and its passphrase's file."""

    private: Path
    public: Path
    passphrase: Path

    @classmethod
    def at(cls, folder: Path) -> CosignKey:
        return cls(
            private=folder / "cosign.key",
            public=folder / "cosign.pub",
            passphrase=folder / "passphrase",
        )

    def exists(self) -> bool:
        return all(p.is_file() for p in (self.private, self.public, self.passphrase))


def generate_cosign_key(folder: Path) -> CosignKey:
    """A fresh cosign key pair in ``folder`` (``cosign generate-key-pair``)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    key = CosignKey.at(folder)
    phrase = secrets.token_hex(24)
    fd = os.open(key.passphrase, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(phrase)
    for old in (key.private, key.public):
        old.unlink(missing_ok=True)
    res = subprocess.run(
        [str(COSIGN.ensure()), "generate-key-pair"],
        cwd=folder,
        env={**os.environ, "COSIGN_PASSWORD": phrase},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if res.returncode != 0 or not key.exists():
        raise ContainerToolError(f"cosign generate-key-pair failed:\n{res.stderr[-2000:]}")
    os.chmod(key.private, 0o600)
    return key


_COSIGN_LOCAL = ("--allow-http-registry", "--allow-insecure-registry")  # loopback, plain HTTP


def cosign_sign(key: CosignKey, ref: str, digest: str) -> None:
    """``ref``'s manifest ``digest`` signed with ``key``; the signature pushed beside it."""
    repo = ref.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]  # the tag dropped: the digest names the image
    res = subprocess.run(
        [
            str(COSIGN.ensure()),
            "sign",
            "--yes",
            "--tlog-upload=false",
            *_COSIGN_LOCAL,
            "--key",
            str(key.private),
            f"{repo}@{digest}",
        ],
        env={**os.environ, "COSIGN_PASSWORD": key.passphrase.read_text()},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
        timeout=300,
    )
    if res.returncode != 0:
        raise ContainerToolError(f"cosign sign {repo}@{digest} failed:\n{res.stderr[-2000:]}")


def cosign_verify(public: Path, ref: str) -> subprocess.CompletedProcess[str]:
    """``cosign verify --key public ref`` (``check=False``: a refusal is an outcome)."""
    return subprocess.run(
        [
            str(COSIGN.ensure()),
            "verify",
            "--key",
            str(public),
            "--insecure-ignore-tlog=true",
            *_COSIGN_LOCAL,
            ref,
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
        timeout=300,
    )


def local_cosign_key() -> CosignKey:
    """This clone's cosign key pair (``<GRAYLANE_LOCAL_DIR>/containers/signing/cosign``)."""
    folder = containers_dir() / "signing" / "cosign"
    with file_lock(containers_dir() / ".signing.lock"):
        key = CosignKey.at(folder)
        if not key.exists():
            say(f"signing: a new cosign key pair in {folder}")
            key = generate_cosign_key(folder)
    return key


@dataclass(frozen=True, kw_only=True)
class Trust:
    """The policy and registries.d that make podman require our signature on one registry."""

    registry: str  # host:port
    policy: Path
    home: Path
    public_key: Path

    def env(self) -> dict[str, str]:
        """For each podman command that pushes to or pulls from the registry."""
        return {"HOME": str(self.home)}

    def pull_options(self) -> list[str]:
        return ["--tls-verify=false", "--signature-policy", str(self.policy)]


def policy_document(
    registry: str, public_key: Path, namespace: str = NAMESPACE
) -> dict[str, object]:
    """containers-policy.json: ``registry/namespace`` signed by ``public_key``, else as before."""
    return {
        "default": [{"type": "insecureAcceptAnything"}],
        "transports": {
            "docker": {
                f"{registry}/{namespace}": [
                    {
                        "type": "signedBy",
                        "keyType": "GPGKeys",
                        "keyPath": str(public_key),
                        "signedIdentity": {"type": "matchRepository"},
                    }
                ]
            }
        },
    }


def write_trust(folder: Path, registry: str, lookaside: Path, public_key: Path) -> Trust:
    """``policy.json`` and a registries.d for ``registry`` (host:port) whose signatures are
    kept in ``lookaside``, written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    policy = folder / "policy.json"
    policy.write_text(json.dumps(policy_document(registry, public_key), indent=2) + "\n")
    home = folder / "home"
    registries_d = home / ".config" / "containers" / "registries.d"
    registries_d.mkdir(parents=True, exist_ok=True)
    store = lookaside.resolve().as_uri()
    (registries_d / "graylane.yaml").write_text(
        "# Written by deploy/containers/signing.py: where the registry's signatures are.\n"
        + yaml.safe_dump({"docker": {registry: {"lookaside": store, "lookaside-staging": store}}})
    )
    return Trust(registry=registry, policy=policy, home=home, public_key=public_key)


@dataclass(frozen=True, kw_only=True)
class SignedRegistry:
    """Push (signed or not) to a local registry and pull from it under the policy."""

    podman: Podman
    trust: Trust
    key: SigningKey

    def ref(self, name: str, tag: str) -> str:
        return f"{self.trust.registry}/{NAMESPACE}/{name}:{tag}"

    def push(self, local: str, name: str, tag: str, *, sign: bool = True) -> tuple[str, str]:
        """``local`` pushed as ``<registry>/graylane/name:tag``; (reference, digest)."""
        remote = self.ref(name, tag)
        digest_file = self.trust.home / f".digest-{secrets.token_hex(4)}"
        options: Sequence[str] = self.key.push_options() if sign else ()
        try:
            self.podman.run(
                [
                    "push",
                    "--tls-verify=false",
                    "--remove-signatures",  # only ours, made now, travel with it
                    "--digestfile",
                    str(digest_file),
                    *options,
                    local,
                    f"docker://{remote}",
                ],
                env={**self.trust.env(), **self.key.env()},
                timeout=900,
            )
        finally:
            if sign:
                self.key.close()
        digest = digest_file.read_text().strip()
        digest_file.unlink()
        say(f"pushed {remote} ({'signed' if sign else 'unsigned'}) {digest}")
        return remote, digest

    def pull(self, ref: str) -> subprocess.CompletedProcess[str]:
        """``podman pull`` under the policy (``check=False``: a refusal is an outcome)."""
        return self.podman.run(
            ["pull", *self.trust.pull_options(), ref],
            check=False,
            env=self.trust.env(),
            timeout=900,
        )


@dataclass(frozen=True, kw_only=True)
class Published:
    """An image signed into the local registry, and the trust files that verify it."""

    ref: str
    digest: str
    trust: Trust
    cosign_public: Path | None


def publish(podman: Podman, local: str, *, cosign: bool = True) -> Published:
    """``local`` (``localhost/NAME:TAG``) signed with this clone's key into the local registry
    (started when it is not running) as ``<registry>/graylane/NAME:TAG``, then pulled back
    under the policy: the signature is checked before this returns. With ``cosign``, the
    cosign signature a cluster checks is added and verified too."""
    reg = local_registry.start()
    key = local_key()
    trust = write_trust(containers_dir() / "trust", reg.address, reg.lookaside, key.public)
    signed = SignedRegistry(podman=podman, trust=trust, key=key)
    name, tag = local.rsplit("/", 1)[-1].rsplit(":", 1)
    ref, digest = signed.push(local, name, tag)
    res = signed.pull(ref)
    if res.returncode != 0:
        raise ContainerToolError(f"{ref} was pushed but its signature is refused:\n{res.stderr}")
    say(f"signature verified: {ref}@{digest} (policy {trust.policy})")
    if not cosign:
        return Published(ref=ref, digest=digest, trust=trust, cosign_public=None)
    if not COSIGN.path().is_file():
        say("cosign: built once from its Go module (about 8 minutes on two cores)")
    cosign_key = local_cosign_key()
    cosign_sign(cosign_key, ref, digest)
    checked = cosign_verify(cosign_key.public, ref)
    if checked.returncode != 0:
        raise ContainerToolError(f"cosign verify {ref} failed:\n{checked.stderr[-2000:]}")
    say(f"cosign signature verified: {ref} (key {cosign_key.public})")
    return Published(ref=ref, digest=digest, trust=trust, cosign_public=cosign_key.public)
