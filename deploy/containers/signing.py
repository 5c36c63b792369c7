"""Signed images: what ``make images`` builds is signed as podman pushes it to the local
registry, and podman pulls from there, under our policy, only what carries that signature.

How it is signed, and why this way:

* **sigstore signatures made by podman itself.** ``podman push
  --sign-by-sigstore-private-key KEY --sign-passphrase-file FILE`` signs the manifest digest
  it pushes and stores the signature in the registry beside the image, as the cosign-style
  attachment ``<repo>:sha256-<digest>.sig`` (``use-sigstore-attachments: true`` in a
  registries.d file). No lookaside web server or folder has to travel with the image, and
  a cluster verifies the very same signature with sigstore's policy-controller (see
  ``deploy/helm/graylane/README.md``). GPG "simple signing" (``--sign-by KEYID``) would
  also work here but needs a lookaside store served next to the registry; sigstore keeps
  everything in the registry.
* **The key pair** is a cosign-format ECDSA P-256 pair made by ``cosign generate-key-pair``
  (``COSIGN``: ``github.com/sigstore/cosign/v2/cmd/cosign`` built once from the Go module
  proxy and cached in ``~/.cache/graylane``). cosign is used for nothing else: podman signs
  and verifies. The pair is generated on this machine into a throwaway folder (``make
  images``: ``<GRAYLANE_LOCAL_DIR>/containers/signing``, git-ignored; tests: their own
  temporary folder) with a random passphrase kept in a 0600 file beside it; it is never
  committed. The public key is what the policy names.

How it is verified (``Trust``, written into a folder of its own for one registry):

* ``policy.json`` (``podman --signature-policy``): images of the registry's ``graylane``
  namespace must carry a ``sigstoreSigned`` signature by that key whose identity is the
  repository they are pulled from (``matchRepository``: a copy of a signed image re-tagged
  under another name is refused); everything else is accepted as before.
* ``home/.config/containers/registries.d/graylane.yaml``: ``use-sigstore-attachments: true``
  for the registry. podman reads ``$HOME/.config/containers/registries.d`` before the
  machine's ``/etc/containers/registries.d``, so our commands run with ``HOME`` pointing
  there and the machine's configuration is left as it is.
* The registry speaks plain HTTP on 127.0.0.1 only: ``--tls-verify=false``.
"""

from __future__ import annotations

import json
import os
import secrets
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
    "NAMESPACE",
    "SIGNATURE_REFUSED",
    "SignedRegistry",
    "SigningKey",
    "Trust",
    "generate_key",
    "local_key",
    "publish",
    "write_trust",
]

COSIGN = GoTool(
    name="cosign", module="github.com/sigstore/cosign/v2/cmd/cosign", version="v2.6.5", shared=True
)
NAMESPACE = "graylane"
SIGNATURE_REFUSED = "A signature was required, but no signature exists"
"""podman's words when the policy requires a signature that the image does not carry."""


@dataclass(frozen=True, kw_only=True)
class SigningKey:
    """A cosign-format key pair and the file holding the private key's passphrase."""

    private: Path
    public: Path
    passphrase: Path

    def push_options(self) -> list[str]:
        return [
            "--sign-by-sigstore-private-key",
            str(self.private),
            "--sign-passphrase-file",
            str(self.passphrase),
        ]


def generate_key(folder: Path) -> SigningKey:
    """A fresh key pair in ``folder`` (``cosign.key``, ``cosign.pub``, ``passphrase``)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    key = SigningKey(
        private=folder / "cosign.key",
        public=folder / "cosign.pub",
        passphrase=folder / "passphrase",
    )
    phrase = secrets.token_hex(24)
    fd = os.open(key.passphrase, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(phrase)  # podman reads the file as it is, without a trailing newline
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
    if res.returncode != 0 or not key.private.is_file() or not key.public.is_file():
        raise ContainerToolError(f"cosign generate-key-pair failed:\n{res.stderr[-2000:]}")
    os.chmod(key.private, 0o600)
    return key


def local_key() -> SigningKey:
    """This clone's signing key (``<GRAYLANE_LOCAL_DIR>/containers/signing``), made once."""
    folder = containers_dir() / "signing"
    key = SigningKey(
        private=folder / "cosign.key",
        public=folder / "cosign.pub",
        passphrase=folder / "passphrase",
    )
    with file_lock(containers_dir() / ".signing.lock"):
        if not (key.private.is_file() and key.public.is_file() and key.passphrase.is_file()):
            say(f"signing: a new key pair in {folder} (cosign generate-key-pair)")
            key = generate_key(folder)
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
                        "type": "sigstoreSigned",
                        "keyPath": str(public_key),
                        "signedIdentity": {"type": "matchRepository"},
                    }
                ]
            },
        },
    }


def write_trust(folder: Path, registry: str, public_key: Path) -> Trust:
    """``policy.json`` and a registries.d for ``registry`` (host:port) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    policy = folder / "policy.json"
    policy.write_text(json.dumps(policy_document(registry, public_key), indent=2) + "\n")
    home = folder / "home"
    registries_d = home / ".config" / "containers" / "registries.d"
    registries_d.mkdir(parents=True, exist_ok=True)
    (registries_d / "graylane.yaml").write_text(
        "# Written by deploy/containers/signing.py: signatures live in the registry.\n"
        + yaml.safe_dump({"docker": {registry: {"use-sigstore-attachments": True}}})
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
        self.podman.run(
            [
                "push",
                "--tls-verify=false",
                "--digestfile",
                str(digest_file),
                *options,
                local,
                f"docker://{remote}",
            ],
            env=self.trust.env(),
            timeout=900,
        )
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


def publish(podman: Podman, local: str) -> Published:
    """``local`` (``localhost/NAME:TAG``) signed with this clone's key into the local registry
    (started when it is not running) as ``<registry>/graylane/NAME:TAG``, then pulled back
    under the policy: the signature is checked before this returns."""
    reg = local_registry.start()
    key = local_key()
    trust = write_trust(containers_dir() / "trust", reg.address, key.public)
    signed = SignedRegistry(podman=podman, trust=trust, key=key)
    name, tag = local.rsplit("/", 1)[-1].rsplit(":", 1)
    ref, digest = signed.push(local, name, tag)
    res = signed.pull(ref)
    if res.returncode != 0:
        raise ContainerToolError(f"{ref} was pushed but its signature is refused:\n{res.stderr}")
    say(f"signature verified: {ref}@{digest} (policy {trust.policy})")
    return Published(ref=ref, digest=digest, trust=trust)
