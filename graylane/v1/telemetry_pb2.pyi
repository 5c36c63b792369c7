from graylane.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LatencyHistogram(_message.Message):
    __slots__ = ("min_ms", "growth", "buckets", "count", "sum_ms", "max_ms")
    class BucketsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    MIN_MS_FIELD_NUMBER: _ClassVar[int]
    GROWTH_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    min_ms: float
    growth: float
    buckets: _containers.ScalarMap[int, int]
    count: int
    sum_ms: float
    max_ms: float
    def __init__(self, min_ms: _Optional[float] = ..., growth: _Optional[float] = ..., buckets: _Optional[_Mapping[int, int]] = ..., count: _Optional[int] = ..., sum_ms: _Optional[float] = ..., max_ms: _Optional[float] = ...) -> None: ...

class BatchId(_message.Message):
    __slots__ = ("worker_id", "partition", "first_offset", "attempt")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    partition: int
    first_offset: int
    attempt: int
    def __init__(self, worker_id: _Optional[str] = ..., partition: _Optional[int] = ..., first_offset: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class FinishReasonCount(_message.Message):
    __slots__ = ("reason", "count")
    REASON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    reason: _inference_pb2.FinishReason
    count: int
    def __init__(self, reason: _Optional[_Union[_inference_pb2.FinishReason, str]] = ..., count: _Optional[int] = ...) -> None: ...

class GenerationTelemetry(_message.Message):
    __slots__ = ("ttft", "tpot", "inter_token_p99", "prefill", "output_tokens", "prompt_tokens", "generated_tokens", "finish_reasons", "kv_cache_occupancy", "waiting_sequences", "running_sequences", "generations")
    TTFT_FIELD_NUMBER: _ClassVar[int]
    TPOT_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_P99_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASONS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    WAITING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    ttft: LatencyHistogram
    tpot: LatencyHistogram
    inter_token_p99: LatencyHistogram
    prefill: LatencyHistogram
    output_tokens: LatencyHistogram
    prompt_tokens: int
    generated_tokens: int
    finish_reasons: _containers.RepeatedCompositeFieldContainer[FinishReasonCount]
    kv_cache_occupancy: float
    waiting_sequences: int
    running_sequences: int
    generations: int
    def __init__(self, ttft: _Optional[_Union[LatencyHistogram, _Mapping]] = ..., tpot: _Optional[_Union[LatencyHistogram, _Mapping]] = ..., inter_token_p99: _Optional[_Union[LatencyHistogram, _Mapping]] = ..., prefill: _Optional[_Union[LatencyHistogram, _Mapping]] = ..., output_tokens: _Optional[_Union[LatencyHistogram, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., finish_reasons: _Optional[_Iterable[_Union[FinishReasonCount, _Mapping]]] = ..., kv_cache_occupancy: _Optional[float] = ..., waiting_sequences: _Optional[int] = ..., running_sequences: _Optional[int] = ..., generations: _Optional[int] = ...) -> None: ...

class BatchTelemetry(_message.Message):
    __slots__ = ("model", "version", "variant", "worker_id", "batch_size", "request_count", "error_count", "latency", "queue_wait", "queue_wait_ms_mean", "compute_ms", "device_load", "started_at_unix_ms", "completed_at_unix_ms", "shadow_count", "error_codes", "sequence_bucket", "task", "lag", "shed_count", "batch_id", "input_error_count", "generation")
    class ErrorCodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_COUNT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_MS_MEAN_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_LOAD_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_BUCKET_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    SHED_COUNT_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_ERROR_COUNT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    variant: str
    worker_id: str
    batch_size: int
    request_count: int
    error_count: int
    latency: LatencyHistogram
    queue_wait: LatencyHistogram
    queue_wait_ms_mean: float
    compute_ms: float
    device_load: float
    started_at_unix_ms: int
    completed_at_unix_ms: int
    shadow_count: int
    error_codes: _containers.ScalarMap[str, int]
    sequence_bucket: int
    task: str
    lag: int
    shed_count: int
    batch_id: BatchId
    input_error_count: int
    generation: GenerationTelemetry
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., variant: _Optional[str] = ..., worker_id: _Optional[str] = ..., batch_size: _Optional[int] = ..., request_count: _Optional[int] = ..., error_count: _Optional[int] = ..., latency: _Optional[_Union[LatencyHistogram, _Mapping]] = ..., queue_wait: _Optional[_Union[LatencyHistogram, _Mapping]] = ..., queue_wait_ms_mean: _Optional[float] = ..., compute_ms: _Optional[float] = ..., device_load: _Optional[float] = ..., started_at_unix_ms: _Optional[int] = ..., completed_at_unix_ms: _Optional[int] = ..., shadow_count: _Optional[int] = ..., error_codes: _Optional[_Mapping[str, int]] = ..., sequence_bucket: _Optional[int] = ..., task: _Optional[str] = ..., lag: _Optional[int] = ..., shed_count: _Optional[int] = ..., batch_id: _Optional[_Union[BatchId, _Mapping]] = ..., input_error_count: _Optional[int] = ..., generation: _Optional[_Union[GenerationTelemetry, _Mapping]] = ...) -> None: ...
