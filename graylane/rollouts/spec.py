"""What a rollout should do: strategy, steps and gates (validated on construction)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from graylane.rollouts.errors import InvalidSpec

__all__ = [
    "DEFAULT_GATE_MODE",
    "DEFAULT_STEPS",
    "DriftAction",
    "GateMode",
    "Gates",
    "MetricComparison",
    "MetricGate",
    "RolloutSpec",
    "Step",
    "StepEvaluation",
    "StepPause",
    "Strategy",
    "WebhookFormat",
    "WebhookTarget",
    "step_weight_problem",
]


class Strategy(Enum):
    CANARY = "canary"
    SHADOW_THEN_CANARY = "shadow_then_canary"
    AB_SPLIT = "ab_split"


class GateMode(Enum):
    """How the gates judge a candidate (see ``gates`` and ``sequential_gates``).

    FIXED: a fixed-horizon test of every window (p99 ratio, Fisher's test
    against an absolute error-rate margin), N consecutive failures roll back.
    SEQUENTIAL: anytime-valid tests of the error rate (relative to the
    baseline's, and to an optional budget) and of the share of slow requests,
    whose false-alarm rate is ``alpha`` however often they are evaluated.
    Both judge latency on service time where telemetry carries it.
    """

    FIXED = "fixed"
    SEQUENTIAL = "sequential"


class DriftAction(Enum):
    """What an output-length drift (rule ``output_length_drift``) does to a rollout.

    REPORT: recorded with the gates' verdicts, the rollout goes on. HOLD: no advance
    while it lasts (a human promotes or rolls back). ROLLBACK: a gate failure like
    any other (``failures_to_rollback`` apply). Never a latency verdict.
    """

    REPORT = "report"
    HOLD = "hold"
    ROLLBACK = "rollback"


DEFAULT_GATE_MODE = GateMode.SEQUENTIAL
"""SEQUENTIAL wins ``graylane bench decisions``: fewer false rollbacks (0.25 % of
healthy runs vs 6 % for FIXED) and faster detection of every regression but
+5 pp errors (still within its target). The policy engine feeds it the newest
step's stats and the liveness facts, and the audit records carry them, so
audit replay and restart keep it. FIXED stays available for comparison."""


@dataclass(frozen=True)
class StepEvaluation:
    """An evaluation set both versions answer before traffic moves onto a step.

    The policy engine sends every item of ``set_path`` (a JSONL evaluation set, see
    :mod:`graylane.evaluation.sets`) to the baseline's and the candidate's version
    topics, scores the answers, and compares the two on the same items. A candidate
    whose mean score is lower than the baseline's by more than ``max_drop_vs_stable``
    (0..1, in mean item score) is held at the step before; the scores, their
    intervals and the verdict are on record. ``set_sha256``: the set's digest when the
    rollout was started; a set that changed since is not used (the rollout holds).
    """

    set_path: str
    max_drop_vs_stable: float = 0.02
    set_sha256: str = ""


@dataclass(frozen=True)
class StepPause:
    """An approval step's wait: until an operator resumes (``duration_s`` None), or
    ``duration_s`` seconds (a resume ends it sooner). Weights stay frozen meanwhile."""

    duration_s: float | None = None


@dataclass(frozen=True)
class Step:
    """One canary step.

    ``min_samples`` counts candidate (and baseline) requests seen *during the
    step*, over disjoint windows; ``min_dwell_s`` is the time since the step
    began. Both must be met, with every gate passing, to move on. With ``pause``
    the rollout then pauses for approval before it moves on. ``evaluation``:
    an evaluation the candidate must pass before traffic moves onto this step.
    """

    weight_percent: float
    min_samples: int = 100
    min_dwell_s: float = 60.0
    pause: StepPause | None = None

    evaluation: StepEvaluation | None = None


class WebhookFormat(Enum):
    """The body a webhook receives: CloudEvents JSON, or a Slack-compatible message."""

    CLOUDEVENTS = "cloudevents"
    SLACK = "slack"


@dataclass(frozen=True)
class WebhookTarget:
    """Where a rollout's transitions are posted; ``secret_file`` holds the HMAC key."""

    url: str
    format: WebhookFormat = WebhookFormat.CLOUDEVENTS
    secret_file: str = ""


DEFAULT_STEPS: tuple[Step, ...] = (
    Step(1.0, 50, 60.0),
    Step(5.0, 100, 60.0),
    Step(25.0, 250, 120.0),
    Step(50.0, 500, 120.0),
    Step(100.0, 0, 0.0),
)
"""1 -> 5 -> 25 -> 50 -> 100 %. Reaching the final 100 % step is the promotion."""


class MetricComparison(Enum):
    """How a metric gate's value must compare with its threshold to pass."""

    LESS = "<"
    LESS_EQUAL = "<="
    GREATER = ">"
    GREATER_EQUAL = ">="

    def holds(self, value: float, threshold: float) -> bool:
        if self is MetricComparison.LESS:
            return value < threshold
        if self is MetricComparison.LESS_EQUAL:
            return value <= threshold
        if self is MetricComparison.GREATER:
            return value > threshold
        return value >= threshold


@dataclass(frozen=True)
class MetricGate:
    """A gate on any metric in Prometheus: ``query`` (PromQL, templated on
    ``{{model}}``, ``{{baseline}}`` and ``{{candidate}}``) must return one number, and
    the gate passes while ``value <comparison> threshold``. A failed query, an
    unreachable Prometheus, no series or several are inconclusive, never a pass; held
    inconclusive for longer than ``pause_after_inconclusive_s`` (0 = never), the
    rollout pauses. The shape of Argo's AnalysisTemplate with the Prometheus provider
    and of Flagger's MetricTemplate."""

    name: str
    query: str
    comparison: MetricComparison
    threshold: float
    pause_after_inconclusive_s: float = 0.0


@dataclass(frozen=True)
class Gates:
    """Limits of the candidate relative to the baseline over the same window.

    ``p99_floor_ms`` keeps a sub-millisecond baseline from turning jitter into
    a large ratio: the latency ratio divides by ``max(baseline, floor)``.

    Used by SEQUENTIAL ``mode`` only: ``max_error_ratio`` (the candidate may
    err up to this multiple of the baseline's rate), ``error_budget`` (when
    above 0, an error regression must also exceed this absolute rate),
    ``max_slow_ratio`` (the share of candidate requests slower than the
    baseline's p95 / p99 may be up to this multiple of the baseline's share).
    Both modes: ``unresponsive_s`` (the T of ``candidate_unresponsive``) and
    ``backlog_queue_ms`` (a candidate queue wait p99 below this is never a
    backlog).

    Generations (windows with generation telemetry) are judged on TTFT and TPOT
    with the same tests and limits as service time, never on whole-request
    latency. TTFT as served (the prefill step; queueing and the wait for a decode
    row are capacity, held by the backlog gate) where telemetry carries it.
    ``token_time_tolerance`` (SEQUENTIAL): a candidate generation counts as slow
    only above (1 + it) x the baseline's p95 / p99; a per-request TPOT is a mean
    over many tokens and varies little, so without a margin a 2 % shift would be
    a regression. Their quality signals: ``max_length_shift`` (the share
    of candidate answers longer than the baseline's median output length may
    differ from the baseline's share by up to this, either way; 0.15 lets 50 %
    move to 35..65 %) and ``max_eos_rate_delta`` (the share of answers the model
    ended itself, by EOS or a stop, may differ by up to this); beyond them,
    with significance at ``alpha``, the candidate drifts and ``length_drift`` says
    what follows.
    """

    max_p99_ratio: float = 1.5
    max_error_rate_delta: float = 0.02
    alpha: float = 0.01
    min_output_agreement: float = 0.98
    p99_floor_ms: float = 1.0
    mode: GateMode = DEFAULT_GATE_MODE
    max_error_ratio: float = 1.25
    error_budget: float = 0.0
    max_slow_ratio: float = 1.5
    unresponsive_s: float = 10.0
    backlog_queue_ms: float = 50.0
    token_time_tolerance: float = 0.1
    length_drift: DriftAction = DriftAction.HOLD
    max_length_shift: float = 0.15
    max_eos_rate_delta: float = 0.1
    metrics: tuple[MetricGate, ...] = ()
    """Gates on any Prometheus metric (:class:`MetricGate`), judged beside the others."""
    max_similarity_drop: float = 0.02
    """Shadow text agreement: how much lower the candidate's mean text similarity to the
    baseline's answers may be than the baseline's similarity to itself (0..1, chrF)."""


@dataclass(frozen=True, kw_only=True)
class RolloutSpec:
    rollout_id: str
    model: str
    baseline: str
    candidate: str
    strategy: Strategy = Strategy.CANARY
    steps: tuple[Step, ...] = DEFAULT_STEPS
    gates: Gates = field(default_factory=Gates)
    failures_to_rollback: int = 2
    shadow_share: float = 0.1
    shadow_duration_s: float = 300.0
    ab_weight_percent: float = 50.0
    ab_duration_s: float = 3600.0
    created_at_ms: int = 0
    created_by: str = ""
    document_digest: str = ""
    """sha256 of the applied Rollout document; empty for a rollout started by flags."""
    webhooks: tuple[WebhookTarget, ...] = ()
    bake_s: float = 0.0
    """How long the gates keep watching the promoted version after its promotion (0: the
    promotion is final at once)."""

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise InvalidSpec(f"rollout {self.rollout_id!r}: " + "; ".join(problems))

    @property
    def phase_min_samples(self) -> int:
        """Sample minimum of the SHADOWING and AB_HOLDING phases (the first step's)."""
        return self.steps[0].min_samples


def _finite(x: float) -> bool:
    return math.isfinite(x)


def _problems(spec: RolloutSpec) -> list[str]:
    out: list[str] = []
    for name in ("rollout_id", "model", "baseline", "candidate"):
        if not getattr(spec, name):
            out.append(f"{name} is empty")
    if spec.baseline and spec.baseline == spec.candidate:
        out.append(f"baseline and candidate are the same version {spec.baseline!r}")
    out.extend(_step_problems(spec))
    out.extend(_gate_problems(spec.gates))
    for hook in spec.webhooks:
        if not hook.url.startswith(("http://", "https://")):
            out.append(f"webhook url {hook.url!r} is not http(s)")
    if not (_finite(spec.bake_s) and spec.bake_s >= 0.0):
        out.append(f"bake_s {spec.bake_s} must be zero or positive")
    if spec.failures_to_rollback < 1:
        out.append(f"failures_to_rollback {spec.failures_to_rollback} must be at least 1")
    if spec.strategy is Strategy.SHADOW_THEN_CANARY:
        if not (_finite(spec.shadow_share) and 0.0 < spec.shadow_share <= 1.0):
            out.append(f"shadow_share {spec.shadow_share} must be within (0, 1]")
        if not (_finite(spec.shadow_duration_s) and spec.shadow_duration_s > 0.0):
            out.append(f"shadow_duration_s {spec.shadow_duration_s} must be positive")
    if spec.strategy is Strategy.AB_SPLIT:
        if not (_finite(spec.ab_weight_percent) and 0.0 < spec.ab_weight_percent < 100.0):
            out.append(f"ab_weight_percent {spec.ab_weight_percent} must be within (0, 100)")
        if not (_finite(spec.ab_duration_s) and spec.ab_duration_s > 0.0):
            out.append(f"ab_duration_s {spec.ab_duration_s} must be positive")
    return out


def step_weight_problem(weights: Sequence[float]) -> str | None:
    """What is wrong with the step weights, or None: each within (0, 100], rising strictly.

    The one step rule; the control plane checks a start request with it, and
    :class:`RolloutSpec` checks its steps with it.
    """
    previous = 0.0
    for i, w in enumerate(weights):
        if not (_finite(w) and 0.0 < w <= 100.0):
            return (
                f"step {i + 1} has weight {w:g}%; every step weight must be above 0 and at most 100"
            )
        if w <= previous:
            shown = " -> ".join(f"{x:g}" for x in weights)
            return (
                f"step weights must increase strictly, got {shown}; make each step larger "
                "than the one before (e.g. 1, 5, 25, 50, 100)"
            )
        previous = w
    return None


def _step_problems(spec: RolloutSpec) -> list[str]:
    steps = spec.steps
    if not steps:
        return ["steps are empty"]
    out: list[str] = []
    weights = step_weight_problem([step.weight_percent for step in steps])
    if weights is not None:
        out.append(weights)
    for i, step in enumerate(steps):
        if step.min_samples < 0:
            out.append(f"step {i} min_samples {step.min_samples} is negative")
        if not (_finite(step.min_dwell_s) and step.min_dwell_s >= 0.0):
            out.append(f"step {i} min_dwell_s {step.min_dwell_s} must be a non-negative number")
        wait = step.pause.duration_s if step.pause is not None else None
        if wait is not None and not (_finite(wait) and wait > 0.0):
            out.append(f"step {i} pause duration {wait} must be positive")
        if step.evaluation is not None:
            out.extend(_evaluation_problems(spec, i, step.evaluation))
    if spec.strategy is not Strategy.AB_SPLIT:
        if steps[-1].weight_percent != 100.0:
            out.append(f"the last step is {steps[-1].weight_percent}%, not 100%")
        if steps[0].weight_percent >= 100.0:
            out.append("a canary needs at least one step below 100%")
    return out


def _evaluation_problems(spec: RolloutSpec, i: int, ev: StepEvaluation) -> list[str]:
    out: list[str] = []
    if not ev.set_path:
        out.append(f"step {i} evaluation names no set")
    drop = ev.max_drop_vs_stable
    if not (_finite(drop) and 0.0 <= drop < 1.0):
        out.append(f"step {i} evaluation max_drop_vs_stable {drop} must be within [0, 1)")
    if spec.strategy is Strategy.AB_SPLIT:
        out.append("an A/B split moves no traffic by steps; it takes no step evaluation")
    elif i == 0 and spec.strategy is Strategy.CANARY:
        out.append(
            "a canary starts at its first step, so nothing can be evaluated before it: "
            "put the evaluation on a later step, or shadow first (shadow_then_canary)"
        )
    return out


def _metric_gate_problems(gates: tuple[MetricGate, ...]) -> list[str]:
    out: list[str] = []
    names = [g.name for g in gates]
    if len(set(names)) != len(names):
        out.append(f"metric gate names {names} are not unique")
    for g in gates:
        if not g.name or not g.query.strip():
            out.append(f"metric gate {g.name!r} needs a name and a query")
        if not _finite(g.threshold):
            out.append(f"metric gate {g.name!r} threshold {g.threshold} is not a number")
        if not (_finite(g.pause_after_inconclusive_s) and g.pause_after_inconclusive_s >= 0):
            out.append(f"metric gate {g.name!r} pause_after_inconclusive_s must be >= 0")
    return out


def _gate_problems(g: Gates) -> list[str]:
    out: list[str] = _metric_gate_problems(g.metrics)
    if not (_finite(g.max_p99_ratio) and g.max_p99_ratio >= 1.0):
        out.append(f"max_p99_ratio {g.max_p99_ratio} must be at least 1")
    if not (_finite(g.max_error_rate_delta) and 0.0 <= g.max_error_rate_delta < 1.0):
        out.append(f"max_error_rate_delta {g.max_error_rate_delta} must be within [0, 1)")
    if not (_finite(g.alpha) and 0.0 < g.alpha < 0.5):
        out.append(f"alpha {g.alpha} must be within (0, 0.5)")
    if not (_finite(g.min_output_agreement) and 0.0 <= g.min_output_agreement <= 1.0):
        out.append(f"min_output_agreement {g.min_output_agreement} must be within [0, 1]")
    if not (_finite(g.p99_floor_ms) and g.p99_floor_ms >= 0.0):
        out.append(f"p99_floor_ms {g.p99_floor_ms} must be non-negative")
    for name in ("max_error_ratio", "max_slow_ratio"):
        value = getattr(g, name)
        if not (_finite(value) and value >= 1.0):
            out.append(f"{name} {value} must be at least 1")
    if not (_finite(g.error_budget) and 0.0 <= g.error_budget < 1.0):
        out.append(f"error_budget {g.error_budget} must be within [0, 1)")
    if not (_finite(g.unresponsive_s) and g.unresponsive_s > 0.0):
        out.append(f"unresponsive_s {g.unresponsive_s} must be positive")
    for name in (
        "max_length_shift",
        "max_eos_rate_delta",
        "token_time_tolerance",
        "max_similarity_drop",
    ):
        value = getattr(g, name)
        if not (_finite(value) and 0.0 <= value < 1.0):
            out.append(f"{name} {value} must be within [0, 1)")
    if not (_finite(g.backlog_queue_ms) and g.backlog_queue_ms >= 0.0):
        out.append(f"backlog_queue_ms {g.backlog_queue_ms} must be non-negative")
    return out
