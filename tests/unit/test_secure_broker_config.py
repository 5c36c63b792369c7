"""Secured mode of the local broker (pure: rendered config and logins) and ACL bindings."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from graylane.acls import AclScope, Operation, Pattern, Resource, Role, role_acls
from graylane.deploy.kafka import secure
from graylane.deploy.kafka.layout import TEMPLATE_FILE
from graylane.kafka.admin import bindings_for
from graylane.topics import TopicLayout


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRAYLANE_LOCAL_DIR", str(tmp_path))
    return tmp_path


def _properties(text: str) -> dict[str, str]:
    props: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            assert key.strip() not in props, f"{key} set twice"
            props[key.strip()] = value.strip()
    return props


def test_logins_are_generated_once_per_state_folder_and_kept_private(local: Path) -> None:
    users = secure.load_users()
    assert set(users) == {secure.ADMIN, *secure.ROLE_USERS}
    assert len({u.password for u in users.values()}) == len(users)
    assert all(len(u.password) >= 20 for u in users.values())
    path = secure.users_file()
    assert path.stat().st_mode & 0o077 == 0
    assert secure.load_users() == users
    assert json.loads(path.read_text())["router"] == users["router"].password


def test_secured_config_replaces_the_plaintext_listeners_and_denies_by_default(
    local: Path,
) -> None:
    rendered = string.Template(TEMPLATE_FILE.read_text()).substitute(
        port=19092, controller_port=20092, data_dir=str(local / "data")
    )
    users = secure.load_users()
    props = _properties(
        secure.strip_replaced(rendered) + secure.secure_properties(19092, 20092, users)
    )
    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:20092"
    assert "PLAINTEXT:PLAINTEXT" not in props["listener.security.protocol.map"]
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin"
    client_jaas = props["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    for user in users.values():
        assert f'user_{user.username}="{user.password}"' in client_jaas
    # Roles cannot log in on the controller listener.
    controller_jaas = props["listener.name.controller.plain.sasl.jaas.config"]
    assert "user_router" not in controller_jaas and 'user_admin="' in controller_jaas


def test_client_env_logs_a_process_in_as_one_role(local: Path) -> None:
    users = secure.load_users()
    env = secure.client_env("worker", bootstrap="127.0.0.1:19092")
    assert env["GRAYLANE_SASL_USERNAME"] == "worker"
    assert env["GRAYLANE_SASL_PASSWORD"] == users["worker"].password
    assert env["GRAYLANE_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
    with pytest.raises(secure.KafkaLocalError, match="unknown user"):
        secure.client_env("mallory", bootstrap="x:1")


def test_bindings_are_one_allow_per_rule_and_operation() -> None:
    rules = role_acls(TopicLayout(prefix="gl"), Role.PRODUCER, AclScope(models=("gpt",)))
    bindings = bindings_for({"User:web": rules})
    assert len(bindings) == sum(len(r.operations) for r in rules)
    first = bindings[0]
    assert (first.resource, first.name, first.pattern) == (
        Resource.TOPIC,
        "gl.requests.gpt",
        Pattern.LITERAL,
    )
    assert first.operation is Operation.WRITE and first.principal == "User:web"
    # Wire form: TOPIC=2, LITERAL=3, WRITE=4, ALLOW=3 (Kafka's enum codes).
    assert first.as_creation() == (2, "gl.requests.gpt", 3, "User:web", "*", 4, 3)
