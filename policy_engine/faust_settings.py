"""The faust app's broker settings, from the same :class:`Settings` as every other client.

aiokafka clients take ``KafkaSecurity.client_options()`` directly; faust wants a
credentials object instead, which it turns back into the same aiokafka options
(``faust.transport.drivers.aiokafka.credentials_to_aiokafka_auth``). The SSL
context comes from ``client_options()`` so both paths trust the same files.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import faust
from faust.types.auth import CredentialsT

from graylane.errors import GraylaneError
from graylane.settings import KafkaSecurity, SaslMechanism, SecurityProtocol, Settings

__all__ = ["FaustBrokerSettings", "UnsupportedSecurity", "broker_settings", "credentials"]


class UnsupportedSecurity(GraylaneError):
    """The security settings cannot be expressed as faust credentials."""


@dataclass(frozen=True)
class FaustBrokerSettings:
    """The ``faust.App`` keyword arguments that say how to reach the brokers."""

    broker: list[str]
    broker_client_id: str
    broker_credentials: CredentialsT | None


def credentials(security: KafkaSecurity) -> CredentialsT | None:
    """faust credentials equivalent to ``security`` (None for plaintext)."""
    options = security.client_options()  # validates, and builds the SSL context
    context = options.get("ssl_context")
    ssl_context = context if isinstance(context, ssl.SSLContext) else None
    if security.protocol is SecurityProtocol.PLAINTEXT:
        return None
    if security.protocol is SecurityProtocol.SSL:
        return faust.SSLCredentials(ssl_context)
    mechanism = security.sasl_mechanism
    if mechanism is SaslMechanism.GSSAPI:
        return faust.GSSAPICredentials(mechanism=mechanism.value, ssl_context=ssl_context)
    if mechanism is SaslMechanism.OAUTHBEARER or mechanism is None:
        raise UnsupportedSecurity(
            f"SASL mechanism {mechanism} needs a token provider; the policy engine has none"
        )
    return faust.SASLCredentials(
        username=security.sasl_username,
        password=security.sasl_password,
        ssl_context=ssl_context,
        mechanism=mechanism.value,
    )


def broker_settings(settings: Settings, *, client_suffix: str = "policy") -> FaustBrokerSettings:
    return FaustBrokerSettings(
        broker=[f"kafka://{b.strip()}" for b in settings.bootstrap_servers.split(",")],
        broker_client_id=f"{settings.client_id}-{client_suffix}",
        broker_credentials=credentials(settings.security),
    )
