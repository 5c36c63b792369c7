"""Client options: what a service asks of a producer or consumer, broker-agnostic."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["ConsumerOptions", "Isolation", "OffsetReset", "ProducerOptions"]


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
    heartbeat_interval_ms: int = 1_000
    """A member learns of a rebalance (a replica joining or leaving) at its next
    heartbeat, and the partitions that change hands wait for it: 1 s (not Kafka's
    3 s) keeps a scale change's pause near a second."""
    max_poll_interval_ms: int = 300_000
    isolation: Isolation = Isolation.READ_UNCOMMITTED
    rebalance_timeout_ms: int | None = None
    group_instance_id: str | None = None
    """Static membership (see :mod:`graylane.kafka.membership`); None = dynamic."""
