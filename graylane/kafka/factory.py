"""Kafka client factories: every aiokafka client in Graylane is built here.

Services receive a factory (never a module-level client), typed as the seam's
:class:`~graylane.kafka.seam.ClientFactory`; :class:`KafkaFactory` is the real
one, so tests can put an in-memory double behind the same calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from graylane.kafka.admin import TopicSetupReport, ensure_topics
from graylane.kafka.options import ConsumerOptions, Isolation, OffsetReset, ProducerOptions
from graylane.kafka.recovering import RecoveringProducer
from graylane.kafka.seam import BatchConsumer, Producer
from graylane.settings import Settings
from graylane.topics import TopicLayout, TopicSpec

__all__ = [
    "ConsumerOptions",
    "Isolation",
    "KafkaFactory",
    "OffsetReset",
    "ProducerOptions",
]


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
    ) -> Producer:
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
            transactional: Producer = AIOKafkaProducer(**kwargs)
            return transactional
        # Rebuilt with a new producer id after a fatal error (a long outage's sequence gap).
        # A record the broker has not acknowledged within two request timeouts (plus the
        # linger) is given up on that producer: an in-flight request on a connection that
        # died with the broker can otherwise wait for ever.
        return RecoveringProducer(
            lambda: AIOKafkaProducer(**kwargs),
            start_timeout_s=o.request_timeout_ms / 1000,
            delivery_timeout_s=2 * o.request_timeout_ms / 1000 + o.linger_ms / 1000 + 1.0,
        )

    def consumer(
        self,
        *topics: str,
        options: ConsumerOptions | None = None,
        client_suffix: str = "consumer",
    ) -> BatchConsumer:
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
        if o.group_instance_id and o.group_id:
            kwargs["group_instance_id"] = o.group_instance_id
        consumer: BatchConsumer = AIOKafkaConsumer(*topics, **kwargs)
        return consumer

    def admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self._common("admin"))

    async def ensure_topics(self, specs: Sequence[TopicSpec]) -> TopicSetupReport:
        """Create or reconfigure ``specs`` (see :func:`graylane.kafka.admin.ensure_topics`)."""
        return await ensure_topics(self, specs)
