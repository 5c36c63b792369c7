"""Decode and validate: a fetched record becomes work, a rejection, or undecodable (pure).

Protobuf in, plain data out; no Kafka, no engine. The worker's adapter turns a
:class:`~graylane.errors.SerdeError` into a dead letter and a
:class:`~graylane.kafka.replies.Rejection` into an error result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from graylane import serde, tensors
from graylane.artifacts.model_info import ModelInfo
from graylane.engine.errors import InvalidInputError
from graylane.engine.signature import IOSignature
from graylane.engine_worker.postprocess import PostProcess
from graylane.engine_worker.requests import (
    Limits,
    Reject,
    RejectCode,
    RequestFacts,
    TaskKind,
    WorkItem,
    prepare,
)
from graylane.engine_worker.tokenizer import Tokenizer
from graylane.errors import SerdeError
from graylane.kafka.replies import Rejection, clip, field_problem
from graylane.v1 import inference_pb2

__all__ = ["IntakeRules", "decode", "request_facts", "to_rejection", "validate"]

_POST = {
    inference_pb2.POST_PROCESS_NONE: PostProcess.NONE,
    inference_pb2.ARGMAX_LAST: PostProcess.ARGMAX_LAST,
    inference_pb2.TOPK_LAST: PostProcess.TOPK_LAST,
    inference_pb2.MEAN_POOL: PostProcess.MEAN_POOL,
}
_TASK = {inference_pb2.FORWARD: TaskKind.FORWARD, inference_pb2.GENERATE: TaskKind.GENERATE}


@dataclass(frozen=True, kw_only=True)
class IntakeRules:
    """What a request is checked against: this worker's model, limits and engine inputs."""

    model: str
    max_request_bytes: int
    io: IOSignature
    limits: Limits
    tokenizer: Tokenizer | None = None
    model_info: ModelInfo | None = None
    """The artifact's declared task and input vocabulary (``None``: not declared)."""


def decode(value: bytes | None) -> inference_pb2.InferenceRequest:
    """The request in ``value``; :class:`SerdeError` when it cannot be answered at all."""
    request = serde.decode(inference_pb2.InferenceRequest, value)
    if not request.request_id:
        raise SerdeError("request has no request_id; cannot reply")
    return request


def distrust_shadow(request: inference_pb2.InferenceRequest, version: str) -> bool:
    """Clear ``shadow``/``mirror_result`` unless the router (or a replay) stamped the record.

    The router stamps ``routed_at_unix_ms`` and names this worker's version in
    ``routed_version`` on every record it forwards. A record written past it with a
    client-set shadow flag would divert the requester's own answer into the shadow
    topic (and feed the agreement gate): such flags are dropped. Whether any was.
    """
    if not (request.shadow or request.mirror_result):
        return False
    if request.routed_at_unix_ms > 0 and request.routed_version == version:
        return False
    request.shadow = request.mirror_result = False
    return True


def request_facts(
    request: inference_pb2.InferenceRequest,
    tokenizer: Tokenizer | None = None,
    max_elements: int = tensors.DEFAULT_MAX_ELEMENTS,
) -> RequestFacts | Reject:
    """The plain facts of ``request``; tensors decoded, the prompt tokenized if possible."""
    task = _TASK.get(request.task, TaskKind.FORWARD if request.task == 0 else None)
    if task is None:
        return Reject(RejectCode.UNSUPPORTED_TASK, f"task {request.task} is not supported")
    try:
        inputs = tensors.from_tensors(request.inputs, max_elements)
    except InvalidInputError as exc:  # typed: BAD_DTYPE / BAD_SHAPE carry their code
        return Reject(RejectCode(exc.code), str(exc))
    token_ids: tuple[int, ...] = tuple(request.token_ids)
    prompt = request.prompt or None
    if prompt is not None and not token_ids and tokenizer is not None:
        token_ids, prompt = tokenizer.encode(prompt), None
    gen = request.generation
    return RequestFacts(
        task=task,
        inputs=inputs,
        token_ids=token_ids,
        prompt=prompt,
        post=_POST.get(request.post_process, PostProcess.NONE),
        top_k=request.top_k,
        max_new_tokens=gen.max_new_tokens,
        eos_id=int(gen.eos_token_id) if gen.has_eos else None,
        deadline_unix_ms=request.deadline_unix_ms,
    )


def to_rejection(reject: Reject) -> Rejection:
    code = cast("inference_pb2.ErrorCode", inference_pb2.ErrorCode.Value(reject.code.value))
    return Rejection(code, reject.message)


def validate(
    request: inference_pb2.InferenceRequest,
    size_bytes: int,
    index: int,
    rules: IntakeRules,
    now_ms: int,
) -> WorkItem | Rejection:
    """A work item for batch position ``index``, or why ``request`` is refused."""
    if size_bytes > rules.max_request_bytes:
        return Rejection(
            inference_pb2.PAYLOAD_TOO_LARGE,
            f"request is {size_bytes} bytes; the limit is {rules.max_request_bytes}",
        )
    problem = field_problem(request)
    if problem is not None:
        return Rejection(inference_pb2.BAD_REQUEST, problem)
    if request.model != rules.model:
        return Rejection(
            inference_pb2.UNKNOWN_MODEL,
            f"model {clip(request.model)!r} arrived at the worker of {rules.model!r}",
        )
    facts = request_facts(request, rules.tokenizer, max(1, rules.max_request_bytes))
    prepared = (
        facts
        if isinstance(facts, Reject)
        else prepare(index, facts, rules.io, rules.limits, now_ms, rules.model_info)
    )
    return to_rejection(prepared) if isinstance(prepared, Reject) else prepared
