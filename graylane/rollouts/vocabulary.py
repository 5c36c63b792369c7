"""The rollout vocabulary, one definition each: phases, manual commands, decision kinds and rules.

Controller, control plane, CLI, store and benchmarks all speak these enums; the
protobuf mapping of each lives in :mod:`graylane.rollouts.pb`.
"""

from __future__ import annotations

from enum import Enum, StrEnum

__all__ = [
    "ACTIVE_PHASES",
    "TERMINAL_PHASES",
    "DecisionKind",
    "DecisionRule",
    "ManualCommand",
    "Phase",
]


class Phase(Enum):
    """Where a rollout is in its lifecycle."""

    PENDING = "pending"
    SHADOWING = "shadowing"
    PROGRESSING = "progressing"
    AB_HOLDING = "ab_holding"
    PAUSED = "paused"
    BAKING = "baking"
    """Promoted (100 % and stable), still watched by the gates until the bake period ends."""
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"

    @property
    def finished(self) -> bool:
        """A terminal phase: the rollout accepts no further change."""
        return self in TERMINAL_PHASES


ACTIVE_PHASES = frozenset({Phase.SHADOWING, Phase.PROGRESSING, Phase.AB_HOLDING})
TERMINAL_PHASES = frozenset({Phase.PROMOTED, Phase.ROLLED_BACK, Phase.ABORTED})


class ManualCommand(Enum):
    """What an operator may ask of a running rollout."""

    PAUSE = "pause"
    RESUME = "resume"
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    ABORT = "abort"

    @property
    def rule(self) -> DecisionRule:
        """The rule a decision taken on this command is recorded under."""
        return DecisionRule(f"manual_{self.value}")


class DecisionKind(Enum):
    """What a rollout decision did."""

    STARTED = "started"
    ADVANCE = "advance"
    HOLD = "hold"
    GATE_FAILED = "gate_failed"
    ROLLBACK = "rollback"
    PROMOTE = "promote"
    MANUAL = "manual"


class DecisionRule(StrEnum):
    """Why a decision was taken: the rule recorded with it (audit ``rule``).

    A string enum: the wire field is the value, and a value compares equal to
    its string.
    """

    # rollout lifecycle
    STARTED = "started"
    PAUSED = "paused"
    NO_DATA = "no_data"
    MIN_SAMPLES = "min_samples"
    MIN_DWELL = "min_dwell"
    ALL_GATES_PASSED = "all_gates_passed"
    APPROVAL_PAUSE = "approval_pause"
    """An approval step's gates, samples and dwell are met: paused until resumed or timed out."""
    APPROVAL_ELAPSED = "approval_elapsed"
    """A timed approval pause ran out: the rollout goes on as if resumed."""
    BAKING = "baking"
    """Promoted and baking: the gates watch the promoted version against the previous
    stable's last window until the bake period ends."""
    BAKED = "baked"
    """The bake period ended without a regression: the promotion is final."""
    BAKE_REGRESSION = "bake_regression"
    """A gate failed during the bake period: routing and the stable version went back to
    the previous stable."""
    SPEC_UPDATED = "spec_updated"
    """An applied Rollout document changed what may change (steps, gates, webhooks)."""
    # rollout gates
    P99_RATIO = "p99_ratio"
    P99_SEVERE = "p99_severe"
    ERROR_RATE = "error_rate"
    ERROR_RATE_SEVERE = "error_rate_severe"
    ERROR_RATE_DECISIVE = "error_rate_decisive"
    OUTPUT_AGREEMENT = "output_agreement"
    # load-aware, liveness and anytime-valid sequential gates
    CANDIDATE_UNRESPONSIVE = "candidate_unresponsive"
    """The candidate gets traffic but answers nothing (no telemetry, or a lag that only grows)."""
    BASELINE_UNRESPONSIVE = "baseline_unresponsive"
    """The baseline is in that state: nothing can be judged against it; hold, never promote."""
    CANDIDATE_BACKLOG = "candidate_backlog"
    """The candidate queues while its service time is in line: capacity, not a regression."""
    ERROR_RATE_SEQUENTIAL = "error_rate_sequential"
    """The anytime-valid error-rate test rejected "the candidate errs no more than allowed"."""
    SERVICE_TIME_SEQUENTIAL = "service_time_sequential"
    """The anytime-valid test on the share of slow candidate requests rejected."""
    # generations (GENERATE traffic is judged on TTFT and TPOT, not whole-request latency)
    TTFT_P99_RATIO = "ttft_p99_ratio"
    """The fixed-horizon ratio test on time to first token failed."""
    TPOT_P99_RATIO = "tpot_p99_ratio"
    """The fixed-horizon ratio test on time per output token failed."""
    TTFT_SEQUENTIAL = "ttft_sequential"
    """The anytime-valid test on the share of slow first tokens rejected."""
    TPOT_SEQUENTIAL = "tpot_sequential"
    """The anytime-valid test on the share of slow per-token times rejected."""
    OUTPUT_LENGTH_DRIFT = "output_length_drift"
    """The candidate's output lengths or end-of-sequence rate moved beyond the tolerance:
    a quality signal, never a latency regression."""
    INCOMPARABLE = "incomparable"
    METRIC_GATE = "metric_gate"
    """A PromQL gate's value broke its condition."""
    METRIC_INCONCLUSIVE = "metric_inconclusive"
    """A PromQL gate could not be read (query failed, Prometheus unreachable, no single
    number): held, and paused once held longer than the gate allows."""
    # A/B on user outcomes (policy_engine/logic/outcomes.py)
    OUTCOME_WORSE = "outcome_worse"
    """The anytime-valid test on rated outcomes found the candidate worse: the baseline wins."""
    OUTCOME_BETTER = "outcome_better"
    """The test found the candidate better and the guardrail gates pass: the candidate wins."""
    OUTCOME_NO_DIFFERENCE = "outcome_no_difference"
    """The A/B horizon came without a difference in outcomes (guardrails passing)."""
    TEXT_AGREEMENT = "text_agreement"
    """Sampled shadow answers drift from the baseline's beyond its own variation (the
    anytime-valid test on text similarity rejected)."""
    # the evaluation a step requires before traffic moves onto it
    EVALUATION_PENDING = "evaluation_pending"
    """The step's evaluation has not finished: no advance until it has."""
    EVALUATION_DROP = "evaluation_drop"
    """The candidate scored lower than the baseline on the step's evaluation set by more
    than the allowance: held (promote or roll back by hand)."""
    EVALUATION_UNUSABLE = "evaluation_unusable"
    """The step's evaluation could not judge (its set unreadable or changed, too few
    answers): held until one can."""
    # manual commands (see ManualCommand.rule)
    MANUAL_PAUSE = "manual_pause"
    MANUAL_RESUME = "manual_resume"
    MANUAL_PROMOTE = "manual_promote"
    MANUAL_ROLLBACK = "manual_rollback"
    MANUAL_ABORT = "manual_abort"
    # commands the engine refuses or records
    COMMAND_REJECTED = "command_rejected"
    SET_QOS_POLICY = "set_qos_policy"
    STABLE_REVERTED = "stable_reverted"
    ROUTE_CONFIG_SET = "route_config_set"
    # inputs and decisions the policy engine passed over (the others went on)
    RECORD_SKIPPED = "record_skipped"
    DECISION_FAILED = "decision_failed"
    # QoS controller (NO_DATA and MIN_DWELL above are shared)
    DISABLED = "disabled"
    NOT_IN_LADDER = "not_in_ladder"
    QUALITY_FLOOR = "quality_floor"
    QUALITY_CAP = "quality_cap"
    """The rung below costs more quality than the policy's ``max_quality_drop`` (or is
    unmeasured and the policy refuses unmeasured rungs): held where it is."""
    STALE_VARIANT = "stale_variant"
    SUSTAIN = "sustain"
    TOP_RUNG = "top_rung"
    LOAD_CEILING = "load_ceiling"
    WITHIN_BAND = "within_band"
    P99_BREACH = "p99_breach"
    P99_CALM = "p99_calm"
    QUEUE_WAIT_BREACH = "queue_wait_breach"
    SHED_BREACH = "shed_breach"
    """More than the policy's share of requests shed by admission control."""
    LOAD_CALM = "load_calm"
    """Offered load under a fraction of the rung above's calibrated capacity."""
    TTFT_BREACH = "ttft_breach"
    """A generative model's TTFT p99 over its objective (with the step-down margin)."""
    TPOT_BREACH = "tpot_breach"
    """A generative model's TPOT p99 over its objective (with the step-down margin)."""
    WAITING_BREACH = "waiting_sequences_breach"
    """More sequences waiting for a decode row per worker than the limit."""
    KV_CACHE_BREACH = "kv_cache_breach"
    """KV-cache occupancy over the limit."""
    GENERATION_CALM = "ttft_tpot_calm"
    """TTFT and TPOT p99 and the generative load signals well under their limits."""
    LIKE_FOR_LIKE = "like_for_like"
    LIKE_FOR_LIKE_UNAVAILABLE = "like_for_like_unavailable"
    FOLLOW_BASELINE = "follow_baseline"
    PRECISION_CONFIRMED = "precision_confirmed"
    PRECISION_REFUSED = "precision_refused"
    SCALE_UNSETTLED = "scale_unsettled"
    """QoS is calm but holds its step up: the replicas asked for are not settled yet."""
    # replica controller (DISABLED, MIN_DWELL, SUSTAIN and WITHIN_BAND above are shared)
    SCALE_FLOOR_BREACH = "scale_floor_breach"
    SCALE_LAG_GROWING = "scale_lag_growing"
    SCALE_LOW_LOAD = "scale_low_load"
    SCALE_OVERLOAD = "scale_overload"
    SCALE_AT_MAX = "scale_at_max"
    SCALE_PENDING = "scale_pending"

    @property
    def command(self) -> ManualCommand | None:
        """The manual command behind a ``manual_*`` rule; None for every other rule."""
        if not self.value.startswith("manual_"):
            return None
        return ManualCommand(self.value.removeprefix("manual_"))
