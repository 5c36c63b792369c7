"""The topic layout: every Graylane topic name comes from here.

``<p>`` is the configurable prefix (default ``graylane``)::

    <p>.requests.<model>              ingress, key = routing_key
    <p>.requests.<model>.<version>    one topic per model version
    <p>.results.<model>               default reply topic
    <p>.shadow.<model>                shadow pairs (candidate + mirrored baseline results)
    <p>.telemetry                     one BatchTelemetry per batch, key = model
    <p>.control.routing               compacted, key = model
    <p>.control.precision             compacted, key = model/version
    <p>.control.rollouts              compacted, key = rollout_id: RolloutState
    <p>.control.scale                 compacted, key = model/version: ScaleRequest
    <p>.control.commands              user intent from the control plane, key = model
    <p>.audit                         every decision, long retention
    <p>.dlq                           undeliverable input with its original bytes
    <p>.cancels                       CancelRequest of running generations, key = request_id
    <p>.outcomes                      Outcome of a rated answer (gateway feedback), key = model
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from graylane.artifacts.naming import NamingError, validate_model_name, validate_version_name
from graylane.errors import GraylaneError

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Cleanup",
    "ReplyTopicRefused",
    "ReplyTopicVerdict",
    "TopicKind",
    "TopicLayout",
    "TopicNameError",
    "TopicSpec",
    "check_model_name",
    "check_version_name",
]

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""``max.message.bytes`` of created topics under the default settings (twice the
default request limit)."""

_REPLY_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
"""The last segment of a reply or results topic (a client id or a model name)."""


class TopicNameError(NamingError, GraylaneError):
    """A model or version name cannot be used in a topic name."""


class ReplyTopicVerdict(Enum):
    """What a topic named as a request's reply topic is, and whether it may be used."""

    REPLY = "reply"  # <p>.reply.<client>
    RESULTS = "results"  # <p>.results.<model> of the request's own model
    OTHER_MODEL = "other-model"  # <p>.results.<another model>
    NOT_A_REPLY_TOPIC = "not-a-reply-topic"  # control, audit, requests, telemetry, dlq, ...
    OTHER_PREFIX = "other-prefix"  # outside this deployment's prefix
    MALFORMED = "malformed"  # not a valid reply/results name

    @property
    def allowed(self) -> bool:
        return self in (ReplyTopicVerdict.REPLY, ReplyTopicVerdict.RESULTS)


class ReplyTopicRefused(TopicNameError):
    """A request named a reply topic outside the allowlist."""

    def __init__(self, topic: str, verdict: ReplyTopicVerdict) -> None:
        shown = topic if len(topic) <= 120 else f"{topic[:120]}..."
        super().__init__(f"reply topic {shown!r} refused ({verdict.value})")
        self.topic = topic
        self.verdict = verdict


class TopicKind(Enum):
    INGRESS = "ingress"
    VERSION_REQUESTS = "version-requests"
    RESULTS = "results"
    SHADOW = "shadow"
    REPLY = "reply"
    TELEMETRY = "telemetry"
    ROUTING = "routing"
    PRECISION = "precision"
    ROLLOUTS = "rollouts"
    SCALE = "scale"
    COMMANDS = "commands"
    AUDIT = "audit"
    DLQ = "dlq"
    CANCELS = "cancels"
    OUTCOMES = "outcomes"


class Cleanup(Enum):
    DELETE = "delete"
    COMPACT = "compact"


@dataclass(frozen=True, kw_only=True)
class TopicSpec:
    """How a topic is created: partitions, cleanup policy, retention."""

    name: str
    kind: TopicKind
    partitions: int
    replication_factor: int
    cleanup: Cleanup
    retention_ms: int | None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def configs(self) -> dict[str, str]:
        """The configs a repair brings an existing topic back to."""
        # An acknowledged write survives one broker loss once RF >= 2
        # (the producers use acks=all).
        configs = {
            "cleanup.policy": self.cleanup.value,
            "min.insync.replicas": str(min(2, self.replication_factor)),
        }
        if self.retention_ms is not None:
            configs["retention.ms"] = str(self.retention_ms)
        if self.cleanup is Cleanup.COMPACT:
            # Control topics are tiny; compact promptly so a reader from the
            # beginning sees little more than the latest value per key.
            configs["min.cleanable.dirty.ratio"] = "0.1"
            configs["segment.ms"] = str(3600 * 1000)
        return configs

    def creation_configs(self) -> dict[str, str]:
        """:meth:`configs` plus those a topic is only created with.

        ``max.message.bytes`` is stated, not inherited: a cluster's stock default
        (1 MiB) would otherwise refuse the results and forwards Graylane's producers
        send. It is not repaired: an operator's value stands, and the services read
        each topic's effective limit (:class:`~graylane.kafka.admin.MessageLimits`)
        and answer or dead-letter what would not fit.
        """
        return {**self.configs(), "max.message.bytes": str(self.max_message_bytes)}


def check_model_name(model: str) -> str:
    """The registry's rule (:func:`~graylane.artifacts.naming.validate_model_name`)."""
    try:
        return validate_model_name(model)
    except NamingError as exc:
        raise TopicNameError(str(exc)) from None


def check_version_name(version: str) -> str:
    """The registry's rule (:func:`~graylane.artifacts.naming.validate_version_name`)."""
    try:
        return validate_version_name(version)
    except NamingError as exc:
        raise TopicNameError(str(exc)) from None


@dataclass(frozen=True, kw_only=True)
class TopicLayout:
    """Topic names and creation specs for one prefix."""

    prefix: str = "graylane"
    partitions: int = 6
    replication_factor: int = 1
    data_retention_ms: int = 7 * 24 * 3600 * 1000
    audit_retention_ms: int = 90 * 24 * 3600 * 1000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """``max.message.bytes`` of the topics created (``Settings.max_message_bytes``)."""

    # -- names -----------------------------------------------------------------
    def ingress(self, model: str) -> str:
        return f"{self.prefix}.requests.{check_model_name(model)}"

    def version_requests(self, model: str, version: str) -> str:
        return f"{self.ingress(model)}.{check_version_name(version)}"

    def worker_group(self, model: str, version: str) -> str:
        """The consumer group of a version's workers (on its version topic)."""
        return f"{self.prefix}-worker-{check_model_name(model)}-{check_version_name(version)}"

    def results(self, model: str) -> str:
        return f"{self.prefix}.results.{check_model_name(model)}"

    def shadow(self, model: str) -> str:
        return f"{self.prefix}.shadow.{check_model_name(model)}"

    def reply(self, client_id: str) -> str:
        return f"{self.prefix}.reply.{check_model_name(client_id)}"

    def telemetry(self) -> str:
        return f"{self.prefix}.telemetry"

    def routing(self) -> str:
        return f"{self.prefix}.control.routing"

    def precision(self) -> str:
        return f"{self.prefix}.control.precision"

    def rollouts(self) -> str:
        return f"{self.prefix}.control.rollouts"

    def scale(self) -> str:
        return f"{self.prefix}.control.scale"

    def commands(self) -> str:
        return f"{self.prefix}.control.commands"

    def audit(self) -> str:
        return f"{self.prefix}.audit"

    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    def cancels(self) -> str:
        return f"{self.prefix}.cancels"

    def outcomes(self) -> str:
        return f"{self.prefix}.outcomes"

    # -- reply allowlist -------------------------------------------------------
    def check_reply_topic(self, topic: str, model: str) -> ReplyTopicVerdict:
        """Classify a client-named reply topic for a request of ``model``.

        Only ``<p>.reply.<client>`` and the request's own ``<p>.results.<model>``
        are allowed: a request must never make a service write a control,
        audit, request or another model's topic.
        """
        head = f"{self.prefix}."
        if not topic.startswith(head):
            return ReplyTopicVerdict.OTHER_PREFIX
        kind, dot, name = topic[len(head) :].partition(".")
        if kind not in ("reply", "results"):
            return ReplyTopicVerdict.NOT_A_REPLY_TOPIC
        if not dot or not _REPLY_NAME.match(name):
            return ReplyTopicVerdict.MALFORMED
        if kind == "reply":
            return ReplyTopicVerdict.REPLY
        return ReplyTopicVerdict.RESULTS if name == model else ReplyTopicVerdict.OTHER_MODEL

    def reply_topic_allowed(self, topic: str, model: str) -> bool:
        return self.check_reply_topic(topic, model).allowed

    def reply_topic_for(self, requested: str, model: str, *, shadow: bool = False) -> str:
        """The topic a result of ``model`` goes to; raises :class:`ReplyTopicRefused`.

        Empty means the model's results topic. A shadow copy answers on the
        model's shadow topic (the router names it); any other name it carries
        must still pass the allowlist.
        """
        if shadow and requested == self.shadow(model):
            return requested
        if requested:
            verdict = self.check_reply_topic(requested, model)
            if not verdict.allowed:
                raise ReplyTopicRefused(requested, verdict)
        if shadow:
            return self.shadow(model)
        return requested or self.results(model)

    # -- keys of compacted topics ---------------------------------------------
    @staticmethod
    def precision_key(model: str, version: str) -> str:
        return f"{check_model_name(model)}/{check_version_name(version)}"

    @staticmethod
    def scale_key(model: str, version: str) -> str:
        """Key of a ScaleRequest on :meth:`scale` (the same ``model/version`` as precision)."""
        return TopicLayout.precision_key(model, version)

    # -- specs -----------------------------------------------------------------
    def _spec(
        self,
        name: str,
        kind: TopicKind,
        *,
        cleanup: Cleanup = Cleanup.DELETE,
        retention_ms: int | None = None,
        partitions: int | None = None,
    ) -> TopicSpec:
        return TopicSpec(
            name=name,
            kind=kind,
            partitions=self.partitions if partitions is None else partitions,
            replication_factor=self.replication_factor,
            cleanup=cleanup,
            retention_ms=retention_ms,
            max_message_bytes=self.max_message_bytes,
        )

    def shared_specs(self) -> list[TopicSpec]:
        """Topics every deployment has, whatever models it serves."""
        data = self.data_retention_ms
        return [
            self._spec(self.telemetry(), TopicKind.TELEMETRY, retention_ms=data),
            # Control topics have a single partition: one ordered stream per key
            # and a cheap read-from-beginning on start-up.
            self._spec(self.routing(), TopicKind.ROUTING, cleanup=Cleanup.COMPACT, partitions=1),
            self._spec(
                self.precision(), TopicKind.PRECISION, cleanup=Cleanup.COMPACT, partitions=1
            ),
            self._spec(self.rollouts(), TopicKind.ROLLOUTS, cleanup=Cleanup.COMPACT, partitions=1),
            self._spec(self.scale(), TopicKind.SCALE, cleanup=Cleanup.COMPACT, partitions=1),
            # Keyed by model and co-partitioned with telemetry and outcomes (the same
            # partition count): a policy engine sharded by model reads one model's
            # telemetry, commands and outcomes from the same partition index. A topic
            # created with one partition (before sharding) keeps it; see the README.
            self._spec(self.commands(), TopicKind.COMMANDS, retention_ms=self.audit_retention_ms),
            self._spec(
                self.audit(), TopicKind.AUDIT, retention_ms=self.audit_retention_ms, partitions=1
            ),
            self._spec(self.dlq(), TopicKind.DLQ, retention_ms=self.audit_retention_ms),
            # Every worker reads all of it from its end: one partition, kept briefly.
            self._spec(self.cancels(), TopicKind.CANCELS, retention_ms=3600 * 1000, partitions=1),
            # Keyed by model, like telemetry: a policy engine sharded by model reads the
            # outcomes of its own models. Kept as long as the audit (the A/B evidence).
            self._spec(self.outcomes(), TopicKind.OUTCOMES, retention_ms=self.audit_retention_ms),
        ]

    def model_specs(self, model: str, versions: list[str]) -> list[TopicSpec]:
        """Topics of one model and its versions."""
        data = self.data_retention_ms
        specs = [
            self._spec(self.ingress(model), TopicKind.INGRESS, retention_ms=data),
            self._spec(self.results(model), TopicKind.RESULTS, retention_ms=data),
            self._spec(self.shadow(model), TopicKind.SHADOW, retention_ms=data),
        ]
        specs += [
            self._spec(
                self.version_requests(model, v), TopicKind.VERSION_REQUESTS, retention_ms=data
            )
            for v in versions
        ]
        return specs

    def reply_spec(self, client_id: str) -> TopicSpec:
        return self._spec(
            self.reply(client_id), TopicKind.REPLY, retention_ms=3600 * 1000, partitions=1
        )
