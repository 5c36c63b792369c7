from graylane.v1 import control_pb2 as _control_pb2
from graylane.v1 import outcome_pb2 as _outcome_pb2
from graylane.v1 import rollout_pb2 as _rollout_pb2
from graylane.v1 import telemetry_pb2 as _telemetry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecisionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_KIND_UNSPECIFIED: _ClassVar[DecisionKind]
    DECISION_ROLLOUT_STARTED: _ClassVar[DecisionKind]
    DECISION_ADVANCE: _ClassVar[DecisionKind]
    DECISION_HOLD: _ClassVar[DecisionKind]
    DECISION_ROLLBACK: _ClassVar[DecisionKind]
    DECISION_PROMOTE: _ClassVar[DecisionKind]
    DECISION_PRECISION_CHANGE: _ClassVar[DecisionKind]
    DECISION_MANUAL_COMMAND: _ClassVar[DecisionKind]
    DECISION_GATE_FAILED: _ClassVar[DecisionKind]
    DECISION_SCALE_CHANGE: _ClassVar[DecisionKind]

class EvaluationVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVALUATION_VERDICT_UNSPECIFIED: _ClassVar[EvaluationVerdict]
    EVALUATION_PASSED: _ClassVar[EvaluationVerdict]
    EVALUATION_DROPPED: _ClassVar[EvaluationVerdict]
    EVALUATION_UNUSABLE: _ClassVar[EvaluationVerdict]
DECISION_KIND_UNSPECIFIED: DecisionKind
DECISION_ROLLOUT_STARTED: DecisionKind
DECISION_ADVANCE: DecisionKind
DECISION_HOLD: DecisionKind
DECISION_ROLLBACK: DecisionKind
DECISION_PROMOTE: DecisionKind
DECISION_PRECISION_CHANGE: DecisionKind
DECISION_MANUAL_COMMAND: DecisionKind
DECISION_GATE_FAILED: DecisionKind
DECISION_SCALE_CHANGE: DecisionKind
EVALUATION_VERDICT_UNSPECIFIED: EvaluationVerdict
EVALUATION_PASSED: EvaluationVerdict
EVALUATION_DROPPED: EvaluationVerdict
EVALUATION_UNUSABLE: EvaluationVerdict

class WindowStats(_message.Message):
    __slots__ = ("model", "version", "variant", "window_start_unix_ms", "window_end_unix_ms", "requests", "errors", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "throughput_rps", "queue_wait_mean_ms", "queue_wait_p99_ms", "batches", "device_load", "service", "service_p50_ms", "service_p95_ms", "service_p99_ms", "shed", "shed_rps", "service_busy_ms", "service_requests", "step_offered_rps", "generation")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P95_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_MS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_RPS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_MEAN_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_P99_MS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_LOAD_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_P50_MS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_P95_MS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_P99_MS_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    SHED_RPS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_BUSY_MS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STEP_OFFERED_RPS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    variant: str
    window_start_unix_ms: int
    window_end_unix_ms: int
    requests: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    throughput_rps: float
    queue_wait_mean_ms: float
    queue_wait_p99_ms: float
    batches: int
    device_load: float
    service: _telemetry_pb2.LatencyHistogram
    service_p50_ms: float
    service_p95_ms: float
    service_p99_ms: float
    shed: int
    shed_rps: float
    service_busy_ms: float
    service_requests: int
    step_offered_rps: float
    generation: GenerationWindow
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., variant: _Optional[str] = ..., window_start_unix_ms: _Optional[int] = ..., window_end_unix_ms: _Optional[int] = ..., requests: _Optional[int] = ..., errors: _Optional[int] = ..., p50_ms: _Optional[float] = ..., p95_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., mean_ms: _Optional[float] = ..., throughput_rps: _Optional[float] = ..., queue_wait_mean_ms: _Optional[float] = ..., queue_wait_p99_ms: _Optional[float] = ..., batches: _Optional[int] = ..., device_load: _Optional[float] = ..., service: _Optional[_Union[_telemetry_pb2.LatencyHistogram, _Mapping]] = ..., service_p50_ms: _Optional[float] = ..., service_p95_ms: _Optional[float] = ..., service_p99_ms: _Optional[float] = ..., shed: _Optional[int] = ..., shed_rps: _Optional[float] = ..., service_busy_ms: _Optional[float] = ..., service_requests: _Optional[int] = ..., step_offered_rps: _Optional[float] = ..., generation: _Optional[_Union[GenerationWindow, _Mapping]] = ...) -> None: ...

class GenerationWindow(_message.Message):
    __slots__ = ("generations", "ttft", "tpot", "inter_token_p99", "prefill", "output_tokens", "prompt_tokens", "generated_tokens", "ended_by_model", "kv_cache_occupancy", "waiting_sequences")
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    TTFT_FIELD_NUMBER: _ClassVar[int]
    TPOT_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_P99_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENDED_BY_MODEL_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    WAITING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    generations: int
    ttft: _telemetry_pb2.LatencyHistogram
    tpot: _telemetry_pb2.LatencyHistogram
    inter_token_p99: _telemetry_pb2.LatencyHistogram
    prefill: _telemetry_pb2.LatencyHistogram
    output_tokens: _telemetry_pb2.LatencyHistogram
    prompt_tokens: int
    generated_tokens: int
    ended_by_model: int
    kv_cache_occupancy: float
    waiting_sequences: int
    def __init__(self, generations: _Optional[int] = ..., ttft: _Optional[_Union[_telemetry_pb2.LatencyHistogram, _Mapping]] = ..., tpot: _Optional[_Union[_telemetry_pb2.LatencyHistogram, _Mapping]] = ..., inter_token_p99: _Optional[_Union[_telemetry_pb2.LatencyHistogram, _Mapping]] = ..., prefill: _Optional[_Union[_telemetry_pb2.LatencyHistogram, _Mapping]] = ..., output_tokens: _Optional[_Union[_telemetry_pb2.LatencyHistogram, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., ended_by_model: _Optional[int] = ..., kv_cache_occupancy: _Optional[float] = ..., waiting_sequences: _Optional[int] = ...) -> None: ...

class QosState(_message.Message):
    __slots__ = ("model", "version", "active_variant", "last_change_unix_ms", "breach_since_unix_ms", "calm_since_unix_ms", "contention")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VARIANT_FIELD_NUMBER: _ClassVar[int]
    LAST_CHANGE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BREACH_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CALM_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CONTENTION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    active_variant: str
    last_change_unix_ms: int
    breach_since_unix_ms: int
    calm_since_unix_ms: int
    contention: float
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., active_variant: _Optional[str] = ..., last_change_unix_ms: _Optional[int] = ..., breach_since_unix_ms: _Optional[int] = ..., calm_since_unix_ms: _Optional[int] = ..., contention: _Optional[float] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("decision_id", "decided_at_unix_ms", "model", "rollout_id", "version", "kind", "rule", "reason", "inputs", "rollout_before", "rollout_after", "qos_before", "qos_after", "actor", "epoch", "command_id", "agreement", "note", "qos_policy", "scale", "qos_scale_hold", "step_inputs", "liveness", "decided_by", "outcomes", "metric_readings", "evaluation")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_AFTER_FIELD_NUMBER: _ClassVar[int]
    QOS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    QOS_AFTER_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    QOS_POLICY_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    QOS_SCALE_HOLD_FIELD_NUMBER: _ClassVar[int]
    STEP_INPUTS_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    METRIC_READINGS_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    decided_at_unix_ms: int
    model: str
    rollout_id: str
    version: str
    kind: DecisionKind
    rule: str
    reason: str
    inputs: _containers.RepeatedCompositeFieldContainer[WindowStats]
    rollout_before: _rollout_pb2.RolloutState
    rollout_after: _rollout_pb2.RolloutState
    qos_before: QosState
    qos_after: QosState
    actor: str
    epoch: int
    command_id: str
    agreement: ShadowAgreement
    note: str
    qos_policy: _rollout_pb2.QosPolicy
    scale: _control_pb2.ScaleRequest
    qos_scale_hold: str
    step_inputs: _containers.RepeatedCompositeFieldContainer[WindowStats]
    liveness: _containers.RepeatedCompositeFieldContainer[VersionLiveness]
    decided_by: RunningBuild
    outcomes: _outcome_pb2.OutcomeEvidence
    metric_readings: _containers.RepeatedCompositeFieldContainer[MetricReading]
    evaluation: StepEvaluationResult
    def __init__(self, decision_id: _Optional[str] = ..., decided_at_unix_ms: _Optional[int] = ..., model: _Optional[str] = ..., rollout_id: _Optional[str] = ..., version: _Optional[str] = ..., kind: _Optional[_Union[DecisionKind, str]] = ..., rule: _Optional[str] = ..., reason: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[WindowStats, _Mapping]]] = ..., rollout_before: _Optional[_Union[_rollout_pb2.RolloutState, _Mapping]] = ..., rollout_after: _Optional[_Union[_rollout_pb2.RolloutState, _Mapping]] = ..., qos_before: _Optional[_Union[QosState, _Mapping]] = ..., qos_after: _Optional[_Union[QosState, _Mapping]] = ..., actor: _Optional[str] = ..., epoch: _Optional[int] = ..., command_id: _Optional[str] = ..., agreement: _Optional[_Union[ShadowAgreement, _Mapping]] = ..., note: _Optional[str] = ..., qos_policy: _Optional[_Union[_rollout_pb2.QosPolicy, _Mapping]] = ..., scale: _Optional[_Union[_control_pb2.ScaleRequest, _Mapping]] = ..., qos_scale_hold: _Optional[str] = ..., step_inputs: _Optional[_Iterable[_Union[WindowStats, _Mapping]]] = ..., liveness: _Optional[_Iterable[_Union[VersionLiveness, _Mapping]]] = ..., decided_by: _Optional[_Union[RunningBuild, _Mapping]] = ..., outcomes: _Optional[_Union[_outcome_pb2.OutcomeEvidence, _Mapping]] = ..., metric_readings: _Optional[_Iterable[_Union[MetricReading, _Mapping]]] = ..., evaluation: _Optional[_Union[StepEvaluationResult, _Mapping]] = ...) -> None: ...

class MetricReading(_message.Message):
    __slots__ = ("gate", "value", "inconclusive", "read_at_unix_ms", "inconclusive_since_unix_ms")
    GATE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    INCONCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    READ_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    INCONCLUSIVE_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    gate: str
    value: float
    inconclusive: str
    read_at_unix_ms: int
    inconclusive_since_unix_ms: int
    def __init__(self, gate: _Optional[str] = ..., value: _Optional[float] = ..., inconclusive: _Optional[str] = ..., read_at_unix_ms: _Optional[int] = ..., inconclusive_since_unix_ms: _Optional[int] = ...) -> None: ...

class EvaluationScore(_message.Message):
    __slots__ = ("version", "items", "mean", "ci_low", "ci_high", "passed", "errors")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    CI_LOW_FIELD_NUMBER: _ClassVar[int]
    CI_HIGH_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    version: str
    items: int
    mean: float
    ci_low: float
    ci_high: float
    passed: int
    errors: int
    def __init__(self, version: _Optional[str] = ..., items: _Optional[int] = ..., mean: _Optional[float] = ..., ci_low: _Optional[float] = ..., ci_high: _Optional[float] = ..., passed: _Optional[int] = ..., errors: _Optional[int] = ...) -> None: ...

class StepEvaluationResult(_message.Message):
    __slots__ = ("step_index", "set_path", "set_sha256", "max_drop_vs_stable", "baseline", "candidate", "paired_items", "difference", "difference_ci_low", "difference_ci_high", "p_value", "verdict", "problem", "finished_at_unix_ms")
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    SET_PATH_FIELD_NUMBER: _ClassVar[int]
    SET_SHA256_FIELD_NUMBER: _ClassVar[int]
    MAX_DROP_VS_STABLE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    PAIRED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCE_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCE_CI_LOW_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCE_CI_HIGH_FIELD_NUMBER: _ClassVar[int]
    P_VALUE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    step_index: int
    set_path: str
    set_sha256: str
    max_drop_vs_stable: float
    baseline: EvaluationScore
    candidate: EvaluationScore
    paired_items: int
    difference: float
    difference_ci_low: float
    difference_ci_high: float
    p_value: float
    verdict: EvaluationVerdict
    problem: str
    finished_at_unix_ms: int
    def __init__(self, step_index: _Optional[int] = ..., set_path: _Optional[str] = ..., set_sha256: _Optional[str] = ..., max_drop_vs_stable: _Optional[float] = ..., baseline: _Optional[_Union[EvaluationScore, _Mapping]] = ..., candidate: _Optional[_Union[EvaluationScore, _Mapping]] = ..., paired_items: _Optional[int] = ..., difference: _Optional[float] = ..., difference_ci_low: _Optional[float] = ..., difference_ci_high: _Optional[float] = ..., p_value: _Optional[float] = ..., verdict: _Optional[_Union[EvaluationVerdict, str]] = ..., problem: _Optional[str] = ..., finished_at_unix_ms: _Optional[int] = ...) -> None: ...

class VersionLiveness(_message.Message):
    __slots__ = ("version", "routed_since_telemetry", "first_routed_since_telemetry_unix_ms", "last_telemetry_unix_ms", "lag")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTED_SINCE_TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    FIRST_ROUTED_SINCE_TELEMETRY_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_TELEMETRY_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    version: str
    routed_since_telemetry: int
    first_routed_since_telemetry_unix_ms: int
    last_telemetry_unix_ms: int
    lag: _containers.RepeatedCompositeFieldContainer[LagSample]
    def __init__(self, version: _Optional[str] = ..., routed_since_telemetry: _Optional[int] = ..., first_routed_since_telemetry_unix_ms: _Optional[int] = ..., last_telemetry_unix_ms: _Optional[int] = ..., lag: _Optional[_Iterable[_Union[LagSample, _Mapping]]] = ...) -> None: ...

class LagSample(_message.Message):
    __slots__ = ("at_unix_ms", "lag", "committed")
    AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    at_unix_ms: int
    lag: int
    committed: int
    def __init__(self, at_unix_ms: _Optional[int] = ..., lag: _Optional[int] = ..., committed: _Optional[int] = ...) -> None: ...

class ShadowAgreement(_message.Message):
    __slots__ = ("pairs", "agreeing", "baseline_schema", "candidate_schema", "greedy_pairs", "seeded_pairs", "unseeded_pairs", "text_pairs", "text_similarity", "text_self_similarity", "text_log_evidence", "text_uncontrolled")
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    AGREEING_FIELD_NUMBER: _ClassVar[int]
    BASELINE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    GREEDY_PAIRS_FIELD_NUMBER: _ClassVar[int]
    SEEDED_PAIRS_FIELD_NUMBER: _ClassVar[int]
    UNSEEDED_PAIRS_FIELD_NUMBER: _ClassVar[int]
    TEXT_PAIRS_FIELD_NUMBER: _ClassVar[int]
    TEXT_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    TEXT_SELF_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    TEXT_LOG_EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    TEXT_UNCONTROLLED_FIELD_NUMBER: _ClassVar[int]
    pairs: int
    agreeing: int
    baseline_schema: str
    candidate_schema: str
    greedy_pairs: int
    seeded_pairs: int
    unseeded_pairs: int
    text_pairs: int
    text_similarity: float
    text_self_similarity: float
    text_log_evidence: float
    text_uncontrolled: int
    def __init__(self, pairs: _Optional[int] = ..., agreeing: _Optional[int] = ..., baseline_schema: _Optional[str] = ..., candidate_schema: _Optional[str] = ..., greedy_pairs: _Optional[int] = ..., seeded_pairs: _Optional[int] = ..., unseeded_pairs: _Optional[int] = ..., text_pairs: _Optional[int] = ..., text_similarity: _Optional[float] = ..., text_self_similarity: _Optional[float] = ..., text_log_evidence: _Optional[float] = ..., text_uncontrolled: _Optional[int] = ...) -> None: ...

class TelemetryTotals(_message.Message):
    __slots__ = ("version", "variant", "batches", "requests", "errors", "compute_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    version: str
    variant: str
    batches: int
    requests: int
    errors: int
    compute_ms: float
    def __init__(self, version: _Optional[str] = ..., variant: _Optional[str] = ..., batches: _Optional[int] = ..., requests: _Optional[int] = ..., errors: _Optional[int] = ..., compute_ms: _Optional[float] = ...) -> None: ...

class AuditTimeline(_message.Message):
    __slots__ = ("model", "rollout_id", "from_unix_ms", "to_unix_ms", "decisions", "telemetry")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TO_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    model: str
    rollout_id: str
    from_unix_ms: int
    to_unix_ms: int
    decisions: _containers.RepeatedCompositeFieldContainer[AuditRecord]
    telemetry: _containers.RepeatedCompositeFieldContainer[TelemetryTotals]
    def __init__(self, model: _Optional[str] = ..., rollout_id: _Optional[str] = ..., from_unix_ms: _Optional[int] = ..., to_unix_ms: _Optional[int] = ..., decisions: _Optional[_Iterable[_Union[AuditRecord, _Mapping]]] = ..., telemetry: _Optional[_Iterable[_Union[TelemetryTotals, _Mapping]]] = ...) -> None: ...

class ReplayMismatch(_message.Message):
    __slots__ = ("index", "decision_id", "field", "recorded", "replayed")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    index: int
    decision_id: str
    field: str
    recorded: str
    replayed: str
    def __init__(self, index: _Optional[int] = ..., decision_id: _Optional[str] = ..., field: _Optional[str] = ..., recorded: _Optional[str] = ..., replayed: _Optional[str] = ...) -> None: ...

class AuditVerification(_message.Message):
    __slots__ = ("model", "rollout_id", "from_unix_ms", "to_unix_ms", "decisions", "mismatches")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TO_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    model: str
    rollout_id: str
    from_unix_ms: int
    to_unix_ms: int
    decisions: int
    mismatches: _containers.RepeatedCompositeFieldContainer[ReplayMismatch]
    def __init__(self, model: _Optional[str] = ..., rollout_id: _Optional[str] = ..., from_unix_ms: _Optional[int] = ..., to_unix_ms: _Optional[int] = ..., decisions: _Optional[int] = ..., mismatches: _Optional[_Iterable[_Union[ReplayMismatch, _Mapping]]] = ...) -> None: ...

class TrafficReplayReport(_message.Message):
    __slots__ = ("model", "version", "from_unix_ms", "to_unix_ms", "replayed", "agree", "differ", "no_recorded_result", "errors", "agreement", "differing_request_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FROM_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TO_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    AGREE_FIELD_NUMBER: _ClassVar[int]
    DIFFER_FIELD_NUMBER: _ClassVar[int]
    NO_RECORDED_RESULT_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    DIFFERING_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    from_unix_ms: int
    to_unix_ms: int
    replayed: int
    agree: int
    differ: int
    no_recorded_result: int
    errors: int
    agreement: float
    differing_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., from_unix_ms: _Optional[int] = ..., to_unix_ms: _Optional[int] = ..., replayed: _Optional[int] = ..., agree: _Optional[int] = ..., differ: _Optional[int] = ..., no_recorded_result: _Optional[int] = ..., errors: _Optional[int] = ..., agreement: _Optional[float] = ..., differing_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RunningBuild(_message.Message):
    __slots__ = ("version", "git_sha", "build_time", "instance", "generation", "partition")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GIT_SHA_FIELD_NUMBER: _ClassVar[int]
    BUILD_TIME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    version: str
    git_sha: str
    build_time: str
    instance: str
    generation: int
    partition: int
    def __init__(self, version: _Optional[str] = ..., git_sha: _Optional[str] = ..., build_time: _Optional[str] = ..., instance: _Optional[str] = ..., generation: _Optional[int] = ..., partition: _Optional[int] = ...) -> None: ...
