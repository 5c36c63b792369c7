"""What deploy/containers hands Debian's podman 4.3 for ``kube play``: Secrets in the form
each use reads, Deployments with the same meaning in the shape it accepts."""

from __future__ import annotations

import base64
import json

import pytest

from graylane.deploy.containers.podman import ContainerToolError, secret_payloads
from graylane.deploy.containers.podman import kube_play_form as for_this_podman


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _deployment(*, host_network: bool) -> dict[str, object]:
    container = {
        "name": "c",
        "ports": [{"name": "metrics", "containerPort": 29101}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}},
        "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "a"}}}],
    }
    return {
        "kind": "Deployment",
        "spec": {
            "template": {
                "spec": {
                    "hostNetwork": host_network,
                    "containers": [container],
                    "volumes": [{"name": "v", "secret": {"secretName": "vol-secret"}}],
                }
            }
        },
    }


def _secret(name: str, **data: str) -> dict[str, object]:
    return {
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {k: _b64(v) for k, v in data.items()},
    }


def test_env_secrets_are_maps_of_base64_and_volume_secrets_carry_plain_text() -> None:
    docs = [
        _secret("env-secret", a="hello"),
        _secret("vol-secret", tokens="t:operator\n"),
        _deployment(host_network=True),
    ]
    payloads = {k: json.loads(v) for k, v in secret_payloads(docs).items()}
    assert payloads["env-secret"] == {"a": _b64("hello")}
    assert payloads["vol-secret"]["data"] == {"tokens": "t:operator\n"}
    assert payloads["vol-secret"]["metadata"] == {"name": "vol-secret"}


def test_a_secret_used_both_ways_is_refused() -> None:
    deploy = _deployment(host_network=True)
    deploy["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] = "env-secret"  # type: ignore[index]
    with pytest.raises(ContainerToolError, match="env and as a volume"):
        secret_payloads([_secret("env-secret", a="x"), deploy])


def test_host_network_pods_lose_port_declarations_but_keep_their_probes() -> None:
    played = for_this_podman(_deployment(host_network=True))
    pod = played["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "ports" not in container
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 29101}
    assert pod["volumes"][0]["secret"] == {"secretName": "vol-secret", "optional": False}
    kept = for_this_podman(_deployment(host_network=False))
    assert kept["spec"]["template"]["spec"]["containers"][0]["ports"] == [
        {"name": "metrics", "containerPort": 29101}
    ]
