"""Typed settings, read once at start-up from ``GRAYLANE_*`` environment variables.

Nothing below this module reads the environment: services receive a
:class:`Settings` and pass the parts they need down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from graylane.errors import GraylaneError
from graylane.running_build import read_build, running_build

if TYPE_CHECKING:
    from graylane.logs import LogFormat
    from graylane.metrics.process import BuildLabels, MetricsAddress

_E = TypeVar("_E", bound=Enum)

REPO_ROOT = Path(__file__).resolve().parent.parent


class SettingsError(GraylaneError, ValueError):
    """A setting has a value Graylane cannot use."""


class SecurityProtocol(Enum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(Enum):
    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"
    OAUTHBEARER = "OAUTHBEARER"
    GSSAPI = "GSSAPI"


@dataclass(frozen=True, kw_only=True)
class KafkaSecurity:
    """Connection security, passed through to aiokafka unchanged."""

    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def client_options(self) -> dict[str, object]:
        """Keyword arguments for aiokafka clients."""
        options: dict[str, object] = {"security_protocol": self.protocol.value}
        if self.protocol in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL):
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        if self.protocol in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL):
            if self.sasl_mechanism is None:
                raise SettingsError("GRAYLANE_SASL_MECHANISM is required with a SASL protocol")
            options["sasl_mechanism"] = self.sasl_mechanism.value
            if self.sasl_username is not None:
                options["sasl_plain_username"] = self.sasl_username
                options["sasl_plain_password"] = self.sasl_password
        return options


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything a Graylane process needs to know about its surroundings."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "graylane"
    client_id: str = "graylane"
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    partitions: int = 6
    """Of the data topics (requests, per-version topics, results): 6 splits a version's
    load evenly over 1, 2, 3 or 6 replicas (3 partitions give 2 workers 2:1)."""
    replication_factor: int = 1
    audit_retention_ms: int = 90 * 24 * 3600 * 1000
    data_retention_ms: int = 7 * 24 * 3600 * 1000
    max_request_bytes: int = 4 * 1024 * 1024
    db_url: str = f"sqlite:///{REPO_ROOT / '.local' / 'graylane.db'}"
    artifact_dir: Path = REPO_ROOT / ".local" / "artifacts"
    metrics_host: str = "127.0.0.1"
    """``0.0.0.0`` in containers, so Prometheus in another pod can scrape."""
    metrics_port: int = 0
    """One port per process; 0 picks a free port (logged), below 0 turns metrics off."""
    log_format: str = "json"
    git_sha: str = "unknown"
    build_time: str = "unknown"
    """The running build (:mod:`graylane.running_build`): the image's ``GRAYLANE_GIT_SHA`` /
    ``GRAYLANE_BUILD_TIME``, else the checkout's commit and its time."""
    image_version: str = "unknown"
    instance_id: str = ""
    """Static group membership id of this process (``GRAYLANE_INSTANCE_ID``); "" = derived."""
    signing_key: Path | None = None
    """Private key the builder signs artifacts with (``GRAYLANE_SIGNING_KEY``)."""
    trusted_keys: tuple[Path, ...] = ()
    """Public keys a worker trusts artifact signatures from (``GRAYLANE_TRUSTED_KEYS``,
    separated by ``os.pathsep``; a folder stands for the ``*.pub`` files in it); empty:
    artifacts are not signature-checked, unless :attr:`require_signatures` refuses that."""
    trusted_keys_source: str = ""
    """``GRAYLANE_TRUSTED_KEYS`` as given: where the keys were looked for (named when none
    was found there)."""
    require_signatures: bool = False
    """Fail closed (``GRAYLANE_REQUIRE_SIGNATURES``, ``--require-signatures``): a fetch or
    worker that finds no trusted key refuses to start instead of skipping the check."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise SettingsError("bootstrap servers must not be empty")
        if not self.topic_prefix or any(c not in _TOPIC_CHARS for c in self.topic_prefix):
            raise SettingsError(
                f"topic prefix {self.topic_prefix!r} may only use letters, digits, '.', '_', '-'"
            )
        if self.partitions < 1 or self.replication_factor < 1:
            raise SettingsError("partitions and replication factor must be >= 1")
        if self.max_request_bytes < 1024:
            raise SettingsError("max request bytes must be at least 1024")
        if self.metrics_port > 65535:
            raise SettingsError(f"metrics port {self.metrics_port} is out of range")
        if self.log_format not in ("json", "text"):
            raise SettingsError(f"log format {self.log_format!r}: expected json or text")

    @property
    def max_message_bytes(self) -> int:
        """The largest record Graylane sends: its producers' ``max_request_size``, its
        consumers' partition fetch size and the ``max.message.bytes`` of the topics it
        creates. Twice the request limit (at least 1 MiB): a forward stamps a request
        with routing fields and a result may outgrow its request."""
        return max(self.max_request_bytes * 2, 1_048_576)

    def metrics_address(self, port: int | None = None) -> MetricsAddress | None:
        """Where this process serves /metrics (``port`` overrides the setting); None = off."""
        from graylane.metrics.process import MetricsAddress

        chosen = self.metrics_port if port is None else port
        return None if chosen < 0 else MetricsAddress(host=self.metrics_host, port=chosen)

    def build_labels(self) -> BuildLabels:
        from graylane.metrics.process import BuildLabels

        return BuildLabels(
            version=self.image_version, git_sha=self.git_sha, build_time=self.build_time
        )

    def verifying_keys(self) -> tuple[Path, ...]:
        """The keys artifact signatures are checked against (empty: not checked).

        With :attr:`require_signatures`, raises
        :class:`~graylane.artifacts.signing.TrustedKeyError` when there is none, or one
        cannot be read: the caller refuses to start rather than serve unchecked artifacts.
        """
        if not self.require_signatures:
            return self.trusted_keys
        from graylane.artifacts.signing import require_trusted_keys

        looked_in = self.trusted_keys_source or ", ".join(str(k) for k in self.trusted_keys)
        return require_trusted_keys(self.trusted_keys, looked_in)

    def logs(self) -> LogFormat:
        from graylane.logs import LogFormat

        return LogFormat(self.log_format)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``GRAYLANE_*`` variables (``os.environ`` by default)."""
        source = os.environ if env is None else env
        base = cls()

        def get(name: str) -> str | None:
            value = source.get(f"GRAYLANE_{name}")
            if name in _FROM_FILE:
                value = _from_file(name, value, source.get(f"GRAYLANE_{name}_FILE"))
            return value if value not in (None, "") else None

        def get_int(name: str, default: int) -> int:
            raw = get(name)
            if raw is None:
                return default
            try:
                return int(raw)
            except ValueError:
                raise SettingsError(f"GRAYLANE_{name}={raw!r} is not an integer") from None

        def get_bool(name: str, default: bool) -> bool:
            raw = get(name)
            if raw is None:
                return default
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise SettingsError(f"GRAYLANE_{name}={raw!r}: expected true or false")

        def get_enum(name: str, kind: type[_E]) -> _E | None:
            raw = get(name)
            if raw is None:
                return None
            try:
                return kind(raw.upper())
            except ValueError:
                allowed = ", ".join(str(m.value) for m in kind)
                raise SettingsError(f"GRAYLANE_{name}={raw!r}: expected one of {allowed}") from None

        security = KafkaSecurity(
            protocol=get_enum("SECURITY_PROTOCOL", SecurityProtocol) or SecurityProtocol.PLAINTEXT,
            sasl_mechanism=get_enum("SASL_MECHANISM", SaslMechanism),
            sasl_username=get("SASL_USERNAME"),
            sasl_password=get("SASL_PASSWORD"),
            ssl_cafile=get("SSL_CAFILE"),
            ssl_certfile=get("SSL_CERTFILE"),
            ssl_keyfile=get("SSL_KEYFILE"),
        )
        # The local broker (``deploy/kafka``) listens on GRAYLANE_KAFKA_PORT: without a
        # bootstrap of their own, processes next to it reach it there.
        local_broker = (
            f"127.0.0.1:{get_int('KAFKA_PORT', 0)}" if get("KAFKA_PORT") is not None else None
        )
        artifact_dir = get("ARTIFACT_DIR")
        build = running_build() if env is None else read_build(source)
        signing_key = get("SIGNING_KEY")
        trusted_source = get("TRUSTED_KEYS") or ""
        trusted = _trusted_keys(trusted_source)
        return cls(
            bootstrap_servers=get("BOOTSTRAP_SERVERS") or local_broker or base.bootstrap_servers,
            topic_prefix=get("TOPIC_PREFIX") or base.topic_prefix,
            client_id=get("CLIENT_ID") or base.client_id,
            security=security,
            partitions=get_int("PARTITIONS", base.partitions),
            replication_factor=get_int("REPLICATION_FACTOR", base.replication_factor),
            audit_retention_ms=get_int("AUDIT_RETENTION_MS", base.audit_retention_ms),
            data_retention_ms=get_int("DATA_RETENTION_MS", base.data_retention_ms),
            max_request_bytes=get_int("MAX_REQUEST_BYTES", base.max_request_bytes),
            db_url=get("DB_URL") or base.db_url,
            artifact_dir=Path(artifact_dir) if artifact_dir else base.artifact_dir,
            metrics_host=get("METRICS_HOST") or base.metrics_host,
            metrics_port=get_int("METRICS_PORT", base.metrics_port),
            log_format=(get("LOG_FORMAT") or base.log_format).lower(),
            git_sha=build.git_sha,
            build_time=build.build_time,
            image_version=get("IMAGE_VERSION") or _package_version(),
            instance_id=get("INSTANCE_ID") or base.instance_id,
            signing_key=Path(signing_key) if signing_key else base.signing_key,
            trusted_keys=trusted or base.trusted_keys,
            trusted_keys_source=trusted_source,
            require_signatures=get_bool("REQUIRE_SIGNATURES", base.require_signatures),
        )

    def with_overrides(self, **changes: object) -> Settings:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("graylane")
    except PackageNotFoundError:
        return "unknown"


_FROM_FILE = frozenset({"SASL_USERNAME", "SASL_PASSWORD", "SASL_MECHANISM", "DB_URL"})
"""Secrets that may come from a mounted file (``GRAYLANE_<NAME>_FILE``, a Secret volume)
rather than the environment, which child processes, ``/proc/<pid>/environ`` and the pod's
spec all show."""


def _from_file(name: str, value: str | None, path: str | None) -> str | None:
    """``GRAYLANE_<name>``, or the content of the file ``GRAYLANE_<name>_FILE`` names (one
    trailing newline dropped); never both. Errors name the file, never its content."""
    if not path:
        return value
    if value:
        raise SettingsError(f"GRAYLANE_{name} and GRAYLANE_{name}_FILE are both set: set one")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SettingsError(f"GRAYLANE_{name}_FILE={path!r}: cannot read it ({reason})") from None
    return text.removesuffix("\n").removesuffix("\r")


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _trusted_keys(value: str) -> tuple[Path, ...]:
    """``GRAYLANE_TRUSTED_KEYS`` entries: files as named, folders as their ``*.pub`` files."""
    keys: list[Path] = []
    for entry in (Path(p) for p in value.split(os.pathsep) if p):
        keys.extend(sorted(entry.glob("*.pub")) if entry.is_dir() else [entry])
    return tuple(keys)
