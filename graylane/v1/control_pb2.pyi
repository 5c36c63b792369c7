from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScaleReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCALE_REASON_UNSPECIFIED: _ClassVar[ScaleReason]
    SCALE_REASON_FLOOR_BREACH: _ClassVar[ScaleReason]
    SCALE_REASON_LAG_GROWING: _ClassVar[ScaleReason]
    SCALE_REASON_LOW_LOAD: _ClassVar[ScaleReason]
    SCALE_REASON_OVERLOAD: _ClassVar[ScaleReason]
SCALE_REASON_UNSPECIFIED: ScaleReason
SCALE_REASON_FLOOR_BREACH: ScaleReason
SCALE_REASON_LAG_GROWING: ScaleReason
SCALE_REASON_LOW_LOAD: ScaleReason
SCALE_REASON_OVERLOAD: ScaleReason

class BucketRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class VersionRoute(_message.Message):
    __slots__ = ("version", "weight_percent", "ranges")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    version: str
    weight_percent: float
    ranges: _containers.RepeatedCompositeFieldContainer[BucketRange]
    def __init__(self, version: _Optional[str] = ..., weight_percent: _Optional[float] = ..., ranges: _Optional[_Iterable[_Union[BucketRange, _Mapping]]] = ...) -> None: ...

class RoutingRule(_message.Message):
    __slots__ = ("name", "match_tags", "version")
    class MatchTagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MATCH_TAGS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    match_tags: _containers.ScalarMap[str, str]
    version: str
    def __init__(self, name: _Optional[str] = ..., match_tags: _Optional[_Mapping[str, str]] = ..., version: _Optional[str] = ...) -> None: ...

class RoutingTable(_message.Message):
    __slots__ = ("model", "routes", "rules", "stable_version", "shadow_version", "shadow_share", "epoch", "allow_pinning", "updated_at_unix_ms", "rollout_id", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    STABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_SHARE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PINNING_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    routes: _containers.RepeatedCompositeFieldContainer[VersionRoute]
    rules: _containers.RepeatedCompositeFieldContainer[RoutingRule]
    stable_version: str
    shadow_version: str
    shadow_share: float
    epoch: int
    allow_pinning: bool
    updated_at_unix_ms: int
    rollout_id: str
    reason: str
    def __init__(self, model: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[VersionRoute, _Mapping]]] = ..., rules: _Optional[_Iterable[_Union[RoutingRule, _Mapping]]] = ..., stable_version: _Optional[str] = ..., shadow_version: _Optional[str] = ..., shadow_share: _Optional[float] = ..., epoch: _Optional[int] = ..., allow_pinning: _Optional[bool] = ..., updated_at_unix_ms: _Optional[int] = ..., rollout_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PrecisionCommand(_message.Message):
    __slots__ = ("model", "version", "variant", "epoch", "reason", "issued_at_unix_ms", "decision_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    variant: str
    epoch: int
    reason: str
    issued_at_unix_ms: int
    decision_id: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., variant: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[str] = ..., issued_at_unix_ms: _Optional[int] = ..., decision_id: _Optional[str] = ...) -> None: ...

class PolicyLease(_message.Message):
    __slots__ = ("holder", "term", "at_unix_ms", "ttl_ms")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    holder: str
    term: int
    at_unix_ms: int
    ttl_ms: int
    def __init__(self, holder: _Optional[str] = ..., term: _Optional[int] = ..., at_unix_ms: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class ScaleRequest(_message.Message):
    __slots__ = ("model", "version", "desired_replicas", "current_replicas", "reason", "detail", "decided_at_unix_ms", "decision_id", "epoch")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESIRED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    desired_replicas: int
    current_replicas: int
    reason: ScaleReason
    detail: str
    decided_at_unix_ms: int
    decision_id: str
    epoch: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., desired_replicas: _Optional[int] = ..., current_replicas: _Optional[int] = ..., reason: _Optional[_Union[ScaleReason, str]] = ..., detail: _Optional[str] = ..., decided_at_unix_ms: _Optional[int] = ..., decision_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...
