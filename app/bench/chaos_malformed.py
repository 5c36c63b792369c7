"""The chaos bench's malformed records: every kind of bad input a hostile client can send.

Pure: builds bytes only. Each kind goes onto the model's ingress topic and onto a
version topic (a writer past the router, which ACLs keep out in production). A record
that names a request id and the bench's own reply topic should come back as an error
result (a client-set shadow flag: as the requester's own OK result); the rest
(undecodable bytes, forbidden reply topics) should end in the dead-letter topic.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from enum import Enum

from graylane import serde
from graylane.clock import now_ms
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2, tensor_pb2


class Expect(Enum):
    """What the bench expects back on its reply topic for one record."""

    NOTHING = "nothing"
    ERROR = "error"
    OK = "ok"


@dataclass(frozen=True, slots=True)
class Malformed:
    kind: str
    value: bytes
    key: bytes
    request_id: str
    expect: Expect


KINDS = (
    "undecodable",
    "empty",
    "truncated",
    "too_many_dims",
    "huge_dims",
    "zero_batch",
    "shape_mismatch",
    "bad_dtype",
    "token_out_of_range",
    "bad_numbers",
    "sequence_too_long",
    "reply_control_topic",
    "reply_audit_topic",
    "reply_other_model",
    "reply_malformed_name",
    "oversize_ids",
    "unknown_model",
    "unknown_pinned_version",
    "expired_deadline",
    "client_shadow_flag",
)


def _request(model: str, reply: str) -> inference_pb2.InferenceRequest:
    return inference_pb2.InferenceRequest(
        request_id=f"bad-{uuid.uuid4().hex}",
        model=model,
        routing_key=f"hostile-{uuid.uuid4().hex[:6]}",
        token_ids=[5, 6, 7, 8],
        task=inference_pb2.FORWARD,
        post_process=inference_pb2.ARGMAX_LAST,
        reply_topic=reply,
        created_at_unix_ms=now_ms(),
    )


def _tensor(shape: list[int], data: bytes, dtype: int = tensor_pb2.INT64) -> tensor_pb2.Tensor:
    t = tensor_pb2.Tensor(name="input_ids", shape=shape, data=data)
    t.dtype = dtype  # type: ignore[assignment]
    return t


def build(
    kind: str,
    model: str,
    layout: TopicLayout,
    reply: str,
    rng: random.Random,
    *,
    direct: bool = False,
) -> Malformed:
    """One malformed record of ``kind`` for ``model``, answers (if any) going to ``reply``;
    ``direct``: for a version topic (past the router)."""
    req = _request(model, reply)
    expect = Expect.ERROR
    raw: bytes | None = None
    if kind == "undecodable":
        raw, expect = b"\xff\xfe" + rng.randbytes(200), Expect.NOTHING
    elif kind == "empty":
        raw, expect = b"", Expect.NOTHING
    elif kind == "truncated":
        full = serde.encode(req)
        raw, expect = full[: len(full) // 2 + 1], Expect.NOTHING
    elif kind == "too_many_dims":
        req.inputs.append(_tensor([1] * 12, (1).to_bytes(8, "little")))
    elif kind == "huge_dims":
        req.inputs.append(_tensor([2**31, 2**31, 2**20], b"\x00" * 64))
    elif kind == "zero_batch":
        req.inputs.append(_tensor([0, 16], b""))
    elif kind == "shape_mismatch":
        req.inputs.append(_tensor([1, 32], b"\x01" * 24))
    elif kind == "bad_dtype":
        req.inputs.append(_tensor([1, 4], b"\x01" * 32, dtype=97))
    elif kind == "token_out_of_range":
        req.token_ids[:] = [2**62, -5, 10**12]
    elif kind == "bad_numbers":
        req.task = inference_pb2.GENERATE
        req.top_k = -7
        req.generation.max_new_tokens = 2**31 - 1
    elif kind == "sequence_too_long":
        req.token_ids[:] = [3] * 60_000
    elif kind == "reply_control_topic":
        req.reply_topic, expect = layout.rollouts(), Expect.NOTHING
    elif kind == "reply_audit_topic":
        req.reply_topic, expect = layout.audit(), Expect.NOTHING
    elif kind == "reply_other_model":
        req.reply_topic, expect = layout.results(f"{model}-other"), Expect.NOTHING
    elif kind == "reply_malformed_name":
        req.reply_topic, expect = "../" + "x" * 300, Expect.NOTHING
    elif kind == "oversize_ids":
        req.request_id += "r" * 100_000
        req.routing_key = "k" * 100_000
        req.tags["client"] = "c" * 50_000
        # the router cannot reply to an id it will not echo: a dead letter; a worker refuses it
        expect = Expect.ERROR if direct else Expect.NOTHING
    elif kind == "unknown_model":
        req.model = "no-such-model"
    elif kind == "unknown_pinned_version":
        req.pinned_version = "99.99.99"  # the router's to refuse; a version's worker serves it
        expect = Expect.OK if direct else Expect.ERROR
    elif kind == "expired_deadline":
        req.deadline_unix_ms = now_ms() - 60_000
    elif kind == "client_shadow_flag":
        req.shadow, req.mirror_result, expect = True, True, Expect.OK  # the requester's answer
        req.routed_version, req.routing_epoch = "0.0.1", 2**62
    else:
        raise ValueError(f"unknown malformed kind {kind!r}")
    value = raw if raw is not None else serde.encode(req)
    key = (req.routing_key or "hostile")[:64].encode()
    return Malformed(kind, value, key, req.request_id, expect)


def burst(
    model: str,
    layout: TopicLayout,
    reply: str,
    *,
    per_kind: int,
    seed: int = 5,
    direct: bool = False,
) -> list[Malformed]:
    """``per_kind`` records of every kind (``direct``: for a version topic)."""
    rng = random.Random(seed)
    return [
        build(kind, model, layout, reply, rng, direct=direct)
        for kind in KINDS
        for _ in range(per_kind)
    ]
