"""Kafka client factories: every aiokafka client in Graylane is built here.

Services receive a :class:`KafkaFactory` (never a module-level client), so tests
and tools can build clients against any broker with the same options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from graylane.settings import Settings
from graylane.topics import TopicLayout


class OffsetReset(Enum):
    EARLIEST = "earliest"
    LATEST = "latest"


class Isolation(Enum):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


@dataclass(frozen=True, kw_only=True)
class ProducerOptions:
    """Producer tuning; idempotent with acks=all by default."""

    idempotent: bool = True
    linger_ms: int = 2
    max_batch_size: int = 256 * 1024
    compression: str | None = None
    transactional_id: str | None = None
    request_timeout_ms: int = 30_000


@dataclass(frozen=True, kw_only=True)
class ConsumerOptions:
    """Consumer tuning; offsets are always committed explicitly by the caller."""

    group_id: str | None = None
    offset_reset: OffsetReset = OffsetReset.EARLIEST
    max_poll_records: int = 500
    fetch_max_wait_ms: int = 50
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    isolation: Isolation = Isolation.READ_UNCOMMITTED
    rebalance_timeout_ms: int | None = None


@dataclass(frozen=True)
class KafkaFactory:
    """Builds producers, consumers and admin clients from one :class:`Settings`."""

    settings: Settings
    layout: TopicLayout = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        object.__setattr__(
            self,
            "layout",
            TopicLayout(
                prefix=s.topic_prefix,
                partitions=s.partitions,
                replication_factor=s.replication_factor,
                data_retention_ms=s.data_retention_ms,
                audit_retention_ms=s.audit_retention_ms,
            ),
        )

    def _common(self, client_suffix: str) -> dict[str, object]:
        s = self.settings
        options: dict[str, object] = {
            "bootstrap_servers": s.bootstrap_servers,
            "client_id": f"{s.client_id}-{client_suffix}" if client_suffix else s.client_id,
        }
        options.update(s.security.client_options())
        return options

    def producer(
        self, options: ProducerOptions | None = None, *, client_suffix: str = "producer"
    ) -> AIOKafkaProducer:
        o = options or ProducerOptions()
        kwargs = self._common(client_suffix)
        kwargs.update(
            acks="all",
            enable_idempotence=o.idempotent or o.transactional_id is not None,
            linger_ms=o.linger_ms,
            max_batch_size=o.max_batch_size,
            max_request_size=max(self.settings.max_request_bytes * 2, 1_048_576),
            request_timeout_ms=o.request_timeout_ms,
        )
        if o.compression:
            kwargs["compression_type"] = o.compression
        if o.transactional_id:
            kwargs["transactional_id"] = o.transactional_id
        return AIOKafkaProducer(**kwargs)

    def consumer(
        self,
        *topics: str,
        options: ConsumerOptions | None = None,
        client_suffix: str = "consumer",
    ) -> AIOKafkaConsumer:
        o = options or ConsumerOptions()
        kwargs = self._common(client_suffix)
        kwargs.update(
            group_id=o.group_id,
            enable_auto_commit=False,
            auto_offset_reset=o.offset_reset.value,
            max_poll_records=o.max_poll_records,
            fetch_max_wait_ms=o.fetch_max_wait_ms,
            session_timeout_ms=o.session_timeout_ms,
            heartbeat_interval_ms=o.heartbeat_interval_ms,
            max_poll_interval_ms=o.max_poll_interval_ms,
            isolation_level=o.isolation.value,
            max_partition_fetch_bytes=max(self.settings.max_request_bytes * 2, 1_048_576),
        )
        if o.rebalance_timeout_ms is not None:
            kwargs["rebalance_timeout_ms"] = o.rebalance_timeout_ms
        return AIOKafkaConsumer(*topics, **kwargs)

    def admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self._common("admin"))
