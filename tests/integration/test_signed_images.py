"""Signed images: pushed signed to a local OCI registry (the distribution registry built from
its Go module), pulled and played from it only under the policy that requires the signature.

A small image is built FROM the local Debian base the other image tests use and pushed three
times: signed (``podman push --sign-by``, a GPG key made for the test), as another image
without a signature, and as a copy of the signed one re-tagged under another name without
one. Pulling with ``podman pull --signature-policy`` accepts the first and refuses the other
two with podman's own signature error; a copy whose signature was copied beside it is
refused for the identity the signature names; a policy naming another key refuses even the
signed one; and
``podman kube play`` under the policy starts a Pod from the signed image pulled from the
registry and refuses the Pod whose image is unsigned. Every pull really goes to the
registry: the references are removed from podman's store first, and the Pods pull
``Always``.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from graylane.deploy.containers.images import base_image
from graylane.deploy.containers.podman import ContainerToolError, KubePlay, Podman
from graylane.deploy.containers.signing import (
    COSIGN,
    SIGNATURE_REFUSED,
    SignedRegistry,
    cosign_sign,
    cosign_verify,
    generate_cosign_key,
    generate_key,
    write_trust,
)
from graylane.deploy.containers.tools import go_binary
from graylane.deploy.registry.registry import (
    REGISTRY,
    LocalRegistry,
    answers,
    running_registry,
    status,
)

pytestmark = [pytest.mark.slow, pytest.mark.containers, pytest.mark.timeout(2400)]

PROBE = "localhost/graylane-signature-probe"
CONTAINERFILE = """\
FROM {base}
LABEL org.opencontainers.image.title="graylane signature probe" io.graylane.probe="{variant}"
CMD ["python3", "-c", "print('graylane probe {variant} ran')"]
"""


@dataclass(frozen=True, kw_only=True)
class Pushed:
    registry: LocalRegistry
    signed: SignedRegistry
    signed_local: str
    signed_ref: str
    signed_digest: str
    unsigned_ref: str
    retagged_ref: str
    folder: Path


def _needs_tools() -> None:
    if not shutil.which("gpg"):
        pytest.skip("gpg is absent: images are signed with a GPG key")
    if REGISTRY.path().is_file():
        return
    try:
        go_binary()
    except ContainerToolError as exc:
        pytest.skip(f"the local registry is built with Go, which is absent: {exc}")


def _build_probe(podman: Podman, folder: Path, base: str, variant: str) -> str:
    context = folder / f"probe-{variant}"
    context.mkdir()
    (context / "Containerfile").write_text(CONTAINERFILE.format(base=base, variant=variant))
    ref = f"{PROBE}:{variant}"
    podman.run(
        ["build", "--pull=never", "-t", ref, "-f", str(context / "Containerfile"), str(context)]
    )
    return ref


def _pulled(podman: Podman, ref: str, digest: str) -> bool:
    """True when podman's store holds ``ref`` as the manifest ``digest`` pulled by name."""
    out = podman.run(["image", "inspect", "--format", "{{json .RepoDigests}}", ref]).stdout
    return f"{ref.rsplit(':', 1)[0]}@{digest}" in json.loads(out)


def _forget(podman: Podman, ref: str) -> None:
    """Drop ``ref`` from podman's store so that the next pull goes to the registry."""
    podman.run(["rmi", "--force", ref], check=False)
    assert not podman.image_exists(ref)


@pytest.fixture(scope="module")
def pushed(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    _needs_tools()
    folder = tmp_path_factory.mktemp("signed-images")
    base = base_image(podman)
    signed_local = _build_probe(podman, folder, base, "signed")
    unsigned_local = _build_probe(podman, folder, base, "unsigned")
    with running_registry(folder / "registry") as reg:
        key = generate_key(folder / "keys")
        trust = write_trust(folder / "trust", reg.address, reg.lookaside, key.public)
        registry = SignedRegistry(podman=podman, trust=trust, key=key)
        signed_ref, signed_digest = registry.push(signed_local, "probe", "1")
        unsigned_ref, _ = registry.push(unsigned_local, "probe-unsigned", "1", sign=False)
        retagged_ref, retagged_digest = registry.push(signed_local, "impostor", "1", sign=False)
        assert retagged_digest == signed_digest  # the very same image, under another name
        yield Pushed(
            registry=reg,
            signed=registry,
            signed_local=signed_local,
            signed_ref=signed_ref,
            signed_digest=signed_digest,
            unsigned_ref=unsigned_ref,
            retagged_ref=retagged_ref,
            folder=folder,
        )
        for ref in (signed_ref, unsigned_ref, retagged_ref):
            podman.run(["rmi", "--force", ref], check=False)
    for ref in (signed_local, unsigned_local):
        podman.run(["rmi", "--force", ref], check=False)


def _tags(reg: LocalRegistry, repo: str) -> list[str]:
    with urllib.request.urlopen(f"http://{reg.address}/v2/{repo}/tags/list", timeout=10) as resp:
        return list(json.load(resp).get("tags") or [])


def _signatures(reg: LocalRegistry, repo: str, digest: str) -> list[Path]:
    """The signature files of ``repo@digest`` in the registry's lookaside store."""
    folder = reg.lookaside / f"{repo}@{digest.replace(':', '=')}"
    return sorted(folder.glob("signature-*")) if folder.is_dir() else []


def test_the_signature_is_stored_beside_the_signed_image_only(pushed: Pushed) -> None:
    reg, digest = pushed.registry, pushed.signed_digest
    assert "1" in _tags(reg, "graylane/probe")
    (signature,) = _signatures(reg, "graylane/probe", digest)
    assert signature.name == "signature-1" and signature.stat().st_size > 0
    assert _signatures(reg, "graylane/impostor", digest) == []
    assert _tags(reg, "graylane/impostor") == ["1"]
    unsigned = [p for p in reg.lookaside.rglob("*") if "probe-unsigned" in str(p)]
    assert unsigned == []


def test_the_signed_image_is_pulled_under_the_policy(podman: Podman, pushed: Pushed) -> None:
    _forget(podman, pushed.signed_ref)
    res = pushed.signed.pull(pushed.signed_ref)
    assert res.returncode == 0, res.stderr
    assert _pulled(podman, pushed.signed_ref, pushed.signed_digest)


@pytest.mark.parametrize("which", ["unsigned_ref", "retagged_ref"])
def test_an_image_without_our_signature_is_refused(
    podman: Podman, pushed: Pushed, which: str
) -> None:
    ref = getattr(pushed, which)
    _forget(podman, ref)
    res = pushed.signed.pull(ref)
    assert res.returncode != 0 and SIGNATURE_REFUSED in res.stderr, res.stderr
    assert not podman.image_exists(ref)


def test_a_signature_copied_beside_a_re_tagged_copy_does_not_vouch_for_it(
    podman: Podman, pushed: Pushed
) -> None:
    """The signature names the repository it was made for: copied with the image into
    another repository, it is found there and refused for its identity."""
    reg = pushed.registry
    ref, digest = pushed.signed.push(
        pushed.signed_local, "impostor-with-signature", "1", sign=False
    )
    assert digest == pushed.signed_digest
    (signature,) = _signatures(reg, "graylane/probe", digest)
    copied = reg.lookaside / f"graylane/impostor-with-signature@{digest.replace(':', '=')}"
    copied.mkdir(parents=True)
    shutil.copy(signature, copied / signature.name)
    assert len(_signatures(reg, "graylane/impostor-with-signature", digest)) == 1
    _forget(podman, ref)
    res = pushed.signed.pull(ref)
    assert res.returncode != 0, res.stderr
    assert SIGNATURE_REFUSED not in res.stderr and "not accepted" in res.stderr, res.stderr
    assert not podman.image_exists(ref)


def test_a_policy_naming_another_key_refuses_the_signed_image(
    podman: Podman, pushed: Pushed
) -> None:
    other = generate_key(pushed.folder / "other-keys")
    reg = pushed.registry
    trust = write_trust(pushed.folder / "other-trust", reg.address, reg.lookaside, other.public)
    strict = SignedRegistry(podman=podman, trust=trust, key=other)
    _forget(podman, pushed.signed_ref)
    res = strict.pull(pushed.signed_ref)
    assert res.returncode != 0 and "signature" in res.stderr.lower(), res.stderr
    assert SIGNATURE_REFUSED not in res.stderr  # one exists; it is not by the trusted key
    assert not podman.image_exists(pushed.signed_ref)


def test_the_cosign_signature_a_cluster_checks_vouches_for_the_signed_image_only(
    pushed: Pushed,
) -> None:
    """What sigstore's policy-controller reads: a cosign signature by the release key in the
    registry beside the image. ``cosign verify --key`` accepts the signed image and finds
    nothing for the unsigned one or the re-tagged copy."""
    if not COSIGN.path().is_file():
        try:
            go_binary()
        except ContainerToolError as exc:
            pytest.skip(f"cosign is built with Go, which is absent: {exc}")
    key = generate_cosign_key(pushed.folder / "cosign")
    assert key.private.read_text().startswith("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----")
    cosign_sign(key, pushed.signed_ref, pushed.signed_digest)
    sig_tag = pushed.signed_digest.replace(":", "-") + ".sig"
    assert sig_tag in _tags(pushed.registry, "graylane/probe")
    res = cosign_verify(key.public, pushed.signed_ref)
    assert res.returncode == 0, res.stderr
    (claim,) = json.loads(res.stdout)
    assert claim["critical"]["image"]["docker-manifest-digest"] == pushed.signed_digest
    assert claim["critical"]["identity"]["docker-reference"] == pushed.signed_ref.rsplit(":", 1)[0]
    for ref in (pushed.unsigned_ref, pushed.retagged_ref):
        res = cosign_verify(key.public, ref)
        assert res.returncode != 0 and "no signatures found" in res.stderr, res.stderr
    other = generate_cosign_key(pushed.folder / "cosign-other")
    res = cosign_verify(other.public, pushed.signed_ref)
    assert res.returncode != 0, res.stdout


def _pod(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "probe", "image": image, "imagePullPolicy": "Always"}],
        },
    }


def test_kube_play_starts_the_signed_image_and_refuses_the_unsigned_one(
    podman: Podman, pushed: Pushed
) -> None:
    trust = pushed.signed.trust
    options = trust.pull_options()
    for ref in (pushed.signed_ref, pushed.unsigned_ref):
        _forget(podman, ref)
    pod = f"graylane-signed-probe-{int(time.time())}"
    play = KubePlay.start(
        podman,
        [_pod(pod, pushed.signed_ref)],
        pushed.folder / "signed-pod.yaml",
        options=options,
        env=trust.env(),
    )
    try:
        container = f"{pod}-probe"

        out = ""
        for _ in range(600):  # the container prints once and exits; polled, not timed
            res = podman.run(["logs", container], check=False)
            out = res.stdout + res.stderr
            if "graylane probe signed ran" in out:
                break
            time.sleep(0.2)
        assert "graylane probe signed ran" in out, out
        assert _pulled(podman, pushed.signed_ref, pushed.signed_digest)
    finally:
        play.down()
    refused = f"graylane-unsigned-probe-{int(time.time())}"
    with pytest.raises(ContainerToolError) as err:
        KubePlay.start(
            podman,
            [_pod(refused, pushed.unsigned_ref)],
            pushed.folder / "unsigned-pod.yaml",
            options=options,
            env=trust.env(),
        )
    assert SIGNATURE_REFUSED in str(err.value), err.value
    assert not podman.image_exists(pushed.unsigned_ref)
    assert refused not in podman.run(["pod", "ps", "--format", "{{.Name}}"]).stdout.split()


def test_a_stopped_registry_leaves_no_storage_or_signatures(tmp_path: Path) -> None:
    _needs_tools()
    folder = tmp_path / "registry"
    with running_registry(folder) as reg:
        assert answers(reg.address) and reg.catalog() == []
        assert reg.lookaside.is_dir() and list(folder.glob("storage-*"))
        running, line = status(folder)
        assert running and reg.address in line
    assert not answers(reg.address)
    assert not reg.lookaside.exists() and not list(folder.glob("storage-*"))
    assert status(folder) == (False, "registry not running")
