"""Every protobuf (``graylane.v1``) <-> domain mapping of the policy engine, in and out.

In: telemetry, operator commands (:func:`command_from_pb`; a command that
cannot be decoded comes back as a :class:`CommandRejected` to audit), shadow
results, rated answers from the outcomes topic (:func:`outcome_of`), and the
compacted control topics read back at start (:func:`restore_values`, with a bad
value skipped per key). Out:
:func:`records_of` turns the core's outputs into ``(topic, key, value)``
records with the keys of the contract (routing: model; precision and scale:
``model/version``; rollouts: rollout id; audit: model), every audit record
built here. A routing plan becomes the router's table here
(:func:`routing_table_of`: bucket ranges by ``graylane.routing``).

The vocabulary, specs and QoS policies map in :mod:`graylane.rollouts.pb`.
Each dataclass <-> message pair is declared once, as a :class:`~graylane.pbmap.PbMap`
table (``_WINDOW_STATS``, ``_ROLLOUT_STATE``, ...), and used both ways through its
``to_pb`` / ``from_pb``; the functions here do what is more than a field copy (audit
records, ids, restore) and take their field copies from those tables.
Conventions:

- Timestamps of "not since" (``breach_since``, ``calm_since``) travel as 0.
- Fields the wire contract has no room for are lost on the way out and come
  back at a conservative value: see :func:`rollout_state_from_pb`,
  ``_QOS_STATE`` (load ceilings), ``_WINDOW_STATS`` (``lag``, ``workers``); for
  specs and policies see :mod:`graylane.rollouts.pb`.
- The sequential gates' running tests are part of the rollout state on the
  wire, so a restarted engine and ``audit verify`` continue the same
  anytime-valid tests (every value a double or a count: the round trip is exact).
- A decision taken with liveness signals or step stats replays only with them,
  so its audit record carries them (``step_inputs``, ``liveness``); an A/B decision
  carries its outcome test (``outcomes``: both arms' tallies, the verdict, the
  difference and its confidence sequence), and replays from the tallies.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import TYPE_CHECKING

from graylane import serde
from graylane.errors import SerdeError
from graylane.evaluation.summary import Comparison, Summary
from graylane.histogram_pb import histogram_from_pb, histogram_to_pb
from graylane.pbmap import EnumTable, Field, Flat, PbMap
from graylane.policy_engine.isolation import RecordGuard
from graylane.policy_engine.logic.agreement import (
    AgreementStats,
    OutputField,
    SchemaMismatch,
    ShadowOutput,
    TokenDecoding,
)
from graylane.policy_engine.logic.gates import (
    RATE_GRID,
    RATIO_GRID,
    RateTest,
    RatioTest,
    SequentialEvidence,
    SlowShare,
    StepEvidence,
)
from graylane.policy_engine.logic.liveness import LagSample, VersionLiveness
from graylane.policy_engine.logic.metric_gates import MetricReading
from graylane.policy_engine.logic.outcomes import (
    ArmTally,
    OutcomeTally,
    OutcomeTest,
    OutcomeVerdict,
    RatedOutcome,
)
from graylane.policy_engine.logic.qos import QosDecision, QosState
from graylane.policy_engine.logic.rollout import Decision, RolloutSignals, RolloutState
from graylane.policy_engine.logic.scale import ScaleDecision, ScaleReason
from graylane.policy_engine.logic.step_evaluation import EvaluationOutcome, EvaluationVerdict
from graylane.policy_engine.logic.text_agreement import TextAgreementStats
from graylane.policy_engine.logic.window import (
    GenerationSample,
    GenerationStats,
    TelemetrySample,
    WindowStats,
)
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    CommandRejected,
    Output,
    PrecisionAck,
    PrecisionPublication,
    QosAudit,
    QosPolicySet,
    RecordSkipped,
    RecordSource,
    RolloutAudit,
    RolloutPublication,
    RoutingAudit,
    RoutingPublication,
    ScaleAudit,
    ScalePublication,
    SkipReason,
)
from graylane.policy_engine.state import VersionKey
from graylane.rollouts.errors import PolicyError
from graylane.rollouts.pb import (
    decision_kind_to_pb,
    manual_command_from_pb,
    phase_from_pb,
    phase_to_pb,
    qos_policy_from_pb,
    qos_policy_to_pb,
    rollout_spec_from_pb,
    rollout_spec_to_pb,
)
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec, StepEvaluation
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase
from graylane.routing.convert import route_config_rules, table_from_pb, table_to_pb
from graylane.routing.table import (
    InvalidRouteRule,
    RouteTable,
    RoutingPlan,
    plan_of_table,
    route_table_for,
)
from graylane.topics import TopicLayout
from graylane.v1 import (
    audit_pb2,
    control_pb2,
    inference_pb2,
    outcome_pb2,
    rollout_pb2,
    telemetry_pb2,
    tensor_pb2,
)

if TYPE_CHECKING:
    from graylane.policy_engine.core import PolicyCore

log = logging.getLogger(__name__)

__all__ = [
    "Record",
    "Restored",
    "audit_record_of",
    "command_from_pb",
    "command_of",
    "decision_id_of",
    "decision_to_audit",
    "outcome_of",
    "precision_command_of",
    "qos_decision_to_audit",
    "qos_state_from_pb",
    "qos_state_to_pb",
    "records_of",
    "restore_values",
    "rollout_state_from_pb",
    "rollout_state_to_pb",
    "routing_table_of",
    "running_build_of",
    "scale_decision_id_of",
    "scale_request_of",
    "scale_to_audit",
    "sequential_from_pb",
    "sequential_to_pb",
    "shadow_of",
    "shadow_output_of",
    "signals_from_audit",
    "telemetry_from_pb",
    "window_stats_from_pb",
    "window_stats_to_pb",
]


# -- records in ------------------------------------------------------------------------


_HISTOGRAM = Field(to_pb=histogram_to_pb, from_pb=histogram_from_pb)
"""A latency histogram, always on the wire."""

_ENDED_BY_MODEL = frozenset({inference_pb2.EOS, inference_pb2.STOP})


def _ended_by_model(pb: telemetry_pb2.GenerationTelemetry) -> int:
    """Finish reasons this build does not know count as generations that did not end by
    the model's choice."""
    return sum(c.count for c in pb.finish_reasons if c.reason in _ENDED_BY_MODEL)


_GENERATION_SAMPLE = PbMap(
    GenerationSample,
    telemetry_pb2.GenerationTelemetry,
    {
        "ttft": _HISTOGRAM,
        "tpot": _HISTOGRAM,
        "inter_token_p99": _HISTOGRAM,
        "prefill": _HISTOGRAM,
        "output_tokens": _HISTOGRAM,
        "ended_by_model": Flat(from_pb=_ended_by_model),
    },
)
"""The window's part of a batch's generation telemetry (the worker writes the finish
reasons, the window keeps how many ended by the model's choice)."""


def _batch_id_to_pb(batch_id: tuple[str, int, int]) -> telemetry_pb2.BatchId:
    worker_id, partition, first_offset = batch_id
    return telemetry_pb2.BatchId(
        worker_id=worker_id, partition=partition, first_offset=first_offset
    )


_batch_id_from_pb = attrgetter("worker_id", "partition", "first_offset")
"""(worker, partition, first offset): a C-level getter, on the hot path of telemetry."""


_TELEMETRY = PbMap(
    TelemetrySample,
    telemetry_pb2.BatchTelemetry,
    {
        "completed_at_ms": Field("completed_at_unix_ms"),
        "latency": _HISTOGRAM,
        "queue_wait": _HISTOGRAM,
        "queue_wait_mean_ms": Field("queue_wait_ms_mean"),
        "started_at_ms": Field("started_at_unix_ms"),
        "batch_id": Field(to_pb=_batch_id_to_pb, from_pb=_batch_id_from_pb, absent=None),
        "generation": _GENERATION_SAMPLE.nested(absent=None),
    },
)
"""A batch's telemetry (the hot path: compiled into one constructor call)."""

telemetry_from_pb = _TELEMETRY.from_pb


def command_from_pb(pb: rollout_pb2.RolloutCommand) -> Command | CommandRejected:
    """The core's command of ``pb``, or why it is refused."""
    base = Command(
        kind=CommandKind.MANUAL,
        model=pb.model or pb.spec.model or pb.qos_policy.model,
        command_id=pb.command_id,
        rollout_id=pb.rollout_id or pb.spec.rollout_id,
        issued_by=pb.issued_by,
        note=pb.reason,
    )
    if pb.kind == rollout_pb2.COMMAND_START:
        base = replace(base, kind=CommandKind.START)
    try:
        if pb.kind == rollout_pb2.COMMAND_START:
            spec = rollout_spec_from_pb(pb.spec)
            return replace(base, kind=CommandKind.START, spec=spec)
        if pb.kind == rollout_pb2.COMMAND_UPDATE_SPEC:
            spec = rollout_spec_from_pb(pb.spec)
            return replace(base, kind=CommandKind.UPDATE_SPEC, spec=spec)
        if pb.kind == rollout_pb2.COMMAND_REVERT:
            return replace(base, kind=CommandKind.REVERT, target_version=pb.target_version)
        if pb.kind == rollout_pb2.COMMAND_SET_ROUTE_CONFIG:
            rules = route_config_rules(pb.route_config)
            command = replace(
                base,
                kind=CommandKind.SET_ROUTE_CONFIG,
                rules=rules,
                allow_pinning=pb.route_config.allow_pinning,
                target_version=pb.target_version,
            )
            if pb.route_config.model != command.model:
                return CommandRejected(
                    command=command, reason="no route config", at_ms=pb.issued_at_unix_ms
                )
            return command
        if pb.kind == rollout_pb2.COMMAND_SET_QOS_POLICY:
            policy = qos_policy_from_pb(pb.qos_policy)
            return replace(base, kind=CommandKind.SET_QOS_POLICY, qos_policy=policy)
    except (PolicyError, InvalidRouteRule) as exc:
        return CommandRejected(command=base, reason=str(exc), at_ms=pb.issued_at_unix_ms)
    manual = manual_command_from_pb(pb.kind)
    command = replace(base, manual=manual)
    if manual is None:
        return CommandRejected(
            command=command, reason=f"unknown command kind {pb.kind}", at_ms=pb.issued_at_unix_ms
        )
    return command


def shadow_output_of(pb: inference_pb2.InferenceResult, at_ms: int) -> ShadowOutput:
    """A result on the shadow topic, reduced for comparison.

    Generations compare by token ids (by their text when an engine server ran them);
    other results by a digest of their output bytes (exact agreement; a tolerance needs
    the decoded tensors).
    """
    error = pb.status != inference_pb2.OK
    tokens = tuple(pb.generated_token_ids) if pb.generated_token_ids else None
    label: int | None = None
    if tokens is None and not error:
        # a generation an engine server ran has text but no token ids: its text (and the
        # tools it called) is what is compared, exactly
        digest = hashlib.blake2b(digest_size=8)
        if pb.task == inference_pb2.GENERATE:
            digest.update(pb.text.encode("utf-8"))
            for call in pb.tool_calls:
                digest.update(f"\x00{call.name}\x00{call.arguments}".encode())
        for t in pb.outputs:
            digest.update(t.data)
        label = int.from_bytes(digest.digest(), "big")
    schema = tuple(OutputField(t.name, _dtype_name(t.dtype), tuple(t.shape)) for t in pb.outputs)
    return ShadowOutput(
        request_id=pb.request_id,
        version=pb.version,
        at_ms=at_ms,
        tokens=tokens,
        label=label,
        error=error,
        schema=schema if tokens is None else None,
        pair_id=pb.shadow_pair_id,
        decoding=_DECODING.from_pb(pb.decoding),
        text=pb.text if pb.task == inference_pb2.GENERATE and not error else None,
        prompt_digest=pb.prompt_sha256,
    )


_DECODING = EnumTable(
    {
        TokenDecoding.GREEDY: inference_pb2.GREEDY,
        TokenDecoding.SEEDED: inference_pb2.SEEDED,
        TokenDecoding.UNSEEDED: inference_pb2.UNSEEDED,
    }
)
"""How a result's generation chose its tokens; unset (an older worker) is unknown."""


_DTYPE_NAMES = {number: name.lower() for name, number in tensor_pb2.DType.items()}


def _dtype_name(value: int) -> str:
    """The dtype's name; a value this build does not know keeps its number (``dtype_42``)."""
    return _DTYPE_NAMES.get(value) or f"dtype_{value}"


def command_of(
    value: bytes | None, guard: RecordGuard, at_ms: int
) -> Command | CommandRejected | RecordSkipped:
    """The command of one record on the commands topic, or why it was skipped."""
    try:
        pb = serde.decode(rollout_pb2.RolloutCommand, value)
    except SerdeError as exc:
        return guard.skip(RecordSource.COMMANDS, SkipReason.UNDECODABLE, str(exc), at_ms)
    try:
        return command_from_pb(pb)
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        return guard.skip(
            RecordSource.COMMANDS,
            SkipReason.INVALID,
            detail,
            at_ms,
            key=pb.command_id,
            model=pb.model,
        )


def shadow_of(value: bytes | None, guard: RecordGuard, at_ms: int) -> ShadowOutput | RecordSkipped:
    """The shadow output of one result on a shadow topic, or why it was skipped."""
    try:
        return shadow_output_of(serde.decode(inference_pb2.InferenceResult, value), at_ms)
    except Exception as exc:
        reason = SkipReason.UNDECODABLE if isinstance(exc, SerdeError) else SkipReason.INVALID
        return guard.skip(RecordSource.SHADOW, reason, f"{type(exc).__name__}: {exc}", at_ms)


def outcome_of(value: bytes | None, guard: RecordGuard, at_ms: int) -> RatedOutcome | RecordSkipped:
    """The rated answer of one record on the outcomes topic, or why it was skipped."""
    try:
        pb = serde.decode(outcome_pb2.Outcome, value)
    except SerdeError as exc:
        return guard.skip(RecordSource.OUTCOMES, SkipReason.UNDECODABLE, str(exc), at_ms)
    if not (pb.request_id and pb.model and 0.0 <= pb.value <= 1.0):
        detail = f"an outcome needs a request id, a model and a value within [0, 1]: {pb.value!r}"
        return guard.skip(RecordSource.OUTCOMES, SkipReason.INVALID, detail, at_ms, model=pb.model)
    return _RATED_OUTCOME.from_pb(pb)


_RATED_OUTCOME = PbMap(
    RatedOutcome, outcome_pb2.Outcome, {"rated_at_ms": Field("rated_at_unix_ms")}
)

_ARM = PbMap(ArmTally, outcome_pb2.ArmOutcomes)

_OUTCOME_TALLY = PbMap(
    OutcomeTally,
    outcome_pb2.OutcomeEvidence,
    {"baseline": _ARM.nested(), "candidate": _ARM.nested()},
)
"""The tally an outcome test was run on (what a replay feeds the controller)."""


def _verdict_to_pb(verdict: OutcomeVerdict) -> str:
    return verdict.value


_OUTCOME_TEST = PbMap(
    OutcomeTest,
    outcome_pb2.OutcomeEvidence,
    {
        "verdict": Field(to_pb=_verdict_to_pb, from_pb=OutcomeVerdict),
        "tally": _OUTCOME_TALLY.flat(),
    },
)
"""An A/B decision's outcome test: its tally in the evidence's own fields."""


# -- window stats ----------------------------------------------------------------------

_GENERATION_WINDOW = PbMap(
    GenerationStats,
    audit_pb2.GenerationWindow,
    {
        "ttft": _HISTOGRAM,
        "tpot": _HISTOGRAM,
        "inter_token_p99": _HISTOGRAM,
        "prefill": _HISTOGRAM,
        "output_tokens": _HISTOGRAM,
    },
)

_WINDOW_STATS = PbMap(
    WindowStats,
    audit_pb2.WindowStats,
    {
        "window_start_ms": Field("window_start_unix_ms"),
        "window_end_ms": Field("window_end_unix_ms"),
        "service": Field(to_pb=histogram_to_pb, from_pb=histogram_from_pb, absent=None),
        "generation": _GENERATION_WINDOW.nested(absent=None),
    },
    local=("lag", "workers"),
)
"""Every field but ``lag`` and ``workers``, which have no room on the wire (back at 0).
Service times come back as recorded (histogram and quantiles): the gates judge latency
on them, so a replay decides as the engine did."""

window_stats_to_pb = _WINDOW_STATS.to_pb
window_stats_from_pb = _WINDOW_STATS.from_pb


# -- rollout state (with its sequential evidence and liveness signals) -----------------


def _or_one(value: float) -> float:
    return value or 1.0


def _or_none(value: int) -> int | None:
    return value or None


def _or_zero(value: int | None) -> int:
    return value or 0


_RATIO_START = (0.0,) * len(RATIO_GRID)
_RATE_START = (0.0,) * len(RATE_GRID)


def _ratio_log_lr(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(values) or _RATIO_START


def _rate_log_lr(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(values) or _RATE_START


_RATIO = PbMap(
    RatioTest,
    rollout_pb2.RatioTestState,
    {"r0": Field(from_pb=_or_one), "log_lr": Field(from_pb=_ratio_log_lr)},
)
_RATE = PbMap(RateTest, rollout_pb2.RateTestState, {"log_lr": Field(from_pb=_rate_log_lr)})
_SHARE = PbMap(
    SlowShare, rollout_pb2.SlowShareState, {"p95": _RATIO.nested(), "p99": _RATIO.nested()}
)
_SEQUENTIAL = PbMap(
    SequentialEvidence,
    rollout_pb2.SequentialEvidence,
    {
        "errors": _RATIO.nested(),
        "budget": _RATE.nested(),
        "slow_p95": _RATIO.nested(),
        "slow_p99": _RATIO.nested(),
        "through_ms": Field("through_unix_ms"),
        "ttft": _SHARE.nested(),
        "tpot": _SHARE.nested(),
    },
)
_NO_EVIDENCE = SequentialEvidence()


def sequential_to_pb(ev: SequentialEvidence) -> rollout_pb2.SequentialEvidence | None:
    """None for the evidence of a rollout that has consumed no increment."""
    return None if ev == _NO_EVIDENCE else _SEQUENTIAL.to_pb(ev)


def sequential_from_pb(pb: rollout_pb2.RolloutState) -> SequentialEvidence:
    """The state's sequential evidence; none yet when the field is absent."""
    return _SEQUENTIAL.from_pb(pb.sequential) if pb.HasField("sequential") else _NO_EVIDENCE


def _bake_reference_to_pb(window: WindowStats | None) -> bytes:
    return b"" if window is None else _WINDOW_STATS.to_pb(window).SerializeToString()


def _bake_reference_from_pb(data: bytes) -> WindowStats | None:
    """The frozen reference window of a bake (None when the state has none)."""
    if not data:
        return None
    return _WINDOW_STATS.from_pb(audit_pb2.WindowStats.FromString(data))


_STEP_EVIDENCE = PbMap(
    StepEvidence, rollout_pb2.StepEvidence, {"through_ms": Field("through_unix_ms")}
)

_STATE_OUTCOMES = PbMap(
    OutcomeTally,
    rollout_pb2.RolloutState,
    {"baseline": _ARM.nested("baseline_outcomes"), "candidate": _ARM.nested("candidate_outcomes")},
    local=("unjoined", "duplicates"),
)
"""A rollout's outcome tallies as its state carries them: both arms (the unjoined and
duplicate counts are not carried)."""

_ROLLOUT_STATE = PbMap(
    RolloutState,
    rollout_pb2.RolloutState,
    {
        "phase": Field(to_pb=phase_to_pb, read=False),
        "shadow_share": Field(read=False),
        "phase_started_ms": Field("phase_started_at_unix_ms"),
        "step_started_ms": Field("step_started_at_unix_ms", read=False),
        "failure_window_end_ms": Field("failure_window_end_unix_ms"),
        "paused_from": Field(to_pb=phase_to_pb, read=False),
        "approval_step": Field(absent=-1),
        "approved_step": Field(absent=-1),
        "pause_until_ms": Field("pause_until_unix_ms"),
        "epoch": Field(read=False),
        "updated_ms": Field("updated_at_unix_ms"),
        "evidence": _STEP_EVIDENCE.nested(),
        "sequential": Field(
            to_pb=sequential_to_pb, from_pb=_SEQUENTIAL.from_pb, absent=_NO_EVIDENCE
        ),
        "outcomes": _STATE_OUTCOMES.flat(),
        "bake_until_ms": Field("bake_until_unix_ms", to_pb=_or_none),
        "bake_reference": Field(to_pb=_bake_reference_to_pb, from_pb=_bake_reference_from_pb),
    },
)
"""The rollout state on the wire, complete: a restarted engine resumes exactly from it.
What older records lack comes back in :func:`rollout_state_from_pb` (the fields not read
here)."""


def rollout_state_to_pb(state: RolloutState, spec: RolloutSpec) -> rollout_pb2.RolloutState:
    """The wire form, complete: a restarted engine resumes exactly from it."""
    return _ROLLOUT_STATE.to_pb(state, spec=rollout_spec_to_pb(spec))


def rollout_state_from_pb(
    pb: rollout_pb2.RolloutState, *, epoch: int = 0
) -> tuple[RolloutState, RolloutSpec]:
    """State and spec from the wire, after a restart.

    Records of current engines carry the whole state. In older records (no
    ``step_started_at`` / ``epoch`` / ... fields) what is missing comes back
    conservatively: the step's dwell restarts at the last update
    (``step_started_ms = updated_at``), the step's evidence is empty (its
    sample minimum starts over), the next gate failure counts, and ``epoch``
    is the caller's (the model's routing table holds it). The shadow share is
    then the spec's while shadowing (also when paused from it).
    """
    phase = phase_from_pb(pb.phase)
    if phase is None:
        known = "no phase" if not pb.phase else f"phase {pb.phase}, unknown to this build"
        raise ValueError(f"rollout {pb.rollout_id!r} has {known}")
    spec = rollout_spec_from_pb(pb.spec)
    paused_from = phase_from_pb(pb.paused_from)
    if paused_from is None and pb.paused_from != rollout_pb2.ROLLOUT_PHASE_UNSPECIFIED:
        raise ValueError(f"rollout {pb.rollout_id!r} paused from unknown phase {pb.paused_from}")
    shadowing = Phase.SHADOWING in (phase, paused_from)
    state = _ROLLOUT_STATE.from_pb(
        pb,
        phase=phase,
        paused_from=paused_from,
        shadow_share=pb.shadow_share
        if pb.HasField("shadow_share")
        else (spec.shadow_share if shadowing else 0.0),
        step_started_ms=pb.step_started_at_unix_ms
        if pb.HasField("step_started_at_unix_ms")
        else pb.updated_at_unix_ms,
        epoch=pb.epoch if pb.HasField("epoch") else epoch,
    )
    return state, spec


_LAG_SAMPLE = PbMap(
    LagSample,
    audit_pb2.LagSample,
    {"at_ms": Field("at_unix_ms"), "committed": Field(absent=None)},
)
_LIVENESS = PbMap(
    VersionLiveness,
    audit_pb2.VersionLiveness,
    {
        "first_routed_since_telemetry_ms": Field(
            "first_routed_since_telemetry_unix_ms", absent=None
        ),
        "last_telemetry_ms": Field("last_telemetry_unix_ms", absent=None),
        "lag": _LAG_SAMPLE.repeated(),
    },
)


# -- QoS state and precision commands --------------------------------------------------


_QOS_STATE = PbMap(
    QosState,
    audit_pb2.QosState,
    {
        "last_change_ms": Field("last_change_unix_ms"),
        "breach_since_ms": Field("breach_since_unix_ms", to_pb=_or_zero, from_pb=_or_none),
        "calm_since_ms": Field("calm_since_unix_ms", to_pb=_or_zero, from_pb=_or_none),
        "contention": Field(from_pb=_or_one),
    },
    local=("ceilings",),
)
"""Load ceilings are not carried: after a restart the first step up is not load-checked."""

qos_state_to_pb = _QOS_STATE.to_pb
qos_state_from_pb = _QOS_STATE.from_pb


def precision_command_of(
    decision: QosDecision, *, epoch: int, decision_id: str = ""
) -> control_pb2.PrecisionCommand:
    after = decision.after
    return control_pb2.PrecisionCommand(
        model=after.model,
        version=after.version,
        variant=after.active_variant,
        epoch=epoch,
        reason=decision.reason,
        issued_at_unix_ms=decision.at_ms,
        decision_id=decision_id or qos_decision_id_of(decision),
    )


# -- replica requests ------------------------------------------------------------------

_SCALE_REASONS = EnumTable(
    {
        ScaleReason.FLOOR_BREACH: control_pb2.SCALE_REASON_FLOOR_BREACH,
        ScaleReason.LAG_GROWING: control_pb2.SCALE_REASON_LAG_GROWING,
        ScaleReason.LOW_LOAD: control_pb2.SCALE_REASON_LOW_LOAD,
        ScaleReason.OVERLOAD: control_pb2.SCALE_REASON_OVERLOAD,
    },
    unset=control_pb2.SCALE_REASON_UNSPECIFIED,
)


def scale_decision_id_of(decision: ScaleDecision) -> str:
    """A stable id: the same decision replayed gets the same id."""
    parts = (
        decision.after.model,
        decision.after.version,
        decision.at_ms,
        decision.kind.value,
        decision.rule,
        decision.after.desired,
    )
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:24]


def scale_request_of(decision: ScaleDecision, *, epoch: int) -> control_pb2.ScaleRequest:
    after = decision.after
    return control_pb2.ScaleRequest(
        model=after.model,
        version=after.version,
        desired_replicas=after.desired,
        current_replicas=decision.signals.replicas,
        reason=_SCALE_REASONS.to_pb(decision.reason),
        detail=decision.detail,
        decided_at_unix_ms=decision.at_ms,
        decision_id=scale_decision_id_of(decision),
        epoch=epoch,
    )


# -- routing ---------------------------------------------------------------------------


def routing_table_of(
    plan: RoutingPlan, *, now_ms: int, reason: str = ""
) -> control_pb2.RoutingTable:
    """The compacted routing record for ``plan`` (bucket ranges by ``graylane.routing``),
    carrying the plan's cohort rules and pinning."""
    table = route_table_for(plan, reason=reason)
    return table_to_pb(table, updated_at_unix_ms=now_ms)


# -- audit records ---------------------------------------------------------------------


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:24]


def decision_id_of(decision: Decision) -> str:
    """A stable id: the same decision replayed gets the same id."""
    return _digest(
        decision.after.rollout_id,
        decision.at_ms,
        decision.kind.value,
        decision.rule,
        decision.before.epoch,
        decision.after.epoch,
        decision.before.updated_ms,
    )


def qos_decision_id_of(decision: QosDecision) -> str:
    return _digest(
        decision.after.model,
        decision.after.version,
        decision.at_ms,
        decision.kind.value,
        decision.rule,
        decision.after.active_variant,
    )


def decision_to_audit(
    decision: Decision,
    spec: RolloutSpec,
    *,
    decision_id: str = "",
    actor: str = "policy-engine",
    command_id: str = "",
    spec_before: RolloutSpec | None = None,
) -> audit_pb2.AuditRecord:
    """``spec_before``: the spec ``decision.before`` ran under, when the decision replaced it."""
    return audit_pb2.AuditRecord(
        decision_id=decision_id or decision_id_of(decision),
        decided_at_unix_ms=decision.at_ms,
        model=spec.model,
        rollout_id=spec.rollout_id,
        version=spec.candidate,
        kind=decision_kind_to_pb(decision.kind),
        rule=decision.rule,
        reason=decision.reason,
        inputs=[window_stats_to_pb(s) for s in decision.inputs],
        rollout_before=rollout_state_to_pb(decision.before, spec_before or spec),
        rollout_after=rollout_state_to_pb(decision.after, spec),
        actor=actor,
        epoch=decision.after.epoch,
        command_id=command_id,
        agreement=_agreement_to_pb(decision.agreement, _text(decision.signals))
        if decision.agreement is not None
        else None,
        note=decision.note,
        step_inputs=[window_stats_to_pb(s) for s in _steps(decision.signals)],
        liveness=[_LIVENESS.to_pb(v) for v in _liveness(decision.signals)],
        metric_readings=[
            _METRIC_READING.to_pb(r) for r in (decision.signals.metrics if decision.signals else ())
        ],
        outcomes=(
            _OUTCOME_TEST.to_pb(decision.outcome_test)
            if decision.outcome_test is not None
            else None
        ),
        evaluation=(
            evaluation_to_pb(decision.signals.evaluation)
            if decision.signals is not None and decision.signals.evaluation is not None
            else None
        ),
    )


_METRIC_READING = PbMap(
    MetricReading,
    audit_pb2.MetricReading,
    {
        "value": Field(absent=None),
        "read_at_ms": Field("read_at_unix_ms"),
        "inconclusive_since_ms": Field("inconclusive_since_unix_ms"),
    },
)

_EVALUATION_VERDICTS = EnumTable(
    {
        EvaluationVerdict.PASSED: audit_pb2.EVALUATION_PASSED,
        EvaluationVerdict.DROPPED: audit_pb2.EVALUATION_DROPPED,
        EvaluationVerdict.UNUSABLE: audit_pb2.EVALUATION_UNUSABLE,
    }
)

_SCORE = PbMap(Summary, audit_pb2.EvaluationScore, {"target": Field("version")})

_COMPARISON = PbMap(
    Comparison,
    audit_pb2.StepEvaluationResult,
    {
        "items": Field("paired_items"),
        "ci_low": Field("difference_ci_low"),
        "ci_high": Field("difference_ci_high"),
    },
    local=("baseline", "candidate"),
)
"""A step evaluation's paired comparison, in the result's own fields (its two versions
are the scores')."""


def _comparison_from_pb(pb: audit_pb2.StepEvaluationResult) -> Comparison | None:
    """The comparison of a result with both scores (None without)."""
    if not (pb.HasField("baseline") and pb.HasField("candidate")):
        return None
    return _COMPARISON.from_pb(pb, baseline=pb.baseline.version, candidate=pb.candidate.version)


_EVALUATION = PbMap(
    EvaluationOutcome,
    audit_pb2.StepEvaluationResult,
    {
        "baseline": _SCORE.nested(absent=None),
        "candidate": _SCORE.nested(absent=None),
        "comparison": Flat(from_pb=_comparison_from_pb, to_pb=_COMPARISON.to_pb),
        "finished_at_ms": Field("finished_at_unix_ms"),
    },
    local=("rollout_id", "gate"),
)
"""A step evaluation's scores, interval and verdict, as the audit records them; the
rollout and the gate (the spec's, at its step) come from the record around it."""


def evaluation_to_pb(outcome: EvaluationOutcome) -> audit_pb2.StepEvaluationResult:
    """A step evaluation's scores, interval and verdict, as the audit records them."""
    gate = outcome.gate
    return _EVALUATION.to_pb(
        outcome,
        set_path=gate.set_path,
        max_drop_vs_stable=gate.max_drop_vs_stable,
        verdict=_EVALUATION_VERDICTS.to_pb(outcome.verdict),
    )


def evaluation_from_pb(
    pb: audit_pb2.StepEvaluationResult, rollout_id: str, gate: StepEvaluation
) -> EvaluationOutcome:
    """The outcome an audit record carries (``gate``: the spec's, at its step)."""
    return _EVALUATION.from_pb(pb, rollout_id=rollout_id, gate=gate)


def _steps(signals: RolloutSignals | None) -> list[WindowStats]:
    if signals is None:
        return []
    return [s for s in (signals.baseline_step, signals.candidate_step) if s is not None]


def _liveness(signals: RolloutSignals | None) -> list[VersionLiveness]:
    if signals is None:
        return []
    return [v for v in (signals.baseline_liveness, signals.candidate_liveness) if v is not None]


def signals_from_audit(
    rec: audit_pb2.AuditRecord, baseline: str, candidate: str
) -> RolloutSignals | None:
    """The signals a decision was taken with (None when the record carries none)."""
    text = None
    if rec.HasField("agreement") and (rec.agreement.text_pairs or rec.agreement.text_uncontrolled):
        text = _TEXT_AGREEMENT.from_pb(rec.agreement)
    outcomes = rec.HasField("outcomes")
    if (
        not rec.step_inputs
        and not rec.liveness
        and not rec.HasField("evaluation")
        and not text
        and not outcomes
        and not rec.metric_readings
    ):
        return None
    steps = {s.version: window_stats_from_pb(s) for s in rec.step_inputs}
    live = {v.version: _LIVENESS.from_pb(v) for v in rec.liveness}
    evaluation = None
    if rec.HasField("evaluation"):
        _, spec = rollout_state_from_pb(rec.rollout_before)
        index = rec.evaluation.step_index
        gate = spec.steps[index].evaluation if 0 <= index < len(spec.steps) else None
        if gate is not None:
            evaluation = evaluation_from_pb(rec.evaluation, spec.rollout_id, gate)
    return RolloutSignals(
        baseline_step=steps.get(baseline),
        candidate_step=steps.get(candidate),
        baseline_liveness=live.get(baseline),
        candidate_liveness=live.get(candidate),
        metrics=tuple(_METRIC_READING.from_pb(r) for r in rec.metric_readings),
        outcomes=_OUTCOME_TALLY.from_pb(rec.outcomes) if outcomes else None,
        evaluation=evaluation,
        text_agreement=text,
    )


def _text(signals: RolloutSignals | None) -> TextAgreementStats | None:
    return signals.text_agreement if signals is not None else None


def _has_mismatch(pb: audit_pb2.ShadowAgreement) -> bool:
    return bool(pb.baseline_schema or pb.candidate_schema)


_SCHEMA_MISMATCH = PbMap(
    SchemaMismatch,
    audit_pb2.ShadowAgreement,
    {"baseline": Field("baseline_schema"), "candidate": Field("candidate_schema")},
)

_AGREEMENT = PbMap(
    AgreementStats,
    audit_pb2.ShadowAgreement,
    {
        "mismatch": _SCHEMA_MISMATCH.flat(when=_has_mismatch),
        "greedy": Field("greedy_pairs"),
        "seeded": Field("seeded_pairs"),
        "unseeded": Field("unseeded_pairs"),
    },
)

_TEXT_AGREEMENT = PbMap(
    TextAgreementStats,
    audit_pb2.ShadowAgreement,
    {
        "pairs": Field("text_pairs"),
        "similarity": Field("text_similarity"),
        "self_similarity": Field("text_self_similarity"),
        "log_wealth": Field("text_log_evidence"),
        "uncontrolled": Field("text_uncontrolled"),
    },
)
"""Text agreement (generations an engine server ran), in the agreement's own fields."""

agreement_from_pb = _AGREEMENT.from_pb


def _agreement_to_pb(
    stats: AgreementStats, text: TextAgreementStats | None = None
) -> audit_pb2.ShadowAgreement:
    pb = _AGREEMENT.to_pb(stats)
    if text is not None:
        pb.MergeFrom(_TEXT_AGREEMENT.to_pb(text))
    return pb


def qos_decision_to_audit(
    decision: QosDecision,
    *,
    epoch: int = 0,
    decision_id: str = "",
    actor: str = "policy-engine",
    rollout_id: str = "",
    policy: QosPolicy | None = None,
) -> audit_pb2.AuditRecord:
    """PRECISION_CHANGE when the variant changes, else HOLD; with ``policy`` for replay."""
    kind = audit_pb2.DECISION_PRECISION_CHANGE if decision.changed else audit_pb2.DECISION_HOLD
    return audit_pb2.AuditRecord(
        qos_policy=qos_policy_to_pb(policy) if policy is not None else None,
        decision_id=decision_id or qos_decision_id_of(decision),
        decided_at_unix_ms=decision.at_ms,
        model=decision.after.model,
        rollout_id=rollout_id,
        version=decision.after.version,
        kind=kind,
        rule=decision.rule,
        reason=decision.reason,
        inputs=[window_stats_to_pb(s) for s in decision.inputs],
        qos_before=qos_state_to_pb(decision.before),
        qos_after=qos_state_to_pb(decision.after),
        actor=actor,
        epoch=epoch,
        qos_scale_hold=decision.scale_hold,
    )


def scale_to_audit(decision: ScaleDecision, *, epoch: int) -> audit_pb2.AuditRecord:
    """DECISION_SCALE_CHANGE with the request it published."""
    after = decision.after
    return audit_pb2.AuditRecord(
        decision_id=scale_decision_id_of(decision),
        decided_at_unix_ms=decision.at_ms,
        model=after.model,
        version=after.version,
        kind=audit_pb2.DECISION_SCALE_CHANGE,
        rule=decision.rule,
        reason=decision.detail,
        actor="policy-engine",
        epoch=epoch,
        scale=scale_request_of(decision, epoch=epoch),
    )


def _skipped_audit(o: RecordSkipped) -> audit_pb2.AuditRecord:
    decision = o.source in (
        RecordSource.ROLLOUT_DECISION,
        RecordSource.QOS_DECISION,
        RecordSource.PRECISION_ACKS,
        RecordSource.SCALE_DECISION,
    )
    what = f"{o.source.value} {o.key or o.model or ''}".strip()
    return audit_pb2.AuditRecord(
        decision_id=f"skipped-{o.source.value}-{o.key or o.model}-{o.version}-{o.at_ms}",
        decided_at_unix_ms=o.at_ms,
        model=o.model,
        version=o.version,
        rollout_id=o.rollout_id,
        kind=decision_kind_to_pb(DecisionKind.HOLD),
        rule=DecisionRule.DECISION_FAILED if decision else DecisionRule.RECORD_SKIPPED,
        reason=f"{what} skipped ({o.reason.value}): {o.detail}",
        actor="policy-engine",
    )


def audit_record_of(
    o: RolloutAudit
    | QosAudit
    | QosPolicySet
    | CommandRejected
    | RoutingAudit
    | PrecisionAck
    | ScaleAudit
    | RecordSkipped,
) -> audit_pb2.AuditRecord:
    """The audit record of an output that is not a publication: every audit record is built here."""
    if isinstance(o, ScaleAudit):
        return scale_to_audit(o.decision, epoch=o.epoch)
    if isinstance(o, RolloutAudit):
        return decision_to_audit(
            o.decision, o.spec, command_id=o.command_id, actor=o.actor, spec_before=o.spec_before
        )
    if isinstance(o, QosAudit):
        return qos_decision_to_audit(
            o.decision, epoch=o.epoch, rollout_id=o.rollout_id, policy=o.policy
        )
    if isinstance(o, QosPolicySet):
        return audit_pb2.AuditRecord(
            decision_id=f"qos-policy-{o.command_id or o.at_ms}",
            decided_at_unix_ms=o.at_ms,
            model=o.policy.model,
            version=o.policy.version,
            kind=decision_kind_to_pb(DecisionKind.MANUAL),
            rule=DecisionRule.SET_QOS_POLICY,
            reason=f"QoS policy set: SLO {o.policy.objectives}, "
            f"ladder {' > '.join(o.policy.ladder)}",
            qos_before=qos_state_to_pb(o.before) if o.before else None,
            qos_after=qos_state_to_pb(o.after),
            actor=o.actor or "control-plane",
            command_id=o.command_id,
        )
    if isinstance(o, PrecisionAck):
        return audit_pb2.AuditRecord(
            decision_id=f"precision-ack-{o.model}-{o.version}-{o.epoch}",
            decided_at_unix_ms=o.at_ms,
            model=o.model,
            version=o.version,
            kind=decision_kind_to_pb(DecisionKind.HOLD),
            rule=o.rule,
            reason=o.reason,
            actor="policy-engine",
            epoch=o.epoch,
        )
    if isinstance(o, RecordSkipped):
        return _skipped_audit(o)
    if isinstance(o, RoutingAudit):
        return audit_pb2.AuditRecord(
            decision_id=f"routing-{o.model}-{o.epoch}",
            decided_at_unix_ms=o.at_ms,
            model=o.model,
            version=o.version,
            kind=decision_kind_to_pb(DecisionKind.MANUAL),
            rule=o.rule,
            reason=o.reason,
            actor=o.actor or "control-plane",
            epoch=o.epoch,
            command_id=o.command_id,
        )
    cmd = o.command
    return audit_pb2.AuditRecord(
        decision_id=f"rejected-{cmd.command_id or o.at_ms}",
        decided_at_unix_ms=o.at_ms,
        model=cmd.model,
        rollout_id=cmd.rollout_id,
        kind=decision_kind_to_pb(DecisionKind.MANUAL),
        rule=DecisionRule.COMMAND_REJECTED,
        reason=f"{cmd.kind.value}"
        f"{'/' + cmd.manual.value if cmd.manual else ''} rejected: {o.reason}",
        actor=cmd.issued_by or "control-plane",
        command_id=cmd.command_id,
        note=cmd.note,
    )


# -- records out -----------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes
    value: bytes


def running_build_of(
    *, version: str, git_sha: str, build_time: str, instance: str
) -> audit_pb2.RunningBuild:
    """The engine's build, as each audit record it writes names it."""
    return audit_pb2.RunningBuild(
        version=version, git_sha=git_sha, build_time=build_time, instance=instance
    )


def records_of(
    outputs: Iterable[Output],
    layout: TopicLayout,
    *,
    decided_by: audit_pb2.RunningBuild | None = None,
) -> list[Record]:
    """The records to write; a skip that was audited lately writes none (it is counted).

    ``decided_by``: the engine's build, stamped on each audit record."""
    return [
        _record(o, layout, decided_by)
        for o in outputs
        if not (isinstance(o, RecordSkipped) and not o.audited)
    ]


def _record(
    o: Output, layout: TopicLayout, decided_by: audit_pb2.RunningBuild | None = None
) -> Record:
    if isinstance(o, RoutingPublication):
        table = routing_table_of(o.plan, now_ms=o.at_ms, reason=o.reason)
        return Record(layout.routing(), o.plan.model.encode(), serde.encode(table))
    if isinstance(o, PrecisionPublication):
        after = o.decision.after
        precision = precision_command_of(o.decision, epoch=o.epoch)
        key = layout.precision_key(after.model, after.version)
        return Record(layout.precision(), key.encode(), serde.encode(precision))
    if isinstance(o, ScalePublication):
        scaled = o.decision.after
        key = layout.scale_key(scaled.model, scaled.version)
        request = scale_request_of(o.decision, epoch=o.epoch)
        return Record(layout.scale(), key.encode(), serde.encode(request))
    if isinstance(o, RolloutPublication):
        pb = rollout_state_to_pb(o.state, o.spec)
        return Record(layout.rollouts(), o.state.rollout_id.encode(), serde.encode(pb))
    rec = audit_record_of(o)
    if decided_by is not None:
        rec.decided_by.CopyFrom(decided_by)
    return Record(layout.audit(), rec.model.encode(), serde.encode(rec))


# -- restore: the compacted control topics read back -----------------------------------

Values = Mapping[bytes, bytes | None]


@dataclass
class Restored:
    """What the compacted control topics hold, decoded; and what had to be skipped."""

    states: list[tuple[RolloutState, RolloutSpec]] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)
    tables: dict[str, RouteTable] = field(default_factory=dict)
    precision: dict[VersionKey, tuple[str, int]] = field(default_factory=dict)
    qos_policies: list[QosPolicy] = field(default_factory=list)
    scale: dict[VersionKey, tuple[int, int, int]] = field(default_factory=dict)
    """The newest scale request per version: (desired replicas, epoch, decided at)."""
    skipped: list[RecordSkipped] = field(default_factory=list)

    def apply(self, core: PolicyCore) -> None:
        """Rebuild ``core`` from it: the one way state comes back at start."""
        core.restore(
            self.states,
            self.epochs,
            self.precision,
            self.qos_policies,
            tables=self.tables,
            scale=self.scale,
        )


def restore_values(
    routing: Values,
    precision: Values,
    rollouts: Values,
    guard: RecordGuard,
    at_ms: int,
    *,
    scale: Values | None = None,
    commands: Iterable[bytes | None] = (),
) -> Restored:
    """Decode the latest value per key of each control topic, and the QoS policies among
    the ``commands`` on record (the latest per version); skip (per key) what is bad."""
    out = Restored()

    def skip(source: RecordSource, key: bytes, exc: Exception) -> None:
        reason = SkipReason.UNDECODABLE if isinstance(exc, SerdeError) else SkipReason.INVALID
        name = key.decode("utf-8", "replace")
        detail = f"{type(exc).__name__}: {exc}"
        out.skipped.append(guard.skip(source, reason, detail, at_ms, key=name))

    for key, value in routing.items():
        if not value:
            continue
        try:
            table = serde.decode(control_pb2.RoutingTable, value)
            route_table = table_from_pb(table)
            plan_of_table(route_table)  # what restore derives from it must work too
        except Exception as exc:
            skip(RecordSource.ROUTING, key, exc)
            continue
        out.epochs[table.model] = max(out.epochs.get(table.model, 0), table.epoch)
        if table.epoch >= out.epochs[table.model]:
            out.tables[table.model] = route_table
    for key, value in precision.items():
        if not value:
            continue
        try:
            cmd = serde.decode(control_pb2.PrecisionCommand, value)
            if not (cmd.model and cmd.version and cmd.variant):
                raise ValueError("precision command without model, version or variant")
        except Exception as exc:
            skip(RecordSource.PRECISION, key, exc)
            continue
        out.precision[VersionKey(cmd.model, cmd.version)] = (cmd.variant, cmd.epoch)
    for key, value in rollouts.items():
        if not value:
            continue
        try:
            pb = serde.decode(rollout_pb2.RolloutState, value)
            state, spec = rollout_state_from_pb(pb, epoch=out.epochs.get(pb.model, 0))
            if state.model != spec.model or not state.model:
                raise ValueError(f"state of model {state.model!r} with a spec of {spec.model!r}")
            if not state.terminal and not 0 <= state.step_index < len(spec.steps):
                raise ValueError(f"step {state.step_index} of a spec with {len(spec.steps)} steps")
        except Exception as exc:
            skip(RecordSource.ROLLOUTS, key, exc)
            continue
        out.states.append((state, spec))
    for key, value in (scale or {}).items():
        if not value:
            continue
        try:
            req = serde.decode(control_pb2.ScaleRequest, value)
        except SerdeError as exc:  # one bad record never blocks the others
            skip(RecordSource.SCALE, key, exc)
            continue
        version = VersionKey(req.model, req.version)
        newest = out.scale.get(version)
        if newest is None or req.epoch >= newest[1]:
            out.scale[version] = (req.desired_replicas, req.epoch, req.decided_at_unix_ms)
    policies: dict[VersionKey, QosPolicy] = {}
    for value in commands:
        try:
            command = serde.decode(rollout_pb2.RolloutCommand, value)
            if command.kind == rollout_pb2.COMMAND_SET_QOS_POLICY:
                p = qos_policy_from_pb(command.qos_policy)
                policies[VersionKey(p.model, p.version)] = p
        except Exception:  # a bad record is skipped, never fatal at restore
            continue
    out.qos_policies = list(policies.values())
    return out
