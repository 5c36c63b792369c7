"""A Kafka broker of one test's own (own state folder, own ports), and free local ports.

Tests that stop a broker, or run one secured, use a private one started by
``deploy/kafka/kafka.py`` with :attr:`PrivateBroker.env`; the shared test broker is never
stopped. ``kafka.py stop`` finds the private broker through its own state folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from graylane.acls import AclScope, KafkaRole, role_acls
from graylane.kafka.admin import apply_acls, bindings_for
from graylane.kafka.seam import KafkaFactory
from graylane.settings import KafkaSecurity, SaslMechanism, SecurityProtocol, Settings
from tests.support.settings import make_settings

__all__ = [
    "KAFKA_TOOL",
    "PrivateBroker",
    "SecuredBroker",
    "free_port",
    "grant_roles",
    "running_broker",
    "secured_broker",
]

KAFKA_TOOL = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.py"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PrivateBroker:
    """Where a private broker keeps its state, the ports it listens on, whether it is secured."""

    root: Path
    port: int
    controller_port: int
    secure: bool = False

    @classmethod
    def under(cls, root: Path, *, secure: bool = False) -> PrivateBroker:
        """A broker with its state under ``root`` on two free ports (not started)."""
        return cls(root, free_port(), free_port(), secure)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def variables(self) -> dict[str, str]:
        """The environment variables that point ``kafka.py`` at this broker."""
        names = {
            "GRAYLANE_LOCAL_DIR": str(self.root),
            "GRAYLANE_KAFKA_PORT": str(self.port),
            "GRAYLANE_KAFKA_CONTROLLER_PORT": str(self.controller_port),
        }
        if self.secure:
            names["GRAYLANE_KAFKA_SECURE"] = "1"
        return names

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with :attr:`variables` on top."""
        return {**os.environ, **self.variables}

    @property
    def pid(self) -> int:
        """The running broker's process id (from its pid file)."""
        return int((self.root / "kafka" / "kafka.pid").read_text().strip())

    def run(self, action: str) -> None:
        """``kafka.py <action>`` (start, stop, status) for this broker; a failure fails the test."""
        done = subprocess.run(
            [sys.executable, str(KAFKA_TOOL), action],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


@contextlib.contextmanager
def running_broker(root: Path, *, secure: bool = False) -> Iterator[PrivateBroker]:
    """Start a private broker under ``root``; stop it (only it) on exit."""
    broker = PrivateBroker.under(root, secure=secure)
    broker.run("start")
    try:
        yield broker
    finally:
        broker.run("stop")


@dataclass(frozen=True)
class SecuredBroker:
    """A running secured private broker and the SASL/PLAIN password of each of its users
    (``admin`` and one per :class:`~graylane.acls.KafkaRole`)."""

    bootstrap: str
    passwords: dict[str, str]

    def security(self, user: str) -> KafkaSecurity:
        return KafkaSecurity(
            protocol=SecurityProtocol.SASL_PLAINTEXT,
            sasl_mechanism=SaslMechanism.PLAIN,
            sasl_username=user,
            sasl_password=self.passwords[user],
        )

    def settings(self, user: str, prefix: str, tmp: Path) -> Settings:
        """A test's settings (see :func:`make_settings`) logged in as ``user``."""
        base = make_settings(self.bootstrap, prefix, tmp)
        return dataclasses.replace(base, client_id=f"{prefix}-{user}", security=self.security(user))


@contextlib.contextmanager
def secured_broker(root: Path) -> Iterator[SecuredBroker]:
    """A private broker in secured mode (SASL/PLAIN, ACLs enforced) under ``root``."""
    with running_broker(root, secure=True) as broker:
        passwords = json.loads((root / "kafka" / "config" / "users.json").read_text())
        yield SecuredBroker(broker.bootstrap, passwords)


async def grant_roles(admin_factory: KafkaFactory, scope: AclScope) -> None:
    """Grant every role (principal ``User:<role>``) its ACLs, as ``graylane acls --apply`` does."""
    layout = admin_factory.layout
    grants = {f"User:{role.value}": role_acls(layout, role, scope) for role in KafkaRole}
    admin = admin_factory.admin()
    await admin.start()
    try:
        assert await apply_acls(admin, bindings_for(grants)) > 0
    finally:
        await admin.close()
