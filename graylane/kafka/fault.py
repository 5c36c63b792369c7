"""What kind of event an error is, and so what the consume loop does about it (pure).

Errors carry their own policy: a rebalance, a broker outage, a topic deleted under a
running service, a broken producer, and any exception whose class says
``retriable = True`` (:class:`~graylane.errors.GraylaneError` and Kafka's errors both
carry the flag) are normal events, retried after a backoff. Lost credentials or
authorization are :attr:`Fault.FATAL`: the service ends, for a restart to fix.
Anything else is one record's doing (:attr:`Fault.OTHER`): the loop passes that record
over and goes on.
"""

from __future__ import annotations

from enum import Enum

from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    ClusterAuthorizationFailedError,
    CommitFailedError,
    DelegationTokenAuthorizationFailed,
    GroupAuthorizationFailedError,
    IllegalGenerationError,
    IllegalStateError,
    KafkaTimeoutError,
    RebalanceInProgressError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)

from graylane.errors import is_retriable
from graylane.kafka.recovering import is_fatal_for_producer

__all__ = ["Fault", "classify", "is_normal"]


class Fault(Enum):
    """What kind of event an error is, and so what the loop does about it.

    REBALANCE, OUTAGE, MISSING_TOPIC, PRODUCER: normal events, retried after a backoff.
    FATAL: lost credentials or authorization; the service ends (a restart can fix it).
    OTHER: none of those; one record's doing, that record is passed over (RECORD).
    """

    REBALANCE = "rebalance"
    OUTAGE = "outage"
    MISSING_TOPIC = "missing_topic"
    PRODUCER = "producer"
    FATAL = "fatal"
    RECORD = "record"
    OTHER = "other"


_REBALANCE = (
    CommitFailedError,
    IllegalStateError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    IllegalGenerationError,
)
_OUTAGE = (KafkaTimeoutError,)
"""An outage Kafka does not flag ``retriable`` (a connection lost, no broker answering,
a node not ready, a request timed out: those carry the flag)."""
_FATAL = (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    DelegationTokenAuthorizationFailed,
)
"""The cluster no longer accepts this service's login or grants it what it needs."""


def classify(exc: BaseException) -> Fault:
    """The kind of ``exc`` (pure; for logs and the fault metric).

    An error whose class says ``retriable`` (a Graylane or a Kafka error) is an outage.
    """
    if isinstance(exc, _FATAL):
        return Fault.FATAL
    if isinstance(exc, _REBALANCE):
        return Fault.REBALANCE
    if isinstance(exc, UnknownTopicOrPartitionError):
        return Fault.MISSING_TOPIC
    if is_fatal_for_producer(exc):
        return Fault.PRODUCER
    if isinstance(exc, _OUTAGE) or is_retriable(exc):
        return Fault.OUTAGE
    return Fault.OTHER


def is_normal(kind: Fault) -> bool:
    """Whether the loop retries a fault of this kind (after a backoff)."""
    return kind not in (Fault.FATAL, Fault.OTHER)
