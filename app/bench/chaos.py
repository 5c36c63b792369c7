"""Chaos bench accounting and inputs, pure (no Kafka, no processes).

The per-phase figures come from acknowledged and answered request ids: the runner
(:mod:`graylane.app.bench.chaos_runner`) records what it sent and what came back and
feeds these functions. The malformed records are every kind of bad input a hostile
client can send: each kind goes onto the model's ingress topic and onto a version topic
(a writer past the router, which ACLs keep out in production). A record that names a
request id and the bench's own reply topic should come back as an error result (a
client-set shadow flag: as the requester's own OK result); the rest (undecodable
bytes, forbidden reply topics) should end in the dead-letter topic.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from graylane import serde
from graylane.clock import now_ms
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2, tensor_pb2

__all__ = [
    "KINDS",
    "Delivery",
    "Expect",
    "Malformed",
    "PhaseResult",
    "StepMark",
    "account_phase",
    "build",
    "burst",
    "recovery_seconds",
    "report_line",
    "resumed_same_step",
    "table_lines",
]


@dataclass(frozen=True, kw_only=True)
class PhaseResult:
    """What one fault phase did to the requests sent during it."""

    acked: int
    answered: int
    lost: int
    duplicates: int
    recovery_s: float | None
    services_alive: bool
    errors: int = 0
    """Acknowledged requests answered with an error result."""
    send_failed: int = 0
    """Requests whose send the broker never acknowledged (the caller saw an error)."""

    def as_json(self) -> dict[str, object]:
        return {
            "acked": self.acked,
            "answered": self.answered,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "recovery_s": self.recovery_s,
            "services_alive": self.services_alive,
            "errors": self.errors,
            "send_failed": self.send_failed,
        }


def account_phase(
    *,
    acked: Iterable[str],
    answers: Iterable[str],
    errored: Iterable[str] = (),
    recovery_s: float | None,
    services_alive: bool,
    send_failed: int = 0,
) -> PhaseResult:
    """Count one phase.

    ``acked``: request ids the broker acknowledged; ``answers``: the request id of every
    result received (one entry per result, so repeats are duplicates); ``errored``: ids
    answered with an error. Lost = acknowledged, never answered and no error.
    """
    acked_ids = set(acked)
    per_id = Counter(answers)
    answered_ids = set(per_id)
    duplicates = sum(n - 1 for n in per_id.values() if n > 1)
    errored_ids = set(errored)
    lost = acked_ids - answered_ids - errored_ids
    return PhaseResult(
        acked=len(acked_ids),
        answered=len(answered_ids & acked_ids),
        lost=len(lost),
        duplicates=duplicates,
        recovery_s=recovery_s,
        services_alive=services_alive,
        errors=len(errored_ids & acked_ids),
        send_failed=send_failed,
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One acknowledged request: when it was sent and when its first answer came (seconds)."""

    sent_at: float
    answered_at: float | None


def recovery_seconds(
    deliveries: Sequence[Delivery], *, fault_at: float, since: float, stall_s: float
) -> float | None:
    """Seconds from ``since`` until results flow again after a fault at ``fault_at``.

    ``since`` is the fault itself, or (broker outage) the broker's return. A request in
    flight at the fault or sent after it is *stalled* when its answer took longer than
    ``stall_s``. Results flow again once the last stalled request is answered and a request
    sent at ``since`` or later has been answered (a client that cannot send after an outage
    has not recovered). ``None``: no request sent since then was ever answered. Never
    negative.
    """
    answers = [
        (d.sent_at, d.answered_at)
        for d in deliveries
        if d.sent_at >= fault_at - stall_s
        and d.answered_at is not None
        and d.answered_at >= fault_at
    ]
    fresh = [at for sent, at in answers if sent >= since]
    if not fresh:
        return None
    stalled = [at for sent, at in answers if at - sent > stall_s]
    point = max([min(fresh), *stalled])
    return round(max(0.0, point - since), 2)


@dataclass(frozen=True, slots=True)
class StepMark:
    """A rollout's position as its state record told it."""

    phase: int
    step_index: int
    weight_percent: float


def resumed_same_step(before: StepMark | None, after: StepMark | None) -> bool:
    """A restarted policy engine went on from where the killed one stood."""
    if before is None or after is None:
        return False
    return (before.phase, before.step_index) == (after.phase, after.step_index)


def report_line(
    phases: Mapping[str, PhaseResult],
    *,
    rollout_resumed_same_step: bool,
    extra: Mapping[str, object] | None = None,
) -> str:
    """The bench's last output line: exactly one JSON object."""
    return json.dumps(
        {
            "phases": {name: result.as_json() for name, result in phases.items()},
            "rollout_resumed_same_step": rollout_resumed_same_step,
            **dict(extra or {}),
        },
        sort_keys=False,
    )


def table_lines(phases: Mapping[str, PhaseResult]) -> list[str]:
    """A plain-text table of the phases (one line each, with a header)."""
    head = (
        "phase",
        "acked",
        "answered",
        "errors",
        "lost",
        "dups",
        "send-fail",
        "recovery",
        "alive",
    )
    rows = [head]
    for name, r in phases.items():
        rec = "never" if r.recovery_s is None else f"{r.recovery_s:.1f} s"
        rows.append(
            (
                name,
                str(r.acked),
                str(r.answered),
                str(r.errors),
                str(r.lost),
                str(r.duplicates),
                str(r.send_failed),
                rec,
                "yes" if r.services_alive else "NO",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


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
