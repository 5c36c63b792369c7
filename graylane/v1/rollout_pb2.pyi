from graylane.v1 import control_pb2 as _control_pb2
from graylane.v1 import outcome_pb2 as _outcome_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RolloutStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_STRATEGY_UNSPECIFIED: _ClassVar[RolloutStrategy]
    CANARY: _ClassVar[RolloutStrategy]
    SHADOW_THEN_CANARY: _ClassVar[RolloutStrategy]
    AB_SPLIT: _ClassVar[RolloutStrategy]

class WebhookFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEBHOOK_FORMAT_UNSPECIFIED: _ClassVar[WebhookFormat]
    WEBHOOK_CLOUDEVENTS: _ClassVar[WebhookFormat]
    WEBHOOK_SLACK: _ClassVar[WebhookFormat]

class GateMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GATE_MODE_UNSPECIFIED: _ClassVar[GateMode]
    GATE_MODE_FIXED: _ClassVar[GateMode]
    GATE_MODE_SEQUENTIAL: _ClassVar[GateMode]

class DriftAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRIFT_ACTION_UNSPECIFIED: _ClassVar[DriftAction]
    DRIFT_REPORT: _ClassVar[DriftAction]
    DRIFT_HOLD: _ClassVar[DriftAction]
    DRIFT_ROLLBACK: _ClassVar[DriftAction]

class MetricComparison(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    METRIC_COMPARISON_UNSPECIFIED: _ClassVar[MetricComparison]
    METRIC_LESS: _ClassVar[MetricComparison]
    METRIC_LESS_EQUAL: _ClassVar[MetricComparison]
    METRIC_GREATER: _ClassVar[MetricComparison]
    METRIC_GREATER_EQUAL: _ClassVar[MetricComparison]

class RolloutPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_PHASE_UNSPECIFIED: _ClassVar[RolloutPhase]
    PENDING: _ClassVar[RolloutPhase]
    SHADOWING: _ClassVar[RolloutPhase]
    PROGRESSING: _ClassVar[RolloutPhase]
    AB_HOLDING: _ClassVar[RolloutPhase]
    PAUSED: _ClassVar[RolloutPhase]
    PROMOTED: _ClassVar[RolloutPhase]
    ROLLED_BACK: _ClassVar[RolloutPhase]
    ABORTED: _ClassVar[RolloutPhase]
    BAKING: _ClassVar[RolloutPhase]

class CommandKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_KIND_UNSPECIFIED: _ClassVar[CommandKind]
    COMMAND_START: _ClassVar[CommandKind]
    COMMAND_PAUSE: _ClassVar[CommandKind]
    COMMAND_RESUME: _ClassVar[CommandKind]
    COMMAND_PROMOTE: _ClassVar[CommandKind]
    COMMAND_ROLLBACK: _ClassVar[CommandKind]
    COMMAND_ABORT: _ClassVar[CommandKind]
    COMMAND_SET_QOS_POLICY: _ClassVar[CommandKind]
    COMMAND_REVERT: _ClassVar[CommandKind]
    COMMAND_SET_ROUTE_CONFIG: _ClassVar[CommandKind]
    COMMAND_UPDATE_SPEC: _ClassVar[CommandKind]

class UnmeasuredRung(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNMEASURED_RUNG_UNSPECIFIED: _ClassVar[UnmeasuredRung]
    UNMEASURED_RUNG_ALLOWED: _ClassVar[UnmeasuredRung]
    UNMEASURED_RUNG_REFUSED: _ClassVar[UnmeasuredRung]
ROLLOUT_STRATEGY_UNSPECIFIED: RolloutStrategy
CANARY: RolloutStrategy
SHADOW_THEN_CANARY: RolloutStrategy
AB_SPLIT: RolloutStrategy
WEBHOOK_FORMAT_UNSPECIFIED: WebhookFormat
WEBHOOK_CLOUDEVENTS: WebhookFormat
WEBHOOK_SLACK: WebhookFormat
GATE_MODE_UNSPECIFIED: GateMode
GATE_MODE_FIXED: GateMode
GATE_MODE_SEQUENTIAL: GateMode
DRIFT_ACTION_UNSPECIFIED: DriftAction
DRIFT_REPORT: DriftAction
DRIFT_HOLD: DriftAction
DRIFT_ROLLBACK: DriftAction
METRIC_COMPARISON_UNSPECIFIED: MetricComparison
METRIC_LESS: MetricComparison
METRIC_LESS_EQUAL: MetricComparison
METRIC_GREATER: MetricComparison
METRIC_GREATER_EQUAL: MetricComparison
ROLLOUT_PHASE_UNSPECIFIED: RolloutPhase
PENDING: RolloutPhase
SHADOWING: RolloutPhase
PROGRESSING: RolloutPhase
AB_HOLDING: RolloutPhase
PAUSED: RolloutPhase
PROMOTED: RolloutPhase
ROLLED_BACK: RolloutPhase
ABORTED: RolloutPhase
BAKING: RolloutPhase
COMMAND_KIND_UNSPECIFIED: CommandKind
COMMAND_START: CommandKind
COMMAND_PAUSE: CommandKind
COMMAND_RESUME: CommandKind
COMMAND_PROMOTE: CommandKind
COMMAND_ROLLBACK: CommandKind
COMMAND_ABORT: CommandKind
COMMAND_SET_QOS_POLICY: CommandKind
COMMAND_REVERT: CommandKind
COMMAND_SET_ROUTE_CONFIG: CommandKind
COMMAND_UPDATE_SPEC: CommandKind
UNMEASURED_RUNG_UNSPECIFIED: UnmeasuredRung
UNMEASURED_RUNG_ALLOWED: UnmeasuredRung
UNMEASURED_RUNG_REFUSED: UnmeasuredRung

class RolloutStep(_message.Message):
    __slots__ = ("weight_percent", "min_samples", "min_dwell_s", "pause", "evaluation")
    WEIGHT_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MIN_DWELL_S_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    weight_percent: float
    min_samples: int
    min_dwell_s: float
    pause: StepPause
    evaluation: StepEvaluation
    def __init__(self, weight_percent: _Optional[float] = ..., min_samples: _Optional[int] = ..., min_dwell_s: _Optional[float] = ..., pause: _Optional[_Union[StepPause, _Mapping]] = ..., evaluation: _Optional[_Union[StepEvaluation, _Mapping]] = ...) -> None: ...

class StepEvaluation(_message.Message):
    __slots__ = ("set_path", "max_drop_vs_stable", "set_sha256")
    SET_PATH_FIELD_NUMBER: _ClassVar[int]
    MAX_DROP_VS_STABLE_FIELD_NUMBER: _ClassVar[int]
    SET_SHA256_FIELD_NUMBER: _ClassVar[int]
    set_path: str
    max_drop_vs_stable: float
    set_sha256: str
    def __init__(self, set_path: _Optional[str] = ..., max_drop_vs_stable: _Optional[float] = ..., set_sha256: _Optional[str] = ...) -> None: ...

class StepPause(_message.Message):
    __slots__ = ("duration_s",)
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    duration_s: float
    def __init__(self, duration_s: _Optional[float] = ...) -> None: ...

class Webhook(_message.Message):
    __slots__ = ("url", "format", "secret_file")
    URL_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SECRET_FILE_FIELD_NUMBER: _ClassVar[int]
    url: str
    format: WebhookFormat
    secret_file: str
    def __init__(self, url: _Optional[str] = ..., format: _Optional[_Union[WebhookFormat, str]] = ..., secret_file: _Optional[str] = ...) -> None: ...

class GateSpec(_message.Message):
    __slots__ = ("max_p99_ratio", "max_error_rate_delta", "significance_alpha", "min_output_agreement", "mode", "max_error_ratio", "error_budget", "max_slow_ratio", "unresponsive_s", "backlog_queue_ms", "p99_floor_ms", "length_drift", "max_length_shift", "max_eos_rate_delta", "token_time_tolerance", "metrics", "max_similarity_drop")
    MAX_P99_RATIO_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_RATE_DELTA_FIELD_NUMBER: _ClassVar[int]
    SIGNIFICANCE_ALPHA_FIELD_NUMBER: _ClassVar[int]
    MIN_OUTPUT_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_RATIO_FIELD_NUMBER: _ClassVar[int]
    ERROR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_SLOW_RATIO_FIELD_NUMBER: _ClassVar[int]
    UNRESPONSIVE_S_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    P99_FLOOR_MS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_DRIFT_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_SHIFT_FIELD_NUMBER: _ClassVar[int]
    MAX_EOS_RATE_DELTA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TIME_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    MAX_SIMILARITY_DROP_FIELD_NUMBER: _ClassVar[int]
    max_p99_ratio: float
    max_error_rate_delta: float
    significance_alpha: float
    min_output_agreement: float
    mode: GateMode
    max_error_ratio: float
    error_budget: float
    max_slow_ratio: float
    unresponsive_s: float
    backlog_queue_ms: float
    p99_floor_ms: float
    length_drift: DriftAction
    max_length_shift: float
    max_eos_rate_delta: float
    token_time_tolerance: float
    metrics: _containers.RepeatedCompositeFieldContainer[MetricGate]
    max_similarity_drop: float
    def __init__(self, max_p99_ratio: _Optional[float] = ..., max_error_rate_delta: _Optional[float] = ..., significance_alpha: _Optional[float] = ..., min_output_agreement: _Optional[float] = ..., mode: _Optional[_Union[GateMode, str]] = ..., max_error_ratio: _Optional[float] = ..., error_budget: _Optional[float] = ..., max_slow_ratio: _Optional[float] = ..., unresponsive_s: _Optional[float] = ..., backlog_queue_ms: _Optional[float] = ..., p99_floor_ms: _Optional[float] = ..., length_drift: _Optional[_Union[DriftAction, str]] = ..., max_length_shift: _Optional[float] = ..., max_eos_rate_delta: _Optional[float] = ..., token_time_tolerance: _Optional[float] = ..., metrics: _Optional[_Iterable[_Union[MetricGate, _Mapping]]] = ..., max_similarity_drop: _Optional[float] = ...) -> None: ...

class MetricGate(_message.Message):
    __slots__ = ("name", "query", "comparison", "threshold", "pause_after_inconclusive_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    COMPARISON_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PAUSE_AFTER_INCONCLUSIVE_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    query: str
    comparison: MetricComparison
    threshold: float
    pause_after_inconclusive_s: float
    def __init__(self, name: _Optional[str] = ..., query: _Optional[str] = ..., comparison: _Optional[_Union[MetricComparison, str]] = ..., threshold: _Optional[float] = ..., pause_after_inconclusive_s: _Optional[float] = ...) -> None: ...

class RolloutSpec(_message.Message):
    __slots__ = ("rollout_id", "model", "baseline_version", "candidate_version", "strategy", "steps", "gates", "failures_to_rollback", "shadow_share", "shadow_duration_s", "ab_weight_percent", "ab_duration_s", "created_at_unix_ms", "created_by", "document_digest", "webhooks", "bake_s")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BASELINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GATES_FIELD_NUMBER: _ClassVar[int]
    FAILURES_TO_ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    SHADOW_SHARE_FIELD_NUMBER: _ClassVar[int]
    SHADOW_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    AB_WEIGHT_PERCENT_FIELD_NUMBER: _ClassVar[int]
    AB_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    WEBHOOKS_FIELD_NUMBER: _ClassVar[int]
    BAKE_S_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    model: str
    baseline_version: str
    candidate_version: str
    strategy: RolloutStrategy
    steps: _containers.RepeatedCompositeFieldContainer[RolloutStep]
    gates: GateSpec
    failures_to_rollback: int
    shadow_share: float
    shadow_duration_s: float
    ab_weight_percent: float
    ab_duration_s: float
    created_at_unix_ms: int
    created_by: str
    document_digest: str
    webhooks: _containers.RepeatedCompositeFieldContainer[Webhook]
    bake_s: float
    def __init__(self, rollout_id: _Optional[str] = ..., model: _Optional[str] = ..., baseline_version: _Optional[str] = ..., candidate_version: _Optional[str] = ..., strategy: _Optional[_Union[RolloutStrategy, str]] = ..., steps: _Optional[_Iterable[_Union[RolloutStep, _Mapping]]] = ..., gates: _Optional[_Union[GateSpec, _Mapping]] = ..., failures_to_rollback: _Optional[int] = ..., shadow_share: _Optional[float] = ..., shadow_duration_s: _Optional[float] = ..., ab_weight_percent: _Optional[float] = ..., ab_duration_s: _Optional[float] = ..., created_at_unix_ms: _Optional[int] = ..., created_by: _Optional[str] = ..., document_digest: _Optional[str] = ..., webhooks: _Optional[_Iterable[_Union[Webhook, _Mapping]]] = ..., bake_s: _Optional[float] = ...) -> None: ...

class RolloutState(_message.Message):
    __slots__ = ("rollout_id", "model", "phase", "step_index", "candidate_weight_percent", "phase_started_at_unix_ms", "consecutive_failures", "updated_at_unix_ms", "last_reason", "paused_from", "spec", "step_started_at_unix_ms", "shadow_share", "failure_window_end_unix_ms", "epoch", "evidence", "sequential", "approval_step", "approved_step", "pause_until_unix_ms", "baseline_outcomes", "candidate_outcomes", "bake_until_unix_ms", "bake_reference")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_WEIGHT_PERCENT_FIELD_NUMBER: _ClassVar[int]
    PHASE_STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_REASON_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FROM_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STEP_STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_SHARE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_WINDOW_END_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    SEQUENTIAL_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_STEP_FIELD_NUMBER: _ClassVar[int]
    APPROVED_STEP_FIELD_NUMBER: _ClassVar[int]
    PAUSE_UNTIL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    BAKE_UNTIL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BAKE_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    model: str
    phase: RolloutPhase
    step_index: int
    candidate_weight_percent: float
    phase_started_at_unix_ms: int
    consecutive_failures: int
    updated_at_unix_ms: int
    last_reason: str
    paused_from: RolloutPhase
    spec: RolloutSpec
    step_started_at_unix_ms: int
    shadow_share: float
    failure_window_end_unix_ms: int
    epoch: int
    evidence: StepEvidence
    sequential: SequentialEvidence
    approval_step: int
    approved_step: int
    pause_until_unix_ms: int
    baseline_outcomes: _outcome_pb2.ArmOutcomes
    candidate_outcomes: _outcome_pb2.ArmOutcomes
    bake_until_unix_ms: int
    bake_reference: bytes
    def __init__(self, rollout_id: _Optional[str] = ..., model: _Optional[str] = ..., phase: _Optional[_Union[RolloutPhase, str]] = ..., step_index: _Optional[int] = ..., candidate_weight_percent: _Optional[float] = ..., phase_started_at_unix_ms: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., updated_at_unix_ms: _Optional[int] = ..., last_reason: _Optional[str] = ..., paused_from: _Optional[_Union[RolloutPhase, str]] = ..., spec: _Optional[_Union[RolloutSpec, _Mapping]] = ..., step_started_at_unix_ms: _Optional[int] = ..., shadow_share: _Optional[float] = ..., failure_window_end_unix_ms: _Optional[int] = ..., epoch: _Optional[int] = ..., evidence: _Optional[_Union[StepEvidence, _Mapping]] = ..., sequential: _Optional[_Union[SequentialEvidence, _Mapping]] = ..., approval_step: _Optional[int] = ..., approved_step: _Optional[int] = ..., pause_until_unix_ms: _Optional[int] = ..., baseline_outcomes: _Optional[_Union[_outcome_pb2.ArmOutcomes, _Mapping]] = ..., candidate_outcomes: _Optional[_Union[_outcome_pb2.ArmOutcomes, _Mapping]] = ..., bake_until_unix_ms: _Optional[int] = ..., bake_reference: _Optional[bytes] = ...) -> None: ...

class RatioTestState(_message.Message):
    __slots__ = ("r0", "log_lr", "candidate_events", "candidate_requests", "baseline_events", "baseline_requests", "recent_up")
    R0_FIELD_NUMBER: _ClassVar[int]
    LOG_LR_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RECENT_UP_FIELD_NUMBER: _ClassVar[int]
    r0: float
    log_lr: _containers.RepeatedScalarFieldContainer[float]
    candidate_events: int
    candidate_requests: int
    baseline_events: int
    baseline_requests: int
    recent_up: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, r0: _Optional[float] = ..., log_lr: _Optional[_Iterable[float]] = ..., candidate_events: _Optional[int] = ..., candidate_requests: _Optional[int] = ..., baseline_events: _Optional[int] = ..., baseline_requests: _Optional[int] = ..., recent_up: _Optional[_Iterable[bool]] = ...) -> None: ...

class RateTestState(_message.Message):
    __slots__ = ("p0", "log_lr", "events", "requests")
    P0_FIELD_NUMBER: _ClassVar[int]
    LOG_LR_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    p0: float
    log_lr: _containers.RepeatedScalarFieldContainer[float]
    events: int
    requests: int
    def __init__(self, p0: _Optional[float] = ..., log_lr: _Optional[_Iterable[float]] = ..., events: _Optional[int] = ..., requests: _Optional[int] = ...) -> None: ...

class SequentialEvidence(_message.Message):
    __slots__ = ("errors", "budget", "slow_p95", "slow_p99", "increments", "through_unix_ms", "baseline_p95_ms", "baseline_p99_ms", "ttft", "tpot")
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    SLOW_P95_FIELD_NUMBER: _ClassVar[int]
    SLOW_P99_FIELD_NUMBER: _ClassVar[int]
    INCREMENTS_FIELD_NUMBER: _ClassVar[int]
    THROUGH_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_P95_MS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_P99_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_FIELD_NUMBER: _ClassVar[int]
    TPOT_FIELD_NUMBER: _ClassVar[int]
    errors: RatioTestState
    budget: RateTestState
    slow_p95: RatioTestState
    slow_p99: RatioTestState
    increments: int
    through_unix_ms: int
    baseline_p95_ms: _containers.RepeatedScalarFieldContainer[float]
    baseline_p99_ms: _containers.RepeatedScalarFieldContainer[float]
    ttft: SlowShareState
    tpot: SlowShareState
    def __init__(self, errors: _Optional[_Union[RatioTestState, _Mapping]] = ..., budget: _Optional[_Union[RateTestState, _Mapping]] = ..., slow_p95: _Optional[_Union[RatioTestState, _Mapping]] = ..., slow_p99: _Optional[_Union[RatioTestState, _Mapping]] = ..., increments: _Optional[int] = ..., through_unix_ms: _Optional[int] = ..., baseline_p95_ms: _Optional[_Iterable[float]] = ..., baseline_p99_ms: _Optional[_Iterable[float]] = ..., ttft: _Optional[_Union[SlowShareState, _Mapping]] = ..., tpot: _Optional[_Union[SlowShareState, _Mapping]] = ...) -> None: ...

class SlowShareState(_message.Message):
    __slots__ = ("p95", "p99", "baseline_p95_ms", "baseline_p99_ms")
    P95_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    BASELINE_P95_MS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_P99_MS_FIELD_NUMBER: _ClassVar[int]
    p95: RatioTestState
    p99: RatioTestState
    baseline_p95_ms: _containers.RepeatedScalarFieldContainer[float]
    baseline_p99_ms: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, p95: _Optional[_Union[RatioTestState, _Mapping]] = ..., p99: _Optional[_Union[RatioTestState, _Mapping]] = ..., baseline_p95_ms: _Optional[_Iterable[float]] = ..., baseline_p99_ms: _Optional[_Iterable[float]] = ...) -> None: ...

class StepEvidence(_message.Message):
    __slots__ = ("candidate_requests", "candidate_errors", "baseline_requests", "baseline_errors", "windows", "through_unix_ms")
    CANDIDATE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    THROUGH_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    candidate_requests: int
    candidate_errors: int
    baseline_requests: int
    baseline_errors: int
    windows: int
    through_unix_ms: int
    def __init__(self, candidate_requests: _Optional[int] = ..., candidate_errors: _Optional[int] = ..., baseline_requests: _Optional[int] = ..., baseline_errors: _Optional[int] = ..., windows: _Optional[int] = ..., through_unix_ms: _Optional[int] = ...) -> None: ...

class RouteConfig(_message.Message):
    __slots__ = ("model", "rules", "allow_pinning")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PINNING_FIELD_NUMBER: _ClassVar[int]
    model: str
    rules: _containers.RepeatedCompositeFieldContainer[_control_pb2.RoutingRule]
    allow_pinning: bool
    def __init__(self, model: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[_control_pb2.RoutingRule, _Mapping]]] = ..., allow_pinning: _Optional[bool] = ...) -> None: ...

class QosPolicy(_message.Message):
    __slots__ = ("model", "version", "slo_p99_ms", "ladder", "quality_floor", "step_down_margin", "step_up_ratio", "sustain_s", "min_dwell_s", "max_queue_wait_ms", "enabled", "rung_capacity_rps", "up_capacity_fraction", "max_shed_fraction", "slo_ttft_p99_ms", "slo_tpot_p99_ms", "max_waiting_sequences", "max_kv_cache_occupancy", "max_quality_drop", "rung_quality_drop", "unmeasured_rung")
    class RungCapacityRpsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class RungQualityDropEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SLO_P99_MS_FIELD_NUMBER: _ClassVar[int]
    LADDER_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FLOOR_FIELD_NUMBER: _ClassVar[int]
    STEP_DOWN_MARGIN_FIELD_NUMBER: _ClassVar[int]
    STEP_UP_RATIO_FIELD_NUMBER: _ClassVar[int]
    SUSTAIN_S_FIELD_NUMBER: _ClassVar[int]
    MIN_DWELL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    RUNG_CAPACITY_RPS_FIELD_NUMBER: _ClassVar[int]
    UP_CAPACITY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    MAX_SHED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    SLO_TTFT_P99_MS_FIELD_NUMBER: _ClassVar[int]
    SLO_TPOT_P99_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MAX_KV_CACHE_OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    MAX_QUALITY_DROP_FIELD_NUMBER: _ClassVar[int]
    RUNG_QUALITY_DROP_FIELD_NUMBER: _ClassVar[int]
    UNMEASURED_RUNG_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    slo_p99_ms: float
    ladder: _containers.RepeatedScalarFieldContainer[str]
    quality_floor: str
    step_down_margin: float
    step_up_ratio: float
    sustain_s: float
    min_dwell_s: float
    max_queue_wait_ms: float
    enabled: bool
    rung_capacity_rps: _containers.ScalarMap[str, float]
    up_capacity_fraction: float
    max_shed_fraction: float
    slo_ttft_p99_ms: float
    slo_tpot_p99_ms: float
    max_waiting_sequences: float
    max_kv_cache_occupancy: float
    max_quality_drop: float
    rung_quality_drop: _containers.ScalarMap[str, float]
    unmeasured_rung: UnmeasuredRung
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., slo_p99_ms: _Optional[float] = ..., ladder: _Optional[_Iterable[str]] = ..., quality_floor: _Optional[str] = ..., step_down_margin: _Optional[float] = ..., step_up_ratio: _Optional[float] = ..., sustain_s: _Optional[float] = ..., min_dwell_s: _Optional[float] = ..., max_queue_wait_ms: _Optional[float] = ..., enabled: _Optional[bool] = ..., rung_capacity_rps: _Optional[_Mapping[str, float]] = ..., up_capacity_fraction: _Optional[float] = ..., max_shed_fraction: _Optional[float] = ..., slo_ttft_p99_ms: _Optional[float] = ..., slo_tpot_p99_ms: _Optional[float] = ..., max_waiting_sequences: _Optional[float] = ..., max_kv_cache_occupancy: _Optional[float] = ..., max_quality_drop: _Optional[float] = ..., rung_quality_drop: _Optional[_Mapping[str, float]] = ..., unmeasured_rung: _Optional[_Union[UnmeasuredRung, str]] = ...) -> None: ...

class RolloutCommand(_message.Message):
    __slots__ = ("command_id", "rollout_id", "model", "kind", "spec", "qos_policy", "issued_by", "reason", "issued_at_unix_ms", "target_version", "route_config")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    QOS_POLICY_FIELD_NUMBER: _ClassVar[int]
    ISSUED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    rollout_id: str
    model: str
    kind: CommandKind
    spec: RolloutSpec
    qos_policy: QosPolicy
    issued_by: str
    reason: str
    issued_at_unix_ms: int
    target_version: str
    route_config: RouteConfig
    def __init__(self, command_id: _Optional[str] = ..., rollout_id: _Optional[str] = ..., model: _Optional[str] = ..., kind: _Optional[_Union[CommandKind, str]] = ..., spec: _Optional[_Union[RolloutSpec, _Mapping]] = ..., qos_policy: _Optional[_Union[QosPolicy, _Mapping]] = ..., issued_by: _Optional[str] = ..., reason: _Optional[str] = ..., issued_at_unix_ms: _Optional[int] = ..., target_version: _Optional[str] = ..., route_config: _Optional[_Union[RouteConfig, _Mapping]] = ...) -> None: ...
