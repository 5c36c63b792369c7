from graylane.v1 import audit_pb2 as _audit_pb2
from graylane.v1 import control_pb2 as _control_pb2
from graylane.v1 import rollout_pb2 as _rollout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplyOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPLY_OUTCOME_UNSPECIFIED: _ClassVar[ApplyOutcome]
    APPLY_CREATED: _ClassVar[ApplyOutcome]
    APPLY_UNCHANGED: _ClassVar[ApplyOutcome]
    APPLY_UPDATED: _ClassVar[ApplyOutcome]
    APPLY_REFUSED: _ClassVar[ApplyOutcome]
APPLY_OUTCOME_UNSPECIFIED: ApplyOutcome
APPLY_CREATED: ApplyOutcome
APPLY_UNCHANGED: ApplyOutcome
APPLY_UPDATED: ApplyOutcome
APPLY_REFUSED: ApplyOutcome

class RegisterModelRequest(_message.Message):
    __slots__ = ("name", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ModelSummary(_message.Message):
    __slots__ = ("name", "description", "stable_version", "created_at_unix_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    STABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    stable_version: str
    created_at_unix_ms: int
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., stable_version: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelSummary]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelSummary, _Mapping]]] = ...) -> None: ...

class RegisterVersionRequest(_message.Message):
    __slots__ = ("model", "version", "source_sha256")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SHA256_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    source_sha256: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., source_sha256: _Optional[str] = ...) -> None: ...

class ValidationStatus(_message.Message):
    __slots__ = ("validated", "passed", "max_abs", "mean_rel", "cosine", "top1_agreement", "token_agreement", "failures")
    VALIDATED_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_FIELD_NUMBER: _ClassVar[int]
    MEAN_REL_FIELD_NUMBER: _ClassVar[int]
    COSINE_FIELD_NUMBER: _ClassVar[int]
    TOP1_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    validated: bool
    passed: bool
    max_abs: float
    mean_rel: float
    cosine: float
    top1_agreement: float
    token_agreement: float
    failures: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, validated: _Optional[bool] = ..., passed: _Optional[bool] = ..., max_abs: _Optional[float] = ..., mean_rel: _Optional[float] = ..., cosine: _Optional[float] = ..., top1_agreement: _Optional[float] = ..., token_agreement: _Optional[float] = ..., failures: _Optional[_Iterable[str]] = ...) -> None: ...

class EngineEndpointInfo(_message.Message):
    __slots__ = ("url", "model_sha256", "ladder_rank")
    URL_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    LADDER_RANK_FIELD_NUMBER: _ClassVar[int]
    url: str
    model_sha256: str
    ladder_rank: int
    def __init__(self, url: _Optional[str] = ..., model_sha256: _Optional[str] = ..., ladder_rank: _Optional[int] = ...) -> None: ...

class VariantInfo(_message.Message):
    __slots__ = ("artifact", "precision", "backend", "target", "servable", "forced", "validation", "backend_version", "endpoint", "quality")
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SERVABLE_FIELD_NUMBER: _ClassVar[int]
    FORCED_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    artifact: str
    precision: str
    backend: str
    target: str
    servable: bool
    forced: bool
    validation: ValidationStatus
    backend_version: str
    endpoint: EngineEndpointInfo
    quality: RungQualityInfo
    def __init__(self, artifact: _Optional[str] = ..., precision: _Optional[str] = ..., backend: _Optional[str] = ..., target: _Optional[str] = ..., servable: _Optional[bool] = ..., forced: _Optional[bool] = ..., validation: _Optional[_Union[ValidationStatus, _Mapping]] = ..., backend_version: _Optional[str] = ..., endpoint: _Optional[_Union[EngineEndpointInfo, _Mapping]] = ..., quality: _Optional[_Union[RungQualityInfo, _Mapping]] = ...) -> None: ...

class RungQualityInfo(_message.Message):
    __slots__ = ("precision", "set_name", "set_sha256", "items", "score", "ci_low", "ci_high", "reference_precision", "reference_score", "recorded_at_unix_ms")
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    SET_NAME_FIELD_NUMBER: _ClassVar[int]
    SET_SHA256_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    CI_LOW_FIELD_NUMBER: _ClassVar[int]
    CI_HIGH_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_PRECISION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_SCORE_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    precision: str
    set_name: str
    set_sha256: str
    items: int
    score: float
    ci_low: float
    ci_high: float
    reference_precision: str
    reference_score: float
    recorded_at_unix_ms: int
    def __init__(self, precision: _Optional[str] = ..., set_name: _Optional[str] = ..., set_sha256: _Optional[str] = ..., items: _Optional[int] = ..., score: _Optional[float] = ..., ci_low: _Optional[float] = ..., ci_high: _Optional[float] = ..., reference_precision: _Optional[str] = ..., reference_score: _Optional[float] = ..., recorded_at_unix_ms: _Optional[int] = ...) -> None: ...

class RecordRungQualityRequest(_message.Message):
    __slots__ = ("model", "version", "rungs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNGS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    rungs: _containers.RepeatedCompositeFieldContainer[RungQualityInfo]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., rungs: _Optional[_Iterable[_Union[RungQualityInfo, _Mapping]]] = ...) -> None: ...

class RecordRungQualityResponse(_message.Message):
    __slots__ = ("recorded", "command_id")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    recorded: _containers.RepeatedCompositeFieldContainer[RungQualityInfo]
    command_id: str
    def __init__(self, recorded: _Optional[_Iterable[_Union[RungQualityInfo, _Mapping]]] = ..., command_id: _Optional[str] = ...) -> None: ...

class VersionSummary(_message.Message):
    __slots__ = ("model", "version", "status", "source_sha256", "created_at_unix_ms", "stable", "variants")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SHA256_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STABLE_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    status: str
    source_sha256: str
    created_at_unix_ms: int
    stable: bool
    variants: _containers.RepeatedCompositeFieldContainer[VariantInfo]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., status: _Optional[str] = ..., source_sha256: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ..., stable: _Optional[bool] = ..., variants: _Optional[_Iterable[_Union[VariantInfo, _Mapping]]] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("model", "versions")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    model: ModelSummary
    versions: _containers.RepeatedCompositeFieldContainer[VersionSummary]
    def __init__(self, model: _Optional[_Union[ModelSummary, _Mapping]] = ..., versions: _Optional[_Iterable[_Union[VersionSummary, _Mapping]]] = ...) -> None: ...

class SetStableRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class GetRolloutRequest(_message.Message):
    __slots__ = ("rollout_id",)
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    def __init__(self, rollout_id: _Optional[str] = ...) -> None: ...

class ListRolloutsRequest(_message.Message):
    __slots__ = ("model", "active_only", "limit")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ONLY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    model: str
    active_only: bool
    limit: int
    def __init__(self, model: _Optional[str] = ..., active_only: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class ListRolloutsResponse(_message.Message):
    __slots__ = ("rollouts",)
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    rollouts: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.RolloutState]
    def __init__(self, rollouts: _Optional[_Iterable[_Union[_rollout_pb2.RolloutState, _Mapping]]] = ...) -> None: ...

class WatchRolloutsRequest(_message.Message):
    __slots__ = ("model", "rollout_id", "initial")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    model: str
    rollout_id: str
    initial: bool
    def __init__(self, model: _Optional[str] = ..., rollout_id: _Optional[str] = ..., initial: _Optional[bool] = ...) -> None: ...

class RolloutActionRequest(_message.Message):
    __slots__ = ("rollout_id", "reason")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    reason: str
    def __init__(self, rollout_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CommandReceipt(_message.Message):
    __slots__ = ("command_id", "rollout_id", "model", "kind", "issued_at_unix_ms", "issued_by", "state", "target_version")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ISSUED_BY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TARGET_VERSION_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    rollout_id: str
    model: str
    kind: _rollout_pb2.CommandKind
    issued_at_unix_ms: int
    issued_by: str
    state: _rollout_pb2.RolloutState
    target_version: str
    def __init__(self, command_id: _Optional[str] = ..., rollout_id: _Optional[str] = ..., model: _Optional[str] = ..., kind: _Optional[_Union[_rollout_pb2.CommandKind, str]] = ..., issued_at_unix_ms: _Optional[int] = ..., issued_by: _Optional[str] = ..., state: _Optional[_Union[_rollout_pb2.RolloutState, _Mapping]] = ..., target_version: _Optional[str] = ...) -> None: ...

class ApplyRolloutRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _rollout_pb2.RolloutSpec
    def __init__(self, spec: _Optional[_Union[_rollout_pb2.RolloutSpec, _Mapping]] = ...) -> None: ...

class SpecChange(_message.Message):
    __slots__ = ("field", "live", "applied", "allowed")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    field: str
    live: str
    applied: str
    allowed: bool
    def __init__(self, field: _Optional[str] = ..., live: _Optional[str] = ..., applied: _Optional[str] = ..., allowed: _Optional[bool] = ...) -> None: ...

class ApplyRolloutResponse(_message.Message):
    __slots__ = ("outcome", "changes", "state", "command_id")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    outcome: ApplyOutcome
    changes: _containers.RepeatedCompositeFieldContainer[SpecChange]
    state: _rollout_pb2.RolloutState
    command_id: str
    def __init__(self, outcome: _Optional[_Union[ApplyOutcome, str]] = ..., changes: _Optional[_Iterable[_Union[SpecChange, _Mapping]]] = ..., state: _Optional[_Union[_rollout_pb2.RolloutState, _Mapping]] = ..., command_id: _Optional[str] = ...) -> None: ...

class RevertRequest(_message.Message):
    __slots__ = ("model", "reason", "to_revision")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TO_REVISION_FIELD_NUMBER: _ClassVar[int]
    model: str
    reason: str
    to_revision: int
    def __init__(self, model: _Optional[str] = ..., reason: _Optional[str] = ..., to_revision: _Optional[int] = ...) -> None: ...

class StableHistoryRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class StableRevisionView(_message.Message):
    __slots__ = ("revision", "version", "set_at_unix_ms", "current")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SET_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    revision: int
    version: str
    set_at_unix_ms: int
    current: bool
    def __init__(self, revision: _Optional[int] = ..., version: _Optional[str] = ..., set_at_unix_ms: _Optional[int] = ..., current: _Optional[bool] = ...) -> None: ...

class StableHistoryResponse(_message.Message):
    __slots__ = ("revisions",)
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    revisions: _containers.RepeatedCompositeFieldContainer[StableRevisionView]
    def __init__(self, revisions: _Optional[_Iterable[_Union[StableRevisionView, _Mapping]]] = ...) -> None: ...

class GetQosPolicyRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class QosPolicyView(_message.Message):
    __slots__ = ("policy", "active_variant", "active_since_unix_ms", "last_reason", "updated_by", "updated_at_unix_ms", "command_id")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VARIANT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_REASON_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    policy: _rollout_pb2.QosPolicy
    active_variant: str
    active_since_unix_ms: int
    last_reason: str
    updated_by: str
    updated_at_unix_ms: int
    command_id: str
    def __init__(self, policy: _Optional[_Union[_rollout_pb2.QosPolicy, _Mapping]] = ..., active_variant: _Optional[str] = ..., active_since_unix_ms: _Optional[int] = ..., last_reason: _Optional[str] = ..., updated_by: _Optional[str] = ..., updated_at_unix_ms: _Optional[int] = ..., command_id: _Optional[str] = ...) -> None: ...

class AuditQuery(_message.Message):
    __slots__ = ("model", "rollout_id", "from_unix_ms", "to_unix_ms", "limit")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TO_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    model: str
    rollout_id: str
    from_unix_ms: int
    to_unix_ms: int
    limit: int
    def __init__(self, model: _Optional[str] = ..., rollout_id: _Optional[str] = ..., from_unix_ms: _Optional[int] = ..., to_unix_ms: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class AuditQueryResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[_audit_pb2.AuditRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[_audit_pb2.AuditRecord, _Mapping]]] = ...) -> None: ...

class AddRouteRuleRequest(_message.Message):
    __slots__ = ("model", "rule")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    model: str
    rule: _control_pb2.RoutingRule
    def __init__(self, model: _Optional[str] = ..., rule: _Optional[_Union[_control_pb2.RoutingRule, _Mapping]] = ...) -> None: ...

class RemoveRouteRuleRequest(_message.Message):
    __slots__ = ("model", "name")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    model: str
    name: str
    def __init__(self, model: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GetRouteConfigRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class SetPinningRequest(_message.Message):
    __slots__ = ("model", "allow_pinning")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PINNING_FIELD_NUMBER: _ClassVar[int]
    model: str
    allow_pinning: bool
    def __init__(self, model: _Optional[str] = ..., allow_pinning: _Optional[bool] = ...) -> None: ...

class RouteConfigView(_message.Message):
    __slots__ = ("config", "updated_by", "updated_at_unix_ms", "command_id")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    config: _rollout_pb2.RouteConfig
    updated_by: str
    updated_at_unix_ms: int
    command_id: str
    def __init__(self, config: _Optional[_Union[_rollout_pb2.RouteConfig, _Mapping]] = ..., updated_by: _Optional[str] = ..., updated_at_unix_ms: _Optional[int] = ..., command_id: _Optional[str] = ...) -> None: ...
