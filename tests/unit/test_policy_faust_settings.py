"""The policy engine's faust app is built from the same Settings as every other client,
security included (regression: create_app ignored SASL/TLS and always spoke PLAINTEXT)."""

from __future__ import annotations

import ssl

import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from graylane.policy_engine.service import (
    PolicyConfig,
    UnsupportedSecurity,
    create_app,
    credentials,
)
from graylane.settings import KafkaSecurity, SaslMechanism, SecurityProtocol, Settings


def _aiokafka_options_of_app(settings: Settings) -> dict[str, object]:
    """What faust hands its aiokafka clients for the app's configured credentials."""
    app = create_app(settings, PolicyConfig(models=("gpt",)))
    return dict(credentials_to_aiokafka_auth(app.conf.broker_credentials))


def _without_context(options: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in options.items() if k != "ssl_context" and v is not None}


def test_plaintext_app_has_no_credentials_and_reaches_every_bootstrap_server() -> None:
    settings = Settings(bootstrap_servers="a:9092, b:9093", client_id="gl")
    app = create_app(settings, PolicyConfig())
    assert app.conf.broker_credentials is None
    assert [str(u) for u in app.conf.broker] == ["kafka://a:9092", "kafka://b:9093"]
    assert app.conf.broker_client_id == "gl-policy"
    assert credentials_to_aiokafka_auth(app.conf.broker_credentials) == {
        "security_protocol": "PLAINTEXT"
    }


@pytest.mark.parametrize(
    ("protocol", "mechanism"),
    [
        (SecurityProtocol.SASL_SSL, SaslMechanism.SCRAM_SHA_512),
        (SecurityProtocol.SASL_SSL, SaslMechanism.PLAIN),
        (SecurityProtocol.SASL_PLAINTEXT, SaslMechanism.SCRAM_SHA_256),
    ],
)
def test_sasl_settings_reach_the_faust_app_as_the_factory_would_pass_them(
    protocol: SecurityProtocol, mechanism: SaslMechanism
) -> None:
    security = KafkaSecurity(
        protocol=protocol, sasl_mechanism=mechanism, sasl_username="svc", sasl_password="s3cret"
    )
    expected = security.client_options()
    got = _aiokafka_options_of_app(Settings(security=security))
    assert _without_context(got) == _without_context(expected)
    assert got["security_protocol"] == protocol.value
    assert (got["sasl_plain_username"], got["sasl_plain_password"]) == ("svc", "s3cret")
    assert got["sasl_mechanism"] == mechanism.value
    if protocol is SecurityProtocol.SASL_SSL:
        assert isinstance(got["ssl_context"], ssl.SSLContext)
    else:
        assert got["ssl_context"] is None


def test_tls_settings_reach_the_faust_app_with_an_ssl_context() -> None:
    security = KafkaSecurity(protocol=SecurityProtocol.SSL)
    app = create_app(Settings(security=security), PolicyConfig())
    assert isinstance(app.conf.broker_credentials, faust.SSLCredentials)
    got = dict(credentials_to_aiokafka_auth(app.conf.broker_credentials))
    assert got["security_protocol"] == "SSL"
    assert isinstance(got["ssl_context"], ssl.SSLContext)


def test_gssapi_keeps_its_mechanism_and_tls() -> None:
    security = KafkaSecurity(
        protocol=SecurityProtocol.SASL_SSL, sasl_mechanism=SaslMechanism.GSSAPI
    )
    got = dict(credentials_to_aiokafka_auth(credentials(security)))
    assert (got["security_protocol"], got["sasl_mechanism"]) == ("SASL_SSL", "GSSAPI")
    assert isinstance(got["ssl_context"], ssl.SSLContext)


def test_oauthbearer_without_a_token_provider_is_refused() -> None:
    security = KafkaSecurity(
        protocol=SecurityProtocol.SASL_SSL, sasl_mechanism=SaslMechanism.OAUTHBEARER
    )
    with pytest.raises(UnsupportedSecurity):
        credentials(security)
