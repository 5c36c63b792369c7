"""What deploy/containers hands Debian's podman 4.3 for ``kube play``: Secrets in the form
each use reads, Deployments with the same meaning in the shape it accepts."""

from __future__ import annotations

import base64
import copy
import json

import pytest

from graylane.deploy.containers.podman import (
    INIT_TYPE_ANNOTATION,
    ContainerToolError,
    kube_play_form,
    secret_payloads,
)
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


def test_init_containers_are_kept_once_they_exited() -> None:
    """podman's default "once" removes an init container as it exits and can lose that race
    ("cannot remove container ... as it is running"): pods with init containers ask for
    "always"; pods without are left alone."""
    with_init = {
        "kind": "Deployment",
        "metadata": {"name": "w"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "w"}},
                "spec": {
                    "initContainers": [{"name": "fetch", "image": "i"}],
                    "containers": [{"name": "worker", "image": "i"}],
                },
            }
        },
    }
    played = kube_play_form(with_init)
    assert played["spec"]["template"]["metadata"]["annotations"] == {INIT_TYPE_ANNOTATION: "always"}
    assert "annotations" not in with_init["spec"]["template"]["metadata"]  # a copy
    without = copy.deepcopy(with_init)
    del without["spec"]["template"]["spec"]["initContainers"]
    assert "annotations" not in kube_play_form(without)["spec"]["template"]["metadata"]
