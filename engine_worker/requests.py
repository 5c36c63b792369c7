"""One request through the worker: its carrier, and the one pass that validates it.

A fetched record becomes a decoded ``InferenceRequest`` (:func:`decode`; a
:class:`~graylane.errors.SerdeError` when it cannot be answered at all), then, in one
pass (:func:`validate`), either a :class:`~graylane.errors.Rejection` carrying
its :class:`~graylane.errors.ErrorCode` or a :class:`WorkItem`: the reply topic
against the allowlist, size and field caps, the model, tensors, task, token ids and
limits against the engine's IO signature and the model's declared info, and a
GENERATE request's sampling (:class:`~graylane.engine_worker.logic.sampling.SamplingParams`:
temperature, top-p, top-k, seed, stop ids and strings). A validated
request travels as one :class:`Job` (its record, the request, its work and, once
run, its result or rejection) through batching, the engine and delivery. No Kafka
I/O or engine here.

Text in and out of a token model goes through a :class:`Tokenizer` only where the
model says how: given in the worker's config (the model's own ``tokenizer.json``,
:mod:`~graylane.models.hf_tokenizer`, found with its artifact), or recognised
from the model's own metadata (the demo GPT records itself in ``metadata_props``).
Without one, results carry token ids only, and a ``prompt`` falls back to the request
contract's byte-level ids (``graylane.v1.InferenceRequest.prompt``). A tokenizer that
knows the model's end-of-sequence id (:class:`KnowsEos`) stops a generation there
unless the request names its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable

import numpy as np

from graylane import serde
from graylane.artifacts.model_info import ModelInfo
from graylane.engine.errors import InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import IOSignature
from graylane.engine_options import messages_problem, native_refusal, options_problem
from graylane.engine_worker.layouts import (
    ATTENTION_MASK,
    INPUT_IDS,
    generation_layout,
    request_inputs,
    token_layout,
)
from graylane.engine_worker.logic.sampling import (
    GREEDY,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    SamplingError,
    SamplingParams,
)
from graylane.engine_worker.state import CancelKey
from graylane.errors import ErrorCode, Rejection, SerdeError, clip
from graylane.kafka.replies import field_problem, reply_topic_rejection
from graylane.kafka.seam import Record
from graylane.models.byte_vocab import META_PREFIX, decode_tokens, encode_text
from graylane.serde import PostProcess, post_process_from_pb
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2

__all__ = [
    "DemoByteTokenizer",
    "EngineRules",
    "IntakeRules",
    "Job",
    "KnowsEos",
    "Limits",
    "RequestFacts",
    "TaskKind",
    "Tokenizer",
    "WorkItem",
    "check_inputs",
    "decode",
    "detect_tokenizer",
    "distrust_shadow",
    "input_rejection",
    "prepare",
    "request_facts",
    "sampling_params",
    "tokenizer_from_metadata",
    "validate",
    "validate_engine_call",
]


class TaskKind(Enum):
    FORWARD = "forward"
    GENERATE = "generate"


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
    sampling: SamplingParams = GREEDY
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
    sampling: SamplingParams = GREEDY
    """GENERATE: how this row chooses its tokens and where it stops."""
    prompt_text: str = ""
    """GENERATE on an engine server: the prompt as text (the engine tokenizes it)."""

    @property
    def group_key(self) -> tuple[TaskKind, PostProcess, int]:
        """Requests with equal keys can share one engine call.

        GENERATE rows each carry their own EOS and sampling: any of them share a call.
        """
        return (self.task, self.post, self.top_k)


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_seq_len: int
    max_new_tokens: int = 256
    max_batch_rows: int = 64


@dataclass(eq=False)
class Job:
    """One validated request from its record to its answer (the worker's carrier).

    Batches hold jobs; the run fills ``result`` or ``rejection``, delivery sends it
    (to the record's reply topic, or as a dead letter naming the record).
    """

    record: Record
    request: inference_pb2.InferenceRequest
    work: WorkItem
    result: inference_pb2.InferenceResult | None = None
    rejection: Rejection | None = None
    stream_tail: inference_pb2.InferenceResult | None = None
    """A streamed generation's final chunk: what its reply topic gets instead of
    ``result`` (which the shadow-pairs topic still gets whole)."""

    @property
    def index(self) -> int:
        """Position of the record in its fetched cycle (names the job in errors)."""
        return self.work.index

    @property
    def cancel_key(self) -> CancelKey:
        """What a cancel must name to stop this job: its request id, reply topic and token."""
        request = self.request
        return CancelKey(request.request_id, request.reply_topic, request.cancel_token)

    @property
    def seq_len(self) -> int:
        return self.work.seq_len

    @property
    def task(self) -> TaskKind:
        return self.work.task


class Tokenizer(Protocol):
    def encode(self, text: str) -> tuple[int, ...]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


class DemoByteTokenizer:
    """The demo GPT's vocabulary: UTF-8 bytes plus BOS/EOS (skipped when decoding)."""

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(encode_text(text))

    def decode(self, tokens: Sequence[int]) -> str:
        return decode_tokens(tokens)

    def __repr__(self) -> str:
        return "DemoByteTokenizer()"


@runtime_checkable
class EncodesRendered(Protocol):
    """A tokenizer that encodes a chat template's output without adding special tokens."""

    def encode_rendered(self, text: str) -> tuple[int, ...]: ...


@runtime_checkable
class KnowsEos(Protocol):
    """A tokenizer that knows the model's end-of-sequence token."""

    @property
    def eos_id(self) -> int | None: ...


@runtime_checkable
class _HasMetadata(Protocol):
    @property
    def metadata(self) -> Mapping[str, str]: ...


def tokenizer_from_metadata(metadata: Mapping[str, str]) -> Tokenizer | None:
    """The tokenizer a model's ``metadata_props`` names, if any."""
    if f"{META_PREFIX}vocab_size" in metadata:
        return DemoByteTokenizer()
    return None


def detect_tokenizer(engines: Iterable[InferenceEngine]) -> Tokenizer | None:
    """The first tokenizer found in the metadata of engines that expose it."""
    for engine in engines:
        if isinstance(engine, _HasMetadata):
            found = tokenizer_from_metadata(engine.metadata)
            if found is not None:
                return found
    return None


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
    layout: TopicLayout | None = None
    """Where replies may go (``None``: the reply topic is not checked here)."""


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
    topic (and feed the agreement gate): such flags are dropped, and the shadow pair
    id with them. Whether any was.
    """
    if not (request.shadow or request.mirror_result):
        return False
    if request.routed_at_unix_ms > 0 and request.routed_version == version:
        return False
    request.shadow = request.mirror_result = False
    request.shadow_pair_id = ""
    return True


def input_rejection(exc: InvalidInputError) -> Rejection:
    """The error result for a request the engine refused for its own input."""
    return Rejection(exc.code, str(exc))


_TASK = {inference_pb2.FORWARD: TaskKind.FORWARD, inference_pb2.GENERATE: TaskKind.GENERATE}


def request_facts(
    request: inference_pb2.InferenceRequest,
    tokenizer: Tokenizer | None = None,
    max_elements: int = serde.DEFAULT_MAX_ELEMENTS,
) -> RequestFacts | Rejection:
    """The plain facts of ``request``; tensors decoded, the prompt tokenized if possible."""
    task = _TASK.get(request.task, TaskKind.FORWARD if request.task == 0 else None)
    if task is None:
        return Rejection(ErrorCode.UNSUPPORTED_TASK, f"task {request.task} is not supported")
    try:
        inputs = serde.from_tensors(request.inputs, max_elements)
    except InvalidInputError as exc:  # typed: BAD_DTYPE / BAD_SHAPE carry their code
        return input_rejection(exc)
    token_ids: tuple[int, ...] = tuple(request.token_ids)
    prompt = request.prompt or None
    if prompt is not None and not token_ids and tokenizer is not None:
        if request.messages and isinstance(tokenizer, EncodesRendered):
            # A chat: the gateway rendered the model's template, which placed the special
            # tokens itself; encoding as transformers' apply_chat_template does adds none.
            token_ids, prompt = tokenizer.encode_rendered(prompt), None
        else:
            token_ids, prompt = tokenizer.encode(prompt), None
    gen = request.generation
    sampling = sampling_params(gen) if task is TaskKind.GENERATE else GREEDY
    if isinstance(sampling, Rejection):
        return sampling
    return RequestFacts(
        task=task,
        inputs=inputs,
        token_ids=token_ids,
        prompt=prompt,
        post=post_process_from_pb(request.post_process),
        top_k=request.top_k,
        max_new_tokens=gen.max_new_tokens,
        eos_id=int(gen.eos_token_id) if gen.has_eos else _model_eos(tokenizer),
        sampling=sampling,
        deadline_unix_ms=request.deadline_unix_ms,
    )


def _model_eos(tokenizer: Tokenizer | None) -> int | None:
    return tokenizer.eos_id if isinstance(tokenizer, KnowsEos) else None


def sampling_params(gen: inference_pb2.GenerationParams) -> SamplingParams | Rejection:
    """The sampling a request's generation params ask for, or why it is refused."""
    if len(gen.stop_token_ids) > MAX_STOP_TOKEN_IDS:  # counted before anything is copied
        return Rejection(
            ErrorCode.BAD_REQUEST,
            f"{len(gen.stop_token_ids)} stop_token_ids; the limit is {MAX_STOP_TOKEN_IDS}",
        )
    named = len(gen.stop) + len(gen.turn_end)  # counted before anything is copied
    if named > MAX_STOP_STRINGS:
        return Rejection(
            ErrorCode.BAD_REQUEST, f"{named} stop strings; the limit is {MAX_STOP_STRINGS}"
        )
    stops = tuple(dict.fromkeys((*gen.stop, *gen.turn_end)))
    try:
        return SamplingParams(
            temperature=float(gen.temperature),
            top_p=float(gen.top_p),
            top_k=int(gen.sampling_top_k),
            seed=int(gen.seed) if gen.has_seed else None,
            stop_token_ids=tuple(int(t) for t in gen.stop_token_ids),
            stop=stops,
        )
    except SamplingError as exc:
        return Rejection(ErrorCode.BAD_REQUEST, str(exc))


def _front_problem(
    request: inference_pb2.InferenceRequest,
    size_bytes: int,
    *,
    model: str,
    max_request_bytes: int,
    layout: TopicLayout | None,
) -> Rejection | None:
    """What every worker checks first: the reply topic, the size, the identifying fields
    and the model."""
    refused = reply_topic_rejection(layout, request) if layout else None
    if refused is not None:
        return refused
    if size_bytes > max_request_bytes:
        return Rejection(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request is {size_bytes} bytes; the limit is {max_request_bytes}",
        )
    problem = field_problem(request)
    if problem is not None:
        return Rejection(ErrorCode.BAD_REQUEST, problem)
    if request.model != model:
        return Rejection(
            ErrorCode.UNKNOWN_MODEL,
            f"model {clip(request.model)!r} arrived at the worker of {model!r}",
        )
    return None


def validate(
    request: inference_pb2.InferenceRequest,
    size_bytes: int,
    index: int,
    rules: IntakeRules,
    now_ms: int,
) -> WorkItem | Rejection:
    """A work item for batch position ``index``, or why ``request`` is refused."""
    front = _front_problem(
        request,
        size_bytes,
        model=rules.model,
        max_request_bytes=rules.max_request_bytes,
        layout=rules.layout,
    )
    if front is not None:
        return front
    engine_only = native_refusal(request)
    if engine_only is not None:
        return Rejection(
            ErrorCode.BAD_REQUEST,
            f"{engine_only} is not supported by this version: it is served by Graylane's own "
            "decoder (versions served by an engine server take it)",
        )
    facts = request_facts(request, rules.tokenizer, max(1, rules.max_request_bytes))
    if isinstance(facts, Rejection):
        return facts
    if facts.sampling.stop and rules.tokenizer is None:
        return Rejection(
            ErrorCode.BAD_REQUEST,
            "stop strings need the model's tokenizer and this model has none; use stop_token_ids",
        )
    return prepare(index, facts, rules.io, rules.limits, now_ms, rules.model_info)


@dataclass(frozen=True, kw_only=True)
class EngineRules:
    """What a request for an engine-served version is checked against."""

    model: str
    max_request_bytes: int
    max_new_tokens: int
    layout: TopicLayout | None = None
    """Where replies may go (``None``: the reply topic is not checked here)."""


def validate_engine_call(
    request: inference_pb2.InferenceRequest,
    size_bytes: int,
    index: int,
    rules: EngineRules,
    now_ms: int,
) -> WorkItem | Rejection:
    """A generation for an engine server, or why ``request`` is refused: a ``GENERATE``
    with a conversation, a text prompt or token ids, a bounded ``max_new_tokens``,
    sampling the worker accepts and engine options within their ranges. The prompt is
    not tokenized here (the engine does it, with the chat template it was deployed with);
    its length against the model's context is the engine's to judge."""
    front = _front_problem(
        request,
        size_bytes,
        model=rules.model,
        max_request_bytes=rules.max_request_bytes,
        layout=rules.layout,
    )
    if front is not None:
        return front
    if request.task != inference_pb2.GENERATE:
        return Rejection(
            ErrorCode.UNSUPPORTED_TASK,
            "this version is served by an engine server, which only generates (task GENERATE)",
        )
    if request.inputs:
        return Rejection(ErrorCode.BAD_REQUEST, "generate takes a prompt or messages, not tensors")
    if request.deadline_unix_ms and request.deadline_unix_ms < now_ms:
        return Rejection(
            ErrorCode.DEADLINE_EXCEEDED,
            f"deadline passed {now_ms - request.deadline_unix_ms} ms before the request ran",
        )
    if not (request.messages or request.prompt or request.token_ids):
        return Rejection(ErrorCode.BAD_REQUEST, "generate needs messages, a prompt or token_ids")
    if any(t < 0 for t in request.token_ids):
        return Rejection(ErrorCode.BAD_REQUEST, "token ids must be >= 0")
    gen = request.generation
    if not 0 < gen.max_new_tokens <= rules.max_new_tokens:
        return Rejection(
            ErrorCode.BAD_REQUEST,
            f"max_new_tokens must be in 1..{rules.max_new_tokens}, got {gen.max_new_tokens}",
        )
    sampling = sampling_params(gen)
    if isinstance(sampling, Rejection):
        return sampling
    problem = messages_problem(request.messages) or options_problem(request.engine_options)
    if problem is not None:
        return Rejection(ErrorCode.BAD_REQUEST, problem)
    if request.engine_options.n > 1 and gen.stream:
        return Rejection(ErrorCode.BAD_REQUEST, "n > 1 is answered unstreamed only")
    text = "" if request.messages or request.token_ids else request.prompt
    return WorkItem(
        index=index,
        task=TaskKind.GENERATE,
        seq_len=len(request.token_ids) or len(text),
        prompt_tokens=tuple(request.token_ids) if not request.messages else (),
        prompt_text=text,
        max_new_tokens=gen.max_new_tokens,
        sampling=sampling,
    )


def prepare(
    index: int,
    facts: RequestFacts,
    io: IOSignature,
    limits: Limits,
    now_ms: int,
    info: ModelInfo | None = None,
) -> WorkItem | Rejection:
    """Validate one request against the engine's IO signature, the limits and the model's info.

    ``info`` (the artifact's declared task and input vocabulary) decides whether the
    model generates and which token ids it takes; without it (an older artifact) any
    model shaped like a token model may generate and ids are only checked to be >= 0.
    """
    if facts.deadline_unix_ms and facts.deadline_unix_ms < now_ms:
        return Rejection(
            ErrorCode.DEADLINE_EXCEEDED,
            f"deadline passed {now_ms - facts.deadline_unix_ms} ms before the request ran",
        )
    tokens = _tokens(facts)
    if len(tokens) > limits.max_seq_len:  # before any per-token check or array
        return Rejection(
            ErrorCode.SEQUENCE_TOO_LONG,
            f"{len(tokens)} tokens; this model allows {limits.max_seq_len}",
        )
    if facts.task is TaskKind.GENERATE:
        return _prepare_generate(index, facts, io, limits, info)
    return _prepare_forward(index, facts, io, limits, info)


def _prepare_generate(
    index: int, facts: RequestFacts, io: IOSignature, limits: Limits, info: ModelInfo | None
) -> WorkItem | Rejection:
    """A generate request: a causal token model, a prompt, and a bounded new-token count."""
    tokens = _tokens(facts)
    if info is not None and not info.generates:
        return Rejection(
            ErrorCode.UNSUPPORTED_TASK,
            f"generate needs a causal-lm model; this model is {info.task.value}",
        )
    if generation_layout(io) is None:
        return Rejection(
            ErrorCode.UNSUPPORTED_TASK,
            f"generate needs a token model (input_ids); this model takes {list(io.input_names)}",
        )
    if facts.inputs:
        return Rejection(ErrorCode.BAD_REQUEST, "generate takes token_ids or prompt, not tensors")
    if not tokens:
        return Rejection(ErrorCode.BAD_REQUEST, "generate needs a non-empty prompt or token_ids")
    if not 0 < facts.max_new_tokens <= limits.max_new_tokens:
        return Rejection(
            ErrorCode.BAD_REQUEST,
            f"max_new_tokens must be in 1..{limits.max_new_tokens}, got {facts.max_new_tokens}",
        )
    bad = _bad_token(tokens, _vocab(info))
    if bad is not None:
        return bad
    vocab = _vocab(info)
    if vocab is not None and any(t >= vocab for t in facts.sampling.stop_token_ids):
        return Rejection(
            ErrorCode.BAD_REQUEST,
            f"stop_token_ids must be in [0, {vocab}), got {list(facts.sampling.stop_token_ids)}",
        )
    return WorkItem(
        index=index,
        task=TaskKind.GENERATE,
        seq_len=len(tokens),
        prompt_tokens=tokens,
        max_new_tokens=facts.max_new_tokens,
        eos_id=facts.eos_id,
        sampling=facts.sampling,
    )


def _prepare_forward(
    index: int, facts: RequestFacts, io: IOSignature, limits: Limits, info: ModelInfo | None
) -> WorkItem | Rejection:
    """A forward request: input tensors, or token ids a token model takes as its inputs."""
    tokens = _tokens(facts)
    layout = token_layout(io)
    top_k = facts.top_k or 5
    if facts.inputs and tokens:
        return Rejection(ErrorCode.BAD_REQUEST, "give either input tensors or token_ids/prompt")
    if tokens:
        if layout is None:
            return Rejection(
                ErrorCode.UNSUPPORTED_TASK,
                f"token_ids/prompt need a token model; this model takes {list(io.input_names)}",
            )
        bad = _bad_token(tokens, _vocab(info))
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
        return Rejection(
            ErrorCode.MISSING_INPUT, f"no inputs; this model takes {list(io.input_names)}"
        )

    checked = check_inputs(facts_inputs, request_inputs(io))
    if isinstance(checked, Rejection):
        return checked
    bad_ids = _bad_token_tensor(facts_inputs, info)
    if bad_ids is not None:
        return bad_ids
    seq_len = 1
    if layout is not None:
        seq_len = int(facts_inputs[INPUT_IDS].shape[1])
        if seq_len > limits.max_seq_len:
            return Rejection(
                ErrorCode.SEQUENCE_TOO_LONG,
                f"sequence has {seq_len} tokens; this model allows {limits.max_seq_len}",
            )
        if seq_len < 1:
            return Rejection(ErrorCode.BAD_SHAPE, "input_ids has no tokens")
    rows = _rows(facts_inputs)
    if rows is not None and rows > limits.max_batch_rows:
        return Rejection(
            ErrorCode.BAD_SHAPE,
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


def check_inputs(feeds: Mapping[str, np.ndarray], io: IOSignature) -> Rejection | None:
    """Names, dtypes and shapes of ``feeds`` against the engine's inputs: the engine's
    own check (:meth:`~graylane.engine.signature.IOSignature.check_feeds`, its typed
    errors carrying their codes), then what one request's rows must agree on."""
    try:
        io.check_feeds(feeds)
    except InvalidInputError as exc:
        return input_rejection(exc)
    shapes = {name: arr.shape for name, arr in feeds.items()}
    if len({s[0] for s in shapes.values() if len(s) > 0}) > 1:
        return Rejection(ErrorCode.BAD_SHAPE, f"inputs disagree on the batch size: {shapes}")
    if (
        INPUT_IDS in feeds
        and ATTENTION_MASK in feeds
        and feeds[INPUT_IDS].shape != feeds[ATTENTION_MASK].shape
    ):
        return Rejection(ErrorCode.BAD_SHAPE, "input_ids and attention_mask shapes differ")
    return None


def _tokens(facts: RequestFacts) -> tuple[int, ...]:
    if facts.token_ids:
        return tuple(map(int, facts.token_ids))
    if facts.prompt:
        return tuple(encode_text(facts.prompt))  # the contract's byte-level ids
    return ()


def _vocab(info: ModelInfo | None) -> int | None:
    return info.vocab_size if info is not None else None


def _bad_token(tokens: Sequence[int], vocab: int | None) -> Rejection | None:
    if any(t < 0 or (vocab is not None and t >= vocab) for t in tokens):
        bound = vocab if vocab is not None else "vocabulary size"
        return Rejection(ErrorCode.BAD_REQUEST, f"token ids must be in [0, {bound})")
    return None


def _bad_token_tensor(feeds: Mapping[str, np.ndarray], info: ModelInfo | None) -> Rejection | None:
    """Ids of the declared token input outside the declared vocabulary (this request only)."""
    if info is None or info.token_input is None or info.token_input not in feeds:
        return None
    ids = feeds[info.token_input]
    if ids.size == 0 or ids.dtype.kind not in "iu":
        return None
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (info.vocab_size is not None and high >= info.vocab_size):
        bound = info.vocab_size if info.vocab_size is not None else "vocabulary size"
        return Rejection(
            ErrorCode.BAD_REQUEST,
            f"{info.token_input} holds ids in [{low}, {high}]; this model takes [0, {bound})",
        )
    return None


def _rows(feeds: Mapping[str, np.ndarray]) -> int | None:
    for arr in feeds.values():
        if arr.ndim > 0:
            return int(arr.shape[0])
    return None
