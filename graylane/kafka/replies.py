"""Refusing a request: what it must meet, why it is refused, and where the refusal goes.

Shared by the router and the workers. :func:`field_problem` checks the length and
range caps on a request's identifying fields (pure; messages quote at most a short
prefix of the offending value, :func:`clip`); a refused request is a
:class:`Rejection` (an :class:`~graylane.errors.ErrorCode` and a message), which
:class:`ReplySink` sends as an error result when the request can be identified and
its reply topic exists, else as a dead letter with the original bytes (as many as
the dead-letter topic's limit leaves room for, :func:`dead_letter_record`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import cast

from graylane import serde
from graylane.clock import now_ms
from graylane.errors import ErrorCode, Rejection, clip
from graylane.kafka.admin import MessageLimits
from graylane.kafka.seam import Headers, Producer, Record, known_topics
from graylane.topics import ReplyTopicRefused, TopicLayout
from graylane.v1 import dlq_pb2, inference_pb2

__all__ = [
    "DEAD_LETTER_KEEP_BYTES",
    "MAX_PARTITION_KEY_BYTES",
    "MAX_TOP_K",
    "FieldCaps",
    "ReplySink",
    "dead_letter_record",
    "field_problem",
    "partition_key",
    "record_bytes",
    "reply_topic_rejection",
    "wire_code",
]

log = logging.getLogger(__name__)


# -- what a request must meet ------------------------------------------------------

MAX_TOP_K = 1024
"""The largest ``top_k`` a request may ask for."""


@dataclass(frozen=True, kw_only=True)
class FieldCaps:
    """Longest accepted value (characters) of each identifying field."""

    request_id: int = 256
    model: int = 128
    version: int = 128
    routing_key: int = 512
    reply_topic: int = 249  # Kafka's own topic-name limit
    tag: int = 256
    tags: int = 64


def field_problem(
    request: inference_pb2.InferenceRequest, caps: FieldCaps = FieldCaps()
) -> str | None:
    """Why ``request`` breaks a cap, or None."""
    fields = (
        ("request_id", request.request_id, caps.request_id),
        ("model", request.model, caps.model),
        ("pinned_version", request.pinned_version, caps.version),
        ("routed_version", request.routed_version, caps.version),
        ("routing_key", request.routing_key, caps.routing_key),
        ("reply_topic", request.reply_topic, caps.reply_topic),
    )
    for name, value, limit in fields:
        if len(value) > limit:
            return f"{name} is {len(value)} characters; the limit is {limit}"
    if len(request.tags) > caps.tags:
        return f"{len(request.tags)} tags; the limit is {caps.tags}"
    for key, value in request.tags.items():
        if len(key) > caps.tag or len(value) > caps.tag:
            return f"tag {clip(key, 40)!r} is longer than {caps.tag} characters"
    if not 0 <= request.top_k <= MAX_TOP_K:
        return f"top_k must be in 0..{MAX_TOP_K}, got {request.top_k}"
    if request.generation.max_new_tokens < 0:
        return f"max_new_tokens must not be negative, got {request.generation.max_new_tokens}"
    if request.deadline_unix_ms < 0 or request.created_at_unix_ms < 0:
        return "timestamps must not be negative"
    return None


# -- where a refused request goes ---------------------------------------------------

DEAD_LETTER_KEEP_BYTES = 64 * 1024
"""A dead letter keeps at most this much of the original key and of its value (plus the
value's sha256 and length), less where the dead-letter topic's limit leaves less room."""
DEAD_LETTER_HEADER_NAMES = 16
"""A dead letter names at most this many of the original headers (each clipped)."""
_RECORD_OVERHEAD_BYTES = 128
"""A record batch's framing around one record: 61 bytes of batch header, at most 36 of
record fields (varints), rounded up."""
_HEADER_OVERHEAD_BYTES = 10
"""A header's framing: two length varints."""
MAX_PARTITION_KEY_BYTES = 256
"""Longer keys are replaced by their sha256 (the client's partitioner hashes every byte)."""


def partition_key(key: bytes) -> bytes:
    """``key``, or its sha256 digest when it is longer than :data:`MAX_PARTITION_KEY_BYTES`.

    A hostile record's 100 KB request id as a key would cost the (pure Python) murmur2
    partitioner tens of milliseconds per send, and hold up every batch-mate.
    """
    return key if len(key) <= MAX_PARTITION_KEY_BYTES else hashlib.sha256(key).digest()


def record_bytes(value: bytes, key: bytes | None = None, headers: Headers = ()) -> int:
    """An upper bound of the bytes a record takes in a batch of its own.

    What ``max.message.bytes`` is compared with: value, key, headers and framing.
    """
    head = sum(
        len(k.encode("utf-8", "surrogateescape")) + len(v or b"") + _HEADER_OVERHEAD_BYTES
        for k, v in headers
    )
    return len(value) + len(key or b"") + head + _RECORD_OVERHEAD_BYTES


def _summarized_headers(headers: Headers) -> tuple[list[dlq_pb2.Header], int, int]:
    """The first names (clipped, without values), the count and the bytes of ``headers``."""
    names = [
        # A name read leniently may hold undecodable bytes (surrogates): shown replaced.
        dlq_pb2.Header(
            key=clip(k.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), 64)
        )
        for k, _ in list(headers)[:DEAD_LETTER_HEADER_NAMES]
    ]
    size = sum(len(k.encode("utf-8", "surrogateescape")) + len(v or b"") for k, v in headers)
    return names, len(headers), size


def dead_letter_record(
    record: Record, code: ErrorCode | int, reason: str, *, service: str, limit: int
) -> tuple[bytes, bytes | None]:
    """The value and key of ``record``'s dead letter, together under ``limit`` bytes.

    The letter keeps as much of the original key and value as fits (at most
    :data:`DEAD_LETTER_KEEP_BYTES` each), the value's length and sha256, and a
    summary of the headers (names, count, size): a record near its topic's limit,
    headers and all, still yields a letter the dead-letter topic accepts.
    """
    value = record.value or b""
    key = record.key or b""
    names, count, headers_size = _summarized_headers(record.headers or ())
    letter = dlq_pb2.DeadLetter(
        original_length=len(value),
        original_sha256=hashlib.sha256(value).digest(),
        original_truncated=True,
        original_headers=names,
        original_header_count=count,
        original_headers_length=headers_size,
        original_key_length=len(key),
        source_topic=clip(record.topic, 256),
        source_partition=record.partition,
        source_offset=record.offset,
        error_code=wire_code(code),
        reason=clip(reason, 1024),
        service=service,
        failed_at_unix_ms=now_ms(),
    )
    record_key = partition_key(key) or None
    # Two length-delimited fields add a tag and a length varint each: 12 bytes at most.
    room = limit - record_bytes(serde.encode(letter), record_key) - 12
    if room < 0:  # a limit too small even for the summary: keep the facts only
        del letter.original_headers[:]
        letter.reason = clip(reason, 80)
        room = limit - record_bytes(serde.encode(letter), record_key) - 12
    value_keep = max(0, min(len(value), DEAD_LETTER_KEEP_BYTES, room))
    key_keep = max(0, min(len(key), DEAD_LETTER_KEEP_BYTES, room - value_keep))
    letter.original_value = value[:value_keep]
    letter.original_key = key[:key_keep]
    letter.original_truncated = value_keep < len(value)
    return serde.encode(letter), record_key


def wire_code(code: ErrorCode | int) -> inference_pb2.ErrorCode:
    """``code`` as the protobuf field type (the same number)."""
    return cast("inference_pb2.ErrorCode", int(code))


def reply_topic_rejection(
    layout: TopicLayout, request: inference_pb2.InferenceRequest
) -> Rejection | None:
    """``BAD_REPLY_TOPIC`` when the request names a topic outside the allowlist."""
    try:
        layout.reply_topic_for(request.reply_topic, request.model, shadow=request.shadow)
    except ReplyTopicRefused as exc:
        return Rejection(ErrorCode.BAD_REPLY_TOPIC, str(exc))
    return None


class ReplySink:
    """Sends error results and dead letters; checks reply topics exist first.

    A send to a missing topic would block the partition for the whole metadata
    timeout, so unknown reply topics go to the DLQ at once instead.
    """

    def __init__(
        self,
        producer: Producer,
        layout: TopicLayout,
        service: str,
        *,
        limits: MessageLimits | None = None,
        refresh_s: float = 10.0,
    ) -> None:
        self._producer = producer
        self._layout = layout
        self._service = service
        self.limits = limits or MessageLimits(None, ceiling=layout.max_message_bytes)
        """How large a record each topic accepts (the ceiling alone, if not given)."""
        self._refresh_s = refresh_s
        self._known: set[str] = set()
        self._known_at = 0.0

    async def topic_exists(self, topic: str) -> bool:
        """Whether ``topic`` exists, from a cache at most ``refresh_s`` old.

        A topic deleted under a running service drops out at the next refresh, or
        at once after :meth:`forget` (called on ``UnknownTopicOrPartition``).
        """
        age = time.monotonic() - self._known_at
        if topic in self._known and age < self._refresh_s:
            return True
        if age > 0.05:
            self._known = await known_topics(self._producer)
            self._known_at = time.monotonic()
        return topic in self._known

    async def oversized(self, topic: str, value: bytes, key: bytes | None) -> str | None:
        """Why a record of ``value`` and ``key`` is over ``topic``'s limit, or None."""
        size, limit = record_bytes(value, key), await self.limits.limit(topic)
        return f"{size} bytes exceed the limit of {topic} ({limit})" if size > limit else None

    def forget(self, *_: object) -> None:
        """Drop the cached topic list (a send failed: a topic may have gone)."""
        self._known = set()
        self._known_at = 0.0

    def reply_topic(self, request: inference_pb2.InferenceRequest) -> str:
        """Where the request's result goes; raises ``ReplyTopicRefused`` (allowlist)."""
        return self._layout.reply_topic_for(
            request.reply_topic, request.model, shadow=request.shadow
        )

    async def error_result(
        self,
        request: inference_pb2.InferenceRequest,
        rejection: Rejection,
        record: Record,
        *,
        version: str = "",
        variant: str = "",
        worker_id: str = "",
    ) -> Awaitable[object]:
        """Queue an error result (or a dead letter if no reply is possible)."""
        try:
            topic = self.reply_topic(request)
        except ReplyTopicRefused as exc:
            # Nothing goes to the named topic: it may be a control or audit topic.
            reason = str(exc)
            if rejection.code is not ErrorCode.BAD_REPLY_TOPIC:
                reason = f"{rejection.message}; {reason}"
            return await self.dead_letter(record, ErrorCode.BAD_REPLY_TOPIC, reason)
        except ValueError as exc:
            return await self.dead_letter(
                record, ErrorCode.BAD_REQUEST, f"{rejection.message}; no reply topic: {exc}"
            )
        if not await self.topic_exists(topic):
            return await self.dead_letter(
                record,
                rejection.code,
                f"{rejection.message}; reply topic {topic!r} does not exist",
            )
        now = now_ms()
        result = inference_pb2.InferenceResult(
            request_id=request.request_id,
            model=request.model,
            version=version or request.routed_version,
            variant=variant,
            status=inference_pb2.ERROR,
            error_code=wire_code(rejection.code),
            error_message=rejection.message,
            shadow=request.shadow,
            shadow_pair_id=request.shadow_pair_id,
            worker_id=worker_id,
            routing_key=request.routing_key,
            task=request.task,
            timing=inference_pb2.Timing(
                created_at_unix_ms=request.created_at_unix_ms,
                routed_at_unix_ms=request.routed_at_unix_ms,
                completed_at_unix_ms=now,
                total_ms=float(max(0, now - request.created_at_unix_ms))
                if request.created_at_unix_ms
                else 0.0,
            ),
        )
        sent: Awaitable[object] = await self._producer.send(
            topic, serde.encode(result), key=partition_key(request.request_id.encode("utf-8"))
        )
        return sent

    async def dead_letter(
        self,
        record: Record,
        code: ErrorCode | int,
        reason: str,
    ) -> Awaitable[object]:
        """Queue a dead letter: the record's bytes (what fits), where it came from, and why."""
        topic = self._layout.dlq()
        value, key = dead_letter_record(
            record, code, reason, service=self._service, limit=await self.limits.limit(topic)
        )
        log.warning(
            "dead letter from %s[%d]@%d: %s",
            record.topic,
            record.partition,
            record.offset,
            clip(reason, 200),
        )
        sent: Awaitable[object] = await self._producer.send(topic, value, key=key)
        return sent
