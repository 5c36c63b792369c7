from graylane.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Header(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("original_key", "original_value", "original_headers", "source_topic", "source_partition", "source_offset", "error_code", "reason", "service", "failed_at_unix_ms", "original_length", "original_sha256", "original_truncated", "original_header_count", "original_headers_length", "original_key_length")
    ORIGINAL_KEY_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_HEADERS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_SHA256_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_HEADER_COUNT_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_HEADERS_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_KEY_LENGTH_FIELD_NUMBER: _ClassVar[int]
    original_key: bytes
    original_value: bytes
    original_headers: _containers.RepeatedCompositeFieldContainer[Header]
    source_topic: str
    source_partition: int
    source_offset: int
    error_code: _inference_pb2.ErrorCode
    reason: str
    service: str
    failed_at_unix_ms: int
    original_length: int
    original_sha256: bytes
    original_truncated: bool
    original_header_count: int
    original_headers_length: int
    original_key_length: int
    def __init__(self, original_key: _Optional[bytes] = ..., original_value: _Optional[bytes] = ..., original_headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., source_topic: _Optional[str] = ..., source_partition: _Optional[int] = ..., source_offset: _Optional[int] = ..., error_code: _Optional[_Union[_inference_pb2.ErrorCode, str]] = ..., reason: _Optional[str] = ..., service: _Optional[str] = ..., failed_at_unix_ms: _Optional[int] = ..., original_length: _Optional[int] = ..., original_sha256: _Optional[bytes] = ..., original_truncated: _Optional[bool] = ..., original_header_count: _Optional[int] = ..., original_headers_length: _Optional[int] = ..., original_key_length: _Optional[int] = ...) -> None: ...
