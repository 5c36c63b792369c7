"""Turning a decoded request into work, or into a specific rejection (pure).

No Kafka or protobuf here: the adapter hands over plain facts and numpy arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from graylane.artifacts.model_info import ModelInfo
from graylane.engine.signature import IOSignature
from graylane.engine_worker.postprocess import PostProcess
from graylane.engine_worker.tasks import ATTENTION_MASK, INPUT_IDS, token_layout


class TaskKind(Enum):
    FORWARD = "forward"
    GENERATE = "generate"


class RejectCode(Enum):
    """Why a request is refused; maps one to one onto ``graylane.v1.ErrorCode``."""

    BAD_REQUEST = "BAD_REQUEST"
    MISSING_INPUT = "MISSING_INPUT"
    UNEXPECTED_INPUT = "UNEXPECTED_INPUT"
    BAD_DTYPE = "BAD_DTYPE"
    BAD_SHAPE = "BAD_SHAPE"
    SEQUENCE_TOO_LONG = "SEQUENCE_TOO_LONG"
    UNSUPPORTED_TASK = "UNSUPPORTED_TASK"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNKNOWN_VERSION = "UNKNOWN_VERSION"
    UNKNOWN_MODEL = "UNKNOWN_MODEL"


@dataclass(frozen=True)
class Reject:
    code: RejectCode
    message: str


@dataclass(frozen=True, kw_only=True)
class RequestFacts:
    """What the worker needs from an ``InferenceRequest``."""

    task: TaskKind
    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    token_ids: Sequence[int] = ()
    prompt: str | None = None
    post: PostProcess = PostProcess.NONE
    top_k: int = 0
    max_new_tokens: int = 0
    eos_id: int | None = None
    deadline_unix_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class WorkItem:
    """A validated request, ready to batch. ``seq_len`` drives bucket planning."""

    index: int
    task: TaskKind
    seq_len: int
    feeds: Mapping[str, np.ndarray] = field(default_factory=dict)
    prompt_tokens: tuple[int, ...] = ()
    post: PostProcess = PostProcess.NONE
    top_k: int = 5
    max_new_tokens: int = 0
    eos_id: int | None = None

    @property
    def group_key(self) -> tuple[TaskKind, PostProcess, int, int | None]:
        """Requests with equal keys can share one engine call."""
        return (self.task, self.post, self.top_k, self.eos_id)


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_seq_len: int
    max_new_tokens: int = 256
    max_batch_rows: int = 64


def tokenize_bytes(text: str) -> tuple[int, ...]:
    """Byte-level tokens of ``text`` (the demo model's vocabulary)."""
    return tuple(text.encode("utf-8"))


def prepare(
    index: int,
    facts: RequestFacts,
    io: IOSignature,
    limits: Limits,
    now_ms: int,
    info: ModelInfo | None = None,
) -> WorkItem | Reject:
    """Validate one request against the engine's IO signature, the limits and the model's info.

    ``info`` (the artifact's declared task and input vocabulary) decides whether the
    model generates and which token ids it takes; without it (an older artifact) any
    model shaped like a token model may generate and ids are only checked to be >= 0.
    """
    vocab = info.vocab_size if info is not None else None
    if facts.deadline_unix_ms and facts.deadline_unix_ms < now_ms:
        return Reject(
            RejectCode.DEADLINE_EXCEEDED,
            f"deadline passed {now_ms - facts.deadline_unix_ms} ms before the request ran",
        )
    layout = token_layout(io)
    tokens = _tokens(facts)
    if len(tokens) > limits.max_seq_len:  # before any per-token check or array
        return Reject(
            RejectCode.SEQUENCE_TOO_LONG,
            f"{len(tokens)} tokens; this model allows {limits.max_seq_len}",
        )
    if facts.task is TaskKind.GENERATE:
        from graylane.engine_worker.kv_generate import generation_layout  # imports tasks

        layout = generation_layout(io)
        if info is not None and not info.generates:
            return Reject(
                RejectCode.UNSUPPORTED_TASK,
                f"generate needs a causal-lm model; this model is {info.task.value}",
            )
        if layout is None:
            return Reject(
                RejectCode.UNSUPPORTED_TASK,
                "generate needs a token model (input_ids); "
                f"this model takes {list(io.input_names)}",
            )
        if facts.inputs:
            return Reject(RejectCode.BAD_REQUEST, "generate takes token_ids or prompt, not tensors")
        if not tokens:
            return Reject(RejectCode.BAD_REQUEST, "generate needs a non-empty prompt or token_ids")
        if len(tokens) > limits.max_seq_len:
            return Reject(
                RejectCode.SEQUENCE_TOO_LONG,
                f"prompt has {len(tokens)} tokens; this model allows {limits.max_seq_len}",
            )
        if not 0 < facts.max_new_tokens <= limits.max_new_tokens:
            return Reject(
                RejectCode.BAD_REQUEST,
                f"max_new_tokens must be in 1..{limits.max_new_tokens}, got {facts.max_new_tokens}",
            )
        bad = _bad_token(tokens, vocab)
        if bad is not None:
            return bad
        return WorkItem(
            index=index,
            task=TaskKind.GENERATE,
            seq_len=len(tokens),
            prompt_tokens=tokens,
            max_new_tokens=facts.max_new_tokens,
            eos_id=facts.eos_id,
        )

    if facts.task is not TaskKind.FORWARD:
        return Reject(RejectCode.UNSUPPORTED_TASK, f"task {facts.task} is not supported")
    top_k = facts.top_k or 5
    if facts.inputs and tokens:
        return Reject(RejectCode.BAD_REQUEST, "give either input tensors or token_ids/prompt")
    if tokens:
        if layout is None:
            return Reject(
                RejectCode.UNSUPPORTED_TASK,
                f"token_ids/prompt need a token model; this model takes {list(io.input_names)}",
            )
        bad = _bad_token(tokens, vocab)
        if bad is not None:
            return bad
        ids = np.asarray([tokens], dtype=layout.id_dtype)
        feeds: dict[str, np.ndarray] = {INPUT_IDS: ids}
        if layout.mask_dtype is not None:
            feeds[ATTENTION_MASK] = np.ones_like(ids, dtype=layout.mask_dtype)
        facts_inputs: Mapping[str, np.ndarray] = feeds
    elif facts.inputs:
        facts_inputs = facts.inputs
    else:
        return Reject(
            RejectCode.MISSING_INPUT, f"no inputs; this model takes {list(io.input_names)}"
        )

    checked = check_inputs(facts_inputs, io)
    if isinstance(checked, Reject):
        return checked
    bad_ids = _bad_token_tensor(facts_inputs, info)
    if bad_ids is not None:
        return bad_ids
    seq_len = 1
    if layout is not None:
        seq_len = int(facts_inputs[INPUT_IDS].shape[1])
        if seq_len > limits.max_seq_len:
            return Reject(
                RejectCode.SEQUENCE_TOO_LONG,
                f"sequence has {seq_len} tokens; this model allows {limits.max_seq_len}",
            )
        if seq_len < 1:
            return Reject(RejectCode.BAD_SHAPE, "input_ids has no tokens")
    rows = _rows(facts_inputs)
    if rows is not None and rows > limits.max_batch_rows:
        return Reject(
            RejectCode.BAD_SHAPE,
            f"{rows} rows in one request; the limit is {limits.max_batch_rows}",
        )
    return WorkItem(
        index=index,
        task=TaskKind.FORWARD,
        seq_len=seq_len,
        feeds=dict(facts_inputs),
        post=facts.post,
        top_k=top_k,
    )


def check_inputs(feeds: Mapping[str, np.ndarray], io: IOSignature) -> Reject | None:
    """Names, dtypes and shapes of ``feeds`` against the engine's inputs."""
    expected = set(io.input_names)
    missing = sorted(expected - set(feeds))
    extra = sorted(set(feeds) - expected)
    if missing:
        return Reject(
            RejectCode.MISSING_INPUT,
            f"missing input(s) {missing}; the model takes {sorted(expected)}",
        )
    if extra:
        return Reject(
            RejectCode.UNEXPECTED_INPUT,
            f"unexpected input(s) {extra}; the model takes {sorted(expected)}",
        )
    for spec in io.inputs:
        arr = feeds[spec.name]
        if arr.dtype != spec.dtype:
            return Reject(
                RejectCode.BAD_DTYPE,
                f"input {spec.name!r} is {arr.dtype}; the model wants {spec.dtype}",
            )
        if not spec.accepts(tuple(int(d) for d in arr.shape)):
            dims = ["?" if not isinstance(d, int) else str(d) for d in spec.shape]
            return Reject(
                RejectCode.BAD_SHAPE,
                f"input {spec.name!r} has shape {list(arr.shape)}; "
                f"the model wants [{', '.join(dims)}]",
            )
    shapes = {name: arr.shape for name, arr in feeds.items()}
    if len({s[0] for s in shapes.values() if len(s) > 0}) > 1:
        return Reject(RejectCode.BAD_SHAPE, f"inputs disagree on the batch size: {shapes}")
    if (
        INPUT_IDS in feeds
        and ATTENTION_MASK in feeds
        and feeds[INPUT_IDS].shape != feeds[ATTENTION_MASK].shape
    ):
        return Reject(RejectCode.BAD_SHAPE, "input_ids and attention_mask shapes differ")
    return None


def _tokens(facts: RequestFacts) -> tuple[int, ...]:
    if facts.token_ids:
        return tuple(map(int, facts.token_ids))
    if facts.prompt:
        return tokenize_bytes(facts.prompt)
    return ()


def _bad_token(tokens: Sequence[int], vocab: int | None) -> Reject | None:
    if any(t < 0 or (vocab is not None and t >= vocab) for t in tokens):
        bound = vocab if vocab is not None else "vocabulary size"
        return Reject(RejectCode.BAD_REQUEST, f"token ids must be in [0, {bound})")
    return None


def _bad_token_tensor(feeds: Mapping[str, np.ndarray], info: ModelInfo | None) -> Reject | None:
    """Ids of the declared token input outside the declared vocabulary (this request only)."""
    if info is None or info.token_input is None or info.token_input not in feeds:
        return None
    ids = feeds[info.token_input]
    if ids.size == 0 or ids.dtype.kind not in "iu":
        return None
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (info.vocab_size is not None and high >= info.vocab_size):
        bound = info.vocab_size if info.vocab_size is not None else "vocabulary size"
        return Reject(
            RejectCode.BAD_REQUEST,
            f"{info.token_input} holds ids in [{low}, {high}]; this model takes [0, {bound})",
        )
    return None


def _rows(feeds: Mapping[str, np.ndarray]) -> int | None:
    for arr in feeds.values():
        if arr.ndim > 0:
            return int(arr.shape[0])
    return None
