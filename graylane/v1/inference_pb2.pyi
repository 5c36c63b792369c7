from graylane.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Task(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_UNSPECIFIED: _ClassVar[Task]
    FORWARD: _ClassVar[Task]
    GENERATE: _ClassVar[Task]

class PostProcess(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POST_PROCESS_NONE: _ClassVar[PostProcess]
    ARGMAX_LAST: _ClassVar[PostProcess]
    TOPK_LAST: _ClassVar[PostProcess]
    MEAN_POOL: _ClassVar[PostProcess]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    LENGTH: _ClassVar[FinishReason]
    STOP: _ClassVar[FinishReason]
    EOS: _ClassVar[FinishReason]
    CANCELLED: _ClassVar[FinishReason]
    FAILED: _ClassVar[FinishReason]
    MAX_SEQUENCE: _ClassVar[FinishReason]
    TOOL_CALLS: _ClassVar[FinishReason]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    OK: _ClassVar[Status]
    ERROR: _ClassVar[Status]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    DECODE_ERROR: _ClassVar[ErrorCode]
    UNKNOWN_MODEL: _ClassVar[ErrorCode]
    UNKNOWN_VERSION: _ClassVar[ErrorCode]
    MISSING_INPUT: _ClassVar[ErrorCode]
    UNEXPECTED_INPUT: _ClassVar[ErrorCode]
    BAD_DTYPE: _ClassVar[ErrorCode]
    BAD_SHAPE: _ClassVar[ErrorCode]
    PAYLOAD_TOO_LARGE: _ClassVar[ErrorCode]
    SEQUENCE_TOO_LONG: _ClassVar[ErrorCode]
    DEADLINE_EXCEEDED: _ClassVar[ErrorCode]
    UNSUPPORTED_TASK: _ClassVar[ErrorCode]
    BAD_REQUEST: _ClassVar[ErrorCode]
    ENGINE_FAILURE: _ClassVar[ErrorCode]
    INJECTED_FAULT: _ClassVar[ErrorCode]
    INTERNAL: _ClassVar[ErrorCode]
    BAD_REPLY_TOPIC: _ClassVar[ErrorCode]
    SHED: _ClassVar[ErrorCode]
    RESULT_TOO_LARGE: _ClassVar[ErrorCode]
    BAD_ROUTING_TABLE: _ClassVar[ErrorCode]
    ENGINE_UNAVAILABLE: _ClassVar[ErrorCode]
    UNAUTHENTICATED: _ClassVar[ErrorCode]
    PERMISSION_DENIED: _ClassVar[ErrorCode]
    RATE_LIMITED: _ClassVar[ErrorCode]
    OVERLOADED: _ClassVar[ErrorCode]
    NOT_FOUND: _ClassVar[ErrorCode]
    ALREADY_EXISTS: _ClassVar[ErrorCode]
    FAILED_PRECONDITION: _ClassVar[ErrorCode]

class Decoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECODING_UNSPECIFIED: _ClassVar[Decoding]
    GREEDY: _ClassVar[Decoding]
    SEEDED: _ClassVar[Decoding]
    UNSEEDED: _ClassVar[Decoding]
TASK_UNSPECIFIED: Task
FORWARD: Task
GENERATE: Task
POST_PROCESS_NONE: PostProcess
ARGMAX_LAST: PostProcess
TOPK_LAST: PostProcess
MEAN_POOL: PostProcess
FINISH_REASON_UNSPECIFIED: FinishReason
LENGTH: FinishReason
STOP: FinishReason
EOS: FinishReason
CANCELLED: FinishReason
FAILED: FinishReason
MAX_SEQUENCE: FinishReason
TOOL_CALLS: FinishReason
STATUS_UNSPECIFIED: Status
OK: Status
ERROR: Status
ERROR_CODE_UNSPECIFIED: ErrorCode
DECODE_ERROR: ErrorCode
UNKNOWN_MODEL: ErrorCode
UNKNOWN_VERSION: ErrorCode
MISSING_INPUT: ErrorCode
UNEXPECTED_INPUT: ErrorCode
BAD_DTYPE: ErrorCode
BAD_SHAPE: ErrorCode
PAYLOAD_TOO_LARGE: ErrorCode
SEQUENCE_TOO_LONG: ErrorCode
DEADLINE_EXCEEDED: ErrorCode
UNSUPPORTED_TASK: ErrorCode
BAD_REQUEST: ErrorCode
ENGINE_FAILURE: ErrorCode
INJECTED_FAULT: ErrorCode
INTERNAL: ErrorCode
BAD_REPLY_TOPIC: ErrorCode
SHED: ErrorCode
RESULT_TOO_LARGE: ErrorCode
BAD_ROUTING_TABLE: ErrorCode
ENGINE_UNAVAILABLE: ErrorCode
UNAUTHENTICATED: ErrorCode
PERMISSION_DENIED: ErrorCode
RATE_LIMITED: ErrorCode
OVERLOADED: ErrorCode
NOT_FOUND: ErrorCode
ALREADY_EXISTS: ErrorCode
FAILED_PRECONDITION: ErrorCode
DECODING_UNSPECIFIED: Decoding
GREEDY: Decoding
SEEDED: Decoding
UNSEEDED: Decoding

class GenerationParams(_message.Message):
    __slots__ = ("max_new_tokens", "eos_token_id", "has_eos", "temperature", "top_p", "sampling_top_k", "seed", "has_seed", "stop_token_ids", "stop", "stream", "stream_every_tokens", "stream_every_ms", "ttft_deadline_ms", "turn_end")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_EOS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    HAS_SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STREAM_EVERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STREAM_EVERY_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    TURN_END_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    eos_token_id: int
    has_eos: bool
    temperature: float
    top_p: float
    sampling_top_k: int
    seed: int
    has_seed: bool
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stop: _containers.RepeatedScalarFieldContainer[str]
    stream: bool
    stream_every_tokens: int
    stream_every_ms: int
    ttft_deadline_ms: int
    turn_end: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_new_tokens: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., has_eos: _Optional[bool] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., sampling_top_k: _Optional[int] = ..., seed: _Optional[int] = ..., has_seed: _Optional[bool] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., stop: _Optional[_Iterable[str]] = ..., stream: _Optional[bool] = ..., stream_every_tokens: _Optional[int] = ..., stream_every_ms: _Optional[int] = ..., ttft_deadline_ms: _Optional[int] = ..., turn_end: _Optional[_Iterable[str]] = ...) -> None: ...

class InferenceRequest(_message.Message):
    __slots__ = ("request_id", "model", "routing_key", "tags", "inputs", "prompt", "token_ids", "task", "generation", "post_process", "top_k", "deadline_unix_ms", "reply_topic", "created_at_unix_ms", "pinned_version", "shadow", "mirror_result", "routed_version", "routed_at_unix_ms", "routing_epoch", "shadow_pair_id", "messages", "engine_options", "cancel_token")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    POST_PROCESS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REPLY_TOPIC_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PINNED_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    MIRROR_RESULT_FIELD_NUMBER: _ClassVar[int]
    ROUTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHADOW_PAIR_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    routing_key: str
    tags: _containers.ScalarMap[str, str]
    inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    prompt: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    task: Task
    generation: GenerationParams
    post_process: PostProcess
    top_k: int
    deadline_unix_ms: int
    reply_topic: str
    created_at_unix_ms: int
    pinned_version: str
    shadow: bool
    mirror_result: bool
    routed_version: str
    routed_at_unix_ms: int
    routing_epoch: int
    shadow_pair_id: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    engine_options: EngineOptions
    cancel_token: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., routing_key: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ..., inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., prompt: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., task: _Optional[_Union[Task, str]] = ..., generation: _Optional[_Union[GenerationParams, _Mapping]] = ..., post_process: _Optional[_Union[PostProcess, str]] = ..., top_k: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., reply_topic: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ..., pinned_version: _Optional[str] = ..., shadow: _Optional[bool] = ..., mirror_result: _Optional[bool] = ..., routed_version: _Optional[str] = ..., routed_at_unix_ms: _Optional[int] = ..., routing_epoch: _Optional[int] = ..., shadow_pair_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., engine_options: _Optional[_Union[EngineOptions, _Mapping]] = ..., cancel_token: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id", "reply_topic", "model", "created_at_unix_ms", "cancel_token")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLY_TOPIC_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reply_topic: str
    model: str
    created_at_unix_ms: int
    cancel_token: str
    def __init__(self, request_id: _Optional[str] = ..., reply_topic: _Optional[str] = ..., model: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ..., cancel_token: _Optional[str] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("created_at_unix_ms", "routed_at_unix_ms", "dequeued_at_unix_ms", "completed_at_unix_ms", "queue_wait_ms", "compute_ms", "total_ms", "batch_size", "ttft_ms", "tpot_ms", "prefill_ms", "inter_token_p99_ms")
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DEQUEUED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_P99_MS_FIELD_NUMBER: _ClassVar[int]
    created_at_unix_ms: int
    routed_at_unix_ms: int
    dequeued_at_unix_ms: int
    completed_at_unix_ms: int
    queue_wait_ms: float
    compute_ms: float
    total_ms: float
    batch_size: int
    ttft_ms: float
    tpot_ms: float
    prefill_ms: float
    inter_token_p99_ms: float
    def __init__(self, created_at_unix_ms: _Optional[int] = ..., routed_at_unix_ms: _Optional[int] = ..., dequeued_at_unix_ms: _Optional[int] = ..., completed_at_unix_ms: _Optional[int] = ..., queue_wait_ms: _Optional[float] = ..., compute_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., batch_size: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., prefill_ms: _Optional[float] = ..., inter_token_p99_ms: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class StreamChunk(_message.Message):
    __slots__ = ("sequence", "final")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    final: bool
    def __init__(self, sequence: _Optional[int] = ..., final: _Optional[bool] = ...) -> None: ...

class InferenceResult(_message.Message):
    __slots__ = ("request_id", "model", "version", "variant", "outputs", "generated_token_ids", "text", "status", "error_code", "error_message", "timing", "shadow", "worker_id", "routing_key", "task", "shadow_pair_id", "finish_reason", "usage", "chunk", "decoding", "logprobs", "tool_calls", "extra_choices", "prompt_sha256")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    SHADOW_PAIR_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    DECODING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_CHOICES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_SHA256_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    version: str
    variant: str
    outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    generated_token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    status: Status
    error_code: ErrorCode
    error_message: str
    timing: Timing
    shadow: bool
    worker_id: str
    routing_key: str
    task: Task
    shadow_pair_id: str
    finish_reason: FinishReason
    usage: Usage
    chunk: StreamChunk
    decoding: Decoding
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    extra_choices: _containers.RepeatedCompositeFieldContainer[Choice]
    prompt_sha256: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., variant: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., generated_token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., status: _Optional[_Union[Status, str]] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., shadow: _Optional[bool] = ..., worker_id: _Optional[str] = ..., routing_key: _Optional[str] = ..., task: _Optional[_Union[Task, str]] = ..., shadow_pair_id: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., chunk: _Optional[_Union[StreamChunk, _Mapping]] = ..., decoding: _Optional[_Union[Decoding, str]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., extra_choices: _Optional[_Iterable[_Union[Choice, _Mapping]]] = ..., prompt_sha256: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name", "tool_call_id", "tool_calls")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    tool_call_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class EngineOptions(_message.Message):
    __slots__ = ("n", "logprobs", "top_logprobs", "response_format_json", "tools_json", "tool_choice_json", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_p")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_JSON_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    n: int
    logprobs: bool
    top_logprobs: int
    response_format_json: str
    tools_json: str
    tool_choice_json: str
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    min_p: float
    def __init__(self, n: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., response_format_json: _Optional[str] = ..., tools_json: _Optional[str] = ..., tool_choice_json: _Optional[str] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_p: _Optional[float] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token", "logprob", "bytes")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    bytes: bytes
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., bytes: _Optional[bytes] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "logprob", "bytes", "top_logprobs")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    bytes: bytes
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., bytes: _Optional[bytes] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("index", "text", "finish_reason", "logprobs", "tool_calls")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    finish_reason: FinishReason
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...
