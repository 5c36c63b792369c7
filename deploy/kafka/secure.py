"""Secured mode of the local broker: SASL/PLAIN logins per role and the StandardAuthorizer.

``GRAYLANE_KAFKA_SECURE=1`` turns it on. The broker then listens with SASL_PLAINTEXT only
(client listener and the KRaft controller listener), denies everything that no ACL allows
(``allow.everyone.if.no.acl.found=false``) and knows one login per Graylane role plus the
super user ``admin``. Passwords are generated once per state folder and kept in
``<local>/kafka/config/users.json`` (mode 0600); :func:`client_env` gives the ``GRAYLANE_*``
settings with which a process logs in as one role.

PLAIN sends the password in clear text: this mode is for proving the ACLs on one machine,
on loopback. A production cluster uses SCRAM or mTLS over TLS (``GRAYLANE_SECURITY_PROTOCOL``
= SASL_SSL); Graylane's clients take both through the same settings.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from graylane.deploy.kafka.layout import HOST, KafkaLocalError, config_dir

__all__ = [
    "ADMIN",
    "ROLE_USERS",
    "Credentials",
    "client_env",
    "configured_secure",
    "load_users",
    "secure_properties",
    "users_file",
]

ADMIN = "admin"
# One login per Graylane role (graylane.acls.KafkaRole values) and an operator login.
ROLE_USERS = (
    "router",
    "worker",
    "policy-engine",
    "control-plane",
    "producer",
    "gateway",
    "result-consumer",
)
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
# Keys of the plaintext template that secured mode replaces.
REPLACED_KEYS = frozenset(
    {
        "listeners",
        "advertised.listeners",
        "inter.broker.listener.name",
        "listener.security.protocol.map",
    }
)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


def configured_secure() -> bool:
    """Whether ``GRAYLANE_KAFKA_SECURE`` asks for the secured broker."""
    return os.environ.get("GRAYLANE_KAFKA_SECURE", "").strip().lower() in {"1", "true", "yes"}


def users_file() -> Path:
    return config_dir() / "users.json"


def load_users(create: bool = True) -> dict[str, Credentials]:
    """The logins of this broker; generated (and saved, mode 0600) on first use."""
    path = users_file()
    if path.exists():
        try:
            raw = json.loads(path.read_text())
            users = {name: Credentials(name, str(pw)) for name, pw in raw.items()}
        except (ValueError, AttributeError) as exc:
            raise KafkaLocalError(
                f"{path} is not a JSON object of user -> password: {exc}"
            ) from None
        missing = {ADMIN, *ROLE_USERS} - users.keys()
        if not missing:
            return users
    elif not create:
        raise KafkaLocalError(f"{path} does not exist: start the broker in secured mode first")
    users = {name: Credentials(name, secrets.token_urlsafe(18)) for name in (ADMIN, *ROLE_USERS)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.touch(mode=0o600)
    tmp.write_text(json.dumps({u.username: u.password for u in users.values()}, indent=2))
    tmp.rename(path)
    return users


def _jaas(login: Credentials, users: Mapping[str, Credentials]) -> str:
    known = " ".join(f'user_{u.username}="{u.password}"' for u in users.values())
    return (
        f'{PLAIN_MODULE} required username="{login.username}" password="{login.password}" {known};'
    )


def secure_properties(port: int, controller_port: int, users: Mapping[str, Credentials]) -> str:
    """The server.properties block of secured mode (appended to the rendered template)."""
    admin = users[ADMIN]
    controller_only = {ADMIN: admin}
    lines = [
        "",
        "############################# Secured mode (GRAYLANE_KAFKA_SECURE=1) ####################",
        f"listeners=SASL_PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        f"advertised.listeners=SASL_PLAINTEXT://{HOST}:{port}",
        "inter.broker.listener.name=SASL_PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms=PLAIN",
        "sasl.mechanism.inter.broker.protocol=PLAIN",
        "sasl.mechanism.controller.protocol=PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
        # The controller listener knows the admin login only: roles never reach it.
        f"listener.name.controller.plain.sasl.jaas.config={_jaas(admin, controller_only)}",
        f"listener.name.sasl_plaintext.plain.sasl.jaas.config={_jaas(admin, users)}",
        f"authorizer.class.name={AUTHORIZER}",
        f"super.users=User:{ADMIN}",
        "allow.everyone.if.no.acl.found=false",
        "",
    ]
    return "\n".join(lines)


def strip_replaced(template_text: str) -> str:
    """The rendered plaintext template without the keys secured mode sets itself."""
    kept = []
    for line in template_text.splitlines():
        key = line.split("=", 1)[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and key in REPLACED_KEYS:
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def client_env(user: str, *, bootstrap: str) -> dict[str, str]:
    """The ``GRAYLANE_*`` environment with which a process logs in as ``user``."""
    creds = load_users(create=False).get(user)
    if creds is None:
        raise KafkaLocalError(f"unknown user {user!r}; known: {ADMIN}, {', '.join(ROLE_USERS)}")
    return {
        "GRAYLANE_BOOTSTRAP_SERVERS": bootstrap,
        "GRAYLANE_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GRAYLANE_SASL_MECHANISM": "PLAIN",
        "GRAYLANE_SASL_USERNAME": creds.username,
        "GRAYLANE_SASL_PASSWORD": creds.password,
    }
