"""Records a test writes to the real broker, and the audit records it reads back.

Each write opens a producer of its own and waits for every record's acknowledgement, so
what a test sent is on the broker when the call returns.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from graylane import serde
from graylane.clock import now_ms
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import ClientFactory
from graylane.rollouts.pb import rollout_spec_to_pb
from graylane.rollouts.spec import RolloutSpec
from graylane.v1 import audit_pb2, inference_pb2, rollout_pb2

__all__ = [
    "Key",
    "forward_request",
    "produce",
    "produce_records",
    "qos_command",
    "read_audits",
    "send_command",
    "start_command",
]

Key = bytes | str | None
"""A record key; a string is sent UTF-8 encoded."""


async def produce_records(
    factory: ClientFactory,
    topic: str,
    records: Iterable[tuple[Key, bytes | None]],
    *,
    client_suffix: str = "test-writer",
) -> None:
    """Send ``(key, value)`` records to ``topic`` in order, each acknowledged."""
    producer = factory.producer(client_suffix=client_suffix)
    await producer.start()
    try:
        for key, value in records:
            raw = key.encode("utf-8") if isinstance(key, str) else key
            await producer.send_and_wait(topic, value, key=raw)
    finally:
        await producer.stop()


async def produce(
    factory: ClientFactory,
    topic: str,
    *values: bytes | None,
    key: Key = None,
    client_suffix: str = "test-writer",
) -> None:
    """Send ``values`` to ``topic`` under one ``key``, in order, each acknowledged."""
    await produce_records(factory, topic, [(key, v) for v in values], client_suffix=client_suffix)


def forward_request(
    model: str, reply_topic: str, *, routing_key: str = ""
) -> inference_pb2.InferenceRequest:
    """A forward request (prompt "hello", argmax of the last position) with a fresh id."""
    return inference_pb2.InferenceRequest(
        request_id=uuid.uuid4().hex,
        model=model,
        routing_key=routing_key,
        prompt="hello",
        task=inference_pb2.FORWARD,
        post_process=inference_pb2.ARGMAX_LAST,
        reply_topic=reply_topic,
    )


def start_command(spec: RolloutSpec) -> rollout_pb2.RolloutCommand:
    """The command that starts the rollout ``spec``."""
    return rollout_pb2.RolloutCommand(
        command_id=f"c-{spec.rollout_id}",
        rollout_id=spec.rollout_id,
        model=spec.model,
        kind=rollout_pb2.COMMAND_START,
        spec=rollout_spec_to_pb(spec),
        issued_by="test",
        issued_at_unix_ms=now_ms(),
    )


def qos_command(policy: rollout_pb2.QosPolicy) -> rollout_pb2.RolloutCommand:
    """The command that sets ``policy`` on its model's version."""
    return rollout_pb2.RolloutCommand(
        command_id=uuid.uuid4().hex,
        model=policy.model,
        kind=rollout_pb2.COMMAND_SET_QOS_POLICY,
        qos_policy=policy,
    )


async def send_command(factory: ClientFactory, command: rollout_pb2.RolloutCommand) -> None:
    """Put a rollout command on the commands topic, keyed by its model."""
    await produce(factory, factory.layout.commands(), serde.encode(command), key=command.model)


async def read_audits(
    factory: ClientFactory,
    *,
    model: str | None = None,
    rollout_id: str | None = None,
    since_ms: int = 0,
) -> list[audit_pb2.AuditRecord]:
    """The audit topic from its start to its end now, optionally of one model or rollout,
    decided at ``since_ms`` or later."""
    records = await read_to_end(factory, factory.layout.audit(), client_suffix="test-audit")
    decoded = [serde.decode(audit_pb2.AuditRecord, r.value) for r in records if r.value]
    return [
        a
        for a in decoded
        if (model is None or a.model == model)
        and (rollout_id is None or a.rollout_id == rollout_id)
        and a.decided_at_unix_ms >= since_ms
    ]
