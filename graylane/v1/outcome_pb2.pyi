from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OutcomeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_KIND_UNSPECIFIED: _ClassVar[OutcomeKind]
    OUTCOME_THUMBS: _ClassVar[OutcomeKind]
    OUTCOME_SCORE: _ClassVar[OutcomeKind]
OUTCOME_KIND_UNSPECIFIED: OutcomeKind
OUTCOME_THUMBS: OutcomeKind
OUTCOME_SCORE: OutcomeKind

class Outcome(_message.Message):
    __slots__ = ("request_id", "model", "version", "tenant", "value", "kind", "rated_at_unix_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    version: str
    tenant: str
    value: float
    kind: OutcomeKind
    rated_at_unix_ms: int
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., tenant: _Optional[str] = ..., value: _Optional[float] = ..., kind: _Optional[_Union[OutcomeKind, str]] = ..., rated_at_unix_ms: _Optional[int] = ...) -> None: ...

class ArmOutcomes(_message.Message):
    __slots__ = ("rated", "total", "squares")
    RATED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SQUARES_FIELD_NUMBER: _ClassVar[int]
    rated: int
    total: float
    squares: float
    def __init__(self, rated: _Optional[int] = ..., total: _Optional[float] = ..., squares: _Optional[float] = ...) -> None: ...

class OutcomeEvidence(_message.Message):
    __slots__ = ("baseline", "candidate", "verdict", "difference", "low", "high", "log_likelihood_ratio", "threshold", "unjoined", "duplicates")
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    LOG_LIKELIHOOD_RATIO_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    UNJOINED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    baseline: ArmOutcomes
    candidate: ArmOutcomes
    verdict: str
    difference: float
    low: float
    high: float
    log_likelihood_ratio: float
    threshold: float
    unjoined: int
    duplicates: int
    def __init__(self, baseline: _Optional[_Union[ArmOutcomes, _Mapping]] = ..., candidate: _Optional[_Union[ArmOutcomes, _Mapping]] = ..., verdict: _Optional[str] = ..., difference: _Optional[float] = ..., low: _Optional[float] = ..., high: _Optional[float] = ..., log_likelihood_ratio: _Optional[float] = ..., threshold: _Optional[float] = ..., unjoined: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...
