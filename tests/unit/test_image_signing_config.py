"""The trust files written for the local registry: the policy requires our GPG signature for
the registry's graylane namespace only, and registries.d points podman at its lookaside
store (tests/integration/test_signed_images.py checks podman's verdicts with them)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from graylane.deploy.containers.signing import write_trust


def test_the_policy_requires_our_key_for_the_registry_namespace_only(tmp_path: Path) -> None:
    key = tmp_path / "pubkey.asc"
    trust = write_trust(tmp_path / "trust", "127.0.0.1:5123", tmp_path / "lookaside", key)
    policy = json.loads(trust.policy.read_text())
    assert policy["default"] == [{"type": "insecureAcceptAnything"}]
    assert policy["transports"]["docker"] == {
        "127.0.0.1:5123/graylane": [
            {
                "type": "signedBy",
                "keyType": "GPGKeys",
                "keyPath": str(key),
                "signedIdentity": {"type": "matchRepository"},
            }
        ]
    }
    assert trust.pull_options() == [
        "--tls-verify=false",
        "--signature-policy",
        str(trust.policy),
    ]


def test_registries_d_names_the_lookaside_store_under_the_commands_home(tmp_path: Path) -> None:
    store = tmp_path / "lookaside"
    trust = write_trust(tmp_path / "trust", "127.0.0.1:5123", store, tmp_path / "k.asc")
    assert trust.env() == {"HOME": str(trust.home)}
    (found,) = (trust.home / ".config" / "containers" / "registries.d").glob("*.yaml")
    config = yaml.safe_load(found.read_text())
    assert config == {
        "docker": {
            "127.0.0.1:5123": {
                "lookaside": store.resolve().as_uri(),
                "lookaside-staging": store.resolve().as_uri(),
            }
        }
    }
